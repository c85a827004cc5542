"""A research-and-book agent: plan with a model, research with tools, wait for a human, book, answer.

    python examples/research_agent.py                  # offline: a scripted model on loopback
    OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... python examples/research_agent.py
    agentsaga demo                                     # the same agent, SIGKILLed midway and resumed

The steps:

1. ``plan``: the model turns the request into search criteria (a jinja2 prompt, JSON out).
2. ``research``: a tool-calling loop; the model searches a local venue catalogue and reads
   details until it recommends one. Every model call and tool call is journaled as it returns.
3. ``approve``: ``ctx.wait_for("approval")`` parks the run (status ``waiting``) until someone
   sends ``agentsaga signal RUN approval --data '{"approved": true}'``, from any process.
4. ``book``: an effect on the booking service (``examples/booking_service.py``): its intent is
   journaled first, ``ctx.http`` sends the idempotency key, and a failed run cancels it.
5. ``answer``: the model writes the reply.

Without ``OPENAI_BASE_URL`` the model is ``scripted_model`` below, served by a real
OpenAI-compatible HTTP server on 127.0.0.1 (``orchestrator``'s scripted chat server): it answers by
reading the conversation, so a resumed run gets the same answers whatever was replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from orchestrator import Orchestrator
from workflows import END, Retry, Workflow

from orchestrator.agents import LLM, Prompt, run_tool_loop, ToolRegistry
from orchestrator.testing import ChatServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from booking_service import BookingService  # noqa: E402  (the example's own local service)

agent = Workflow("research-agent", version="1", description="plan, research with tools, approve, book, answer")
llm = LLM(model=os.environ.get("OPENAI_MODEL") or "gpt-4o-mini")

# -- prompts (jinja2; a missing variable is an error before any model call) ------------------------
PLANNER = Prompt("You are a planner for event logistics. Reply with JSON only: "
                 '{"city": str, "min_capacity": int, "criteria": [str]}.', name="planner", role="system")
PLAN = Prompt("Request: {{ request }}\nCity: {{ city }}\nAttendees: {{ attendees }}", name="plan")
RESEARCH = Prompt("Find the best venue in {{ plan.city }} for at least {{ plan.min_capacity }} people.\n"
                  "Criteria: {{ plan.criteria | join(', ') }}.\nUse the tools. When you have chosen, reply "
                  'with JSON only: {"venue_id": str, "why": str}.', name="research")
ANSWER = Prompt("Write two sentences for the organiser. Request: {{ request }}. Venue: {{ venue.name }} "
                "({{ venue.id }}). {% if booking %}Booking {{ booking.id }} is confirmed.{% else %}"
                "Nothing was booked: {{ reason }}.{% endif %}", name="answer")

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


# -- the scripted model (used when no real model is configured) ----------------------------------------
def scripted_model(body: dict[str, Any], n: int) -> Any:
    """Answers like a capable model would, from the conversation alone (no memory between calls)."""
    messages = body.get("messages") or []
    first = str(messages[0].get("content") or "") if messages else ""
    if first.startswith("You are a planner"):
        text = str(messages[-1].get("content") or "")
        city = re.search(r"City: (.+)", text)
        people = re.search(r"Attendees: (\d+)", text)
        return ChatServer.reply(json.dumps({"city": city.group(1).strip() if city else "Lisbon",
                                 "min_capacity": int(people.group(1)) if people else 1,
                                 "criteria": ["capacity", "rating", "price"]}))
    if body.get("tools"):
        results = [m for m in messages if m.get("role") == "tool"]
        if not results:
            city = re.search(r"venue in (.+?) for at least (\d+)", first)
            return ChatServer.tool_call("search_venues", {"city": city.group(1) if city else "Lisbon",
                                               "min_capacity": int(city.group(2)) if city else 1})
        found = json.loads(results[0]["content"])
        if not found:
            return ChatServer.reply(json.dumps({"venue_id": None, "why": "nothing fits"}))
        best = min(found, key=lambda v: v["price"])
        if len(results) == 1:
            return ChatServer.tool_call("venue_details", {"venue_id": best["id"]})
        details = json.loads(results[-1]["content"])
        why = f"cheapest that fits, rated {details.get('rating')}"
        return ChatServer.reply(json.dumps({"venue_id": best["id"], "why": why}))
    text = str(messages[-1].get("content") or "")
    venue = re.search(r"Venue: (.+?) \(", text)
    booking = re.search(r"Booking (\S+) is confirmed", text)
    name = venue.group(1) if venue else "the venue"
    if booking:
        return ChatServer.reply(f"{name} is booked for your event (booking {booking.group(1)}). "
                     "It was the best-priced venue with room for everyone.")
    return ChatServer.reply(f"{name} fits your event, but nothing was booked. Approve the booking to go ahead.")


DEFAULT_INPUT = {"request": "a workshop day for our team", "city": "Lisbon", "attendees": 40}


def main() -> int:
    global llm
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default=None, help="database URL (default: a SQLite file in a temp dir)")
    args = parser.parse_args()
    db = args.db or f"sqlite:///{Path(tempfile.mkdtemp(prefix='agentsaga-research-')) / 'agent.db'}"
    server = None
    if not os.environ.get("OPENAI_BASE_URL"):
        server = ChatServer(scripted_model)
        llm = LLM(base_url=server.start(), model="scripted-model")
    try:
        with BookingService() as service, Orchestrator(db, workflows=[agent]) as orc:
            run = orc.run(agent, {**DEFAULT_INPUT, "api": service.url})
            print(f"run {run.run_id}: {run.status} (waiting for approval)")
            orc.signal(run.run_id, "approval", {"approved": True, "by": "research_agent.py"})
            run = orc.resume(run.run_id)
            print(f"run {run.run_id}: {run.status}\n\n{run.state.get('answer')}")
    finally:
        if server is not None:
            server.stop()
    return 0 if run.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
