"""The demo's agent: plan with a model, research with tools, wait for a human, book, answer.

    agentsaga demo                          # this agent, SIGKILLed midway and resumed
    OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... agentsaga demo   # a real model

It is written as a user would write it, with public names only; the demo machinery (servers,
the child process, the SIGKILL) lives in the modules next to it. The steps:

1. ``plan``: the model turns the request into search criteria (a jinja2 prompt, JSON out).
2. ``research``: a tool-calling loop; the model searches a local venue catalogue and reads
   details until it recommends one. Every model call and tool call is journaled as it returns.
3. ``approve``: ``ctx.wait_for("approval")`` parks the run (status ``waiting``) until someone
   sends ``agentsaga signal RUN approval --data '{"approved": true}'``, from any process.
4. ``book``: an effect on the booking service (``orchestrator.testing.BookingService`` in the
   demo): its intent is journaled first, ``ctx.http`` sends the idempotency key, and a failed run
   cancels it.
5. ``answer``: the model writes the reply.
"""

from __future__ import annotations

import json
import os
import re
from typing import Annotated, Any

from pydantic import Field

from orchestrator.agents import LLM, run_tool_loop, ToolRegistry
from orchestrator.cli.demo.prompts import ANSWER, PLAN, PLANNER, RESEARCH
from workflows import END, Retry, Workflow

__all__ = ["agent", "DEFAULT_INPUT", "VENUES"]

agent = Workflow("research-agent", version="1", description="plan, research with tools, approve, book, answer")
# Base URL and key come from OPENAI_BASE_URL and OPENAI_API_KEY when a call is made; the demo
# points them at its scripted model server (the model is read here, when this module is imported).
llm = LLM(model=os.environ.get("OPENAI_MODEL") or "gpt-4o-mini")

DEFAULT_INPUT = {"request": "a workshop day for our team", "city": "Lisbon", "attendees": 40}

# -- tools the model can call --------------------------------------------------------------------
VENUES = [
    {"id": "lx-1", "name": "Tagus Loft", "city": "Lisbon", "capacity": 60, "price": 1800, "rating": 4.6},
    {"id": "lx-2", "name": "Alfama Hall", "city": "Lisbon", "capacity": 120, "price": 3200, "rating": 4.8},
    {"id": "lx-3", "name": "Belem Room", "city": "Lisbon", "capacity": 25, "price": 700, "rating": 4.9},
    {"id": "po-1", "name": "Ribeira House", "city": "Porto", "capacity": 80, "price": 1500, "rating": 4.5},
]
tools = ToolRegistry()


@tools.tool
def search_venues(city: str, min_capacity: Annotated[int, Field(ge=1)] = 1) -> list[dict[str, Any]]:
    """Venues in a city with room for at least min_capacity people (id, name, capacity, price)."""
    return [{k: v[k] for k in ("id", "name", "capacity", "price")} for v in VENUES
            if v["city"].lower() == city.lower() and v["capacity"] >= min_capacity]


@tools.tool
def venue_details(venue_id: str) -> dict[str, Any]:
    """Everything known about one venue, by id."""
    for venue in VENUES:
        if venue["id"] == venue_id:
            return venue
    raise KeyError(f"no venue {venue_id!r}")  # told to the model, which can try another id


def _json_object(text: str | None) -> dict[str, Any]:
    """The first JSON object in a model's reply (real models like to wrap JSON in prose)."""
    match = re.search(r"\{.*\}", text or "", re.S)
    try:
        value = json.loads(match.group()) if match else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


# -- the steps -----------------------------------------------------------------------------------
@agent.step(start=True, retry=Retry(attempts=3, initial=1.0))
def plan(ctx, state):
    result = llm.chat(ctx, [PLANNER.message(), PLAN.message(**state)], temperature=0)
    planned = {"city": state["city"], "min_capacity": state["attendees"], "criteria": [],
               **_json_object(result.content)}
    ctx.trace("planned the search", plan=planned, tokens=result.usage.get("total_tokens"))
    return {"plan": planned}


@agent.step(retry=Retry(attempts=3, initial=1.0))
def research(ctx, state):
    out = run_tool_loop(ctx, llm, [RESEARCH.message(plan=state["plan"])], tools, max_iterations=6, temperature=0)
    choice = _json_object(out.content)
    venue = next((v for v in VENUES if v["id"] == choice.get("venue_id")), None)
    if venue is None:
        raise ValueError(f"the model recommended no known venue: {out.content!r}")
    ctx.trace("chose a venue", venue=venue["id"], why=choice.get("why"), model_calls=out.iterations,
              tool_calls=len(out.calls), tokens=out.usage.get("total_tokens"))
    return {"venue": venue, "why": choice.get("why")}


@agent.step()
def approve(ctx, state):
    ctx.trace("asking for approval", venue=state["venue"]["id"], price=state["venue"]["price"])
    decision = ctx.wait_for("approval")            # the run waits here (status: waiting)
    if not isinstance(decision, dict):
        decision = {"approved": bool(decision)}
    return {"approval": decision}


def cancel_booking(ctx, effect):
    """The compensation: cancel the venue booking (the service treats a repeat as done)."""
    ctx.http.delete(effect.result["booking"]["href"])


@agent.step(effect=True, compensate=cancel_booking, retry=Retry(attempts=3, initial=0.5))
def book(ctx, state):
    api, venue = state["api"], state["venue"]
    r = ctx.http.post(f"{api}/hotels", json={"venue": venue["id"], "city": venue["city"], "nights": 1})
    booking = r.json()
    return {"booking": {"id": booking["id"], "href": f"{api}/hotels/{booking['id']}"}}


@agent.step(retry=Retry(attempts=3, initial=1.0))
def answer(ctx, state):
    approval = state.get("approval") or {}
    reason = approval.get("reason") or "the booking was not approved"
    prompt = ANSWER.message(request=state["request"], venue=state["venue"], booking=state.get("booking"),
                            reason=reason)
    return {"answer": llm.chat(ctx, [prompt], temperature=0).content}


agent.edge("plan", "research")
agent.edge("research", "approve")
agent.route("approve", lambda s: "book" if s["approval"].get("approved") else "answer", targets=["book", "answer"])
agent.edge("book", "answer")
agent.edge("answer", END)
