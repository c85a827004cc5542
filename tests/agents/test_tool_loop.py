"""The tool-calling loop: what the model gets wrong is told to the model, the loop is bounded,
schemas come from type hints or a pydantic model, effect tools get keys and compensations."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import pydantic
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import API_KEY, calls  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.agents import arun_tool_loop, run_tool_loop, ToolContext, ToolRegistry  # noqa: E402
from orchestrator.testing import BookingService, reply, tool_call, tool_calls  # noqa: E402
from orchestrator.agents import AsyncLLM, LLM  # noqa: E402
from workflows import END, Workflow  # noqa: E402


def venue_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool
    def search(city: str, limit: Annotated[int, pydantic.Field(ge=1, le=10)] = 3) -> list[str]:
        """Find venues in a city.

        Longer notes after the first paragraph are not sent to the model."""
        return [f"{city} venue {i}" for i in range(limit)]

    @tools.tool
    def details(venue: str) -> dict:
        """Details of one venue."""
        raise KeyError(f"no venue {venue!r}")

    return tools


def loop_workflow(llm: LLM, tools: ToolRegistry, max_iterations: int = 8) -> Workflow:
    wf = Workflow("loop")

    @wf.step(start=True)
    def research(ctx, state):
        out = run_tool_loop(ctx, llm, "find a venue", tools, max_iterations=max_iterations)
        return {"answer": out.content, "errors": [c["error"] for c in out.calls if not c["ok"]]}

    wf.edge("research", END)
    return wf


def tool_messages(request: dict) -> list[dict]:
    return [m for m in request["body"]["messages"] if m["role"] == "tool"]


def test_bad_tool_calls_are_returned_to_the_model_and_the_loop_goes_on(db_url, chat):
    # Given a model that sends malformed JSON, calls an unknown tool, breaks the schema, and hits a
    # tool that raises, before it answers
    chat.script([
        tool_call("search", '{"city": "Lisbon", '),
        tool_call("book_everything", {}),
        tool_calls(("search", {"city": "Lisbon", "limit": 50}), ("search", {"town": "Lisbon"})),
        tool_call("details", {"venue": "Atlantis"}),
        reply("Sorry, I could not find it."),
    ])
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY)
    wf = loop_workflow(llm, venue_tools())
    # When the step runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="bad")
        journal = calls(orc, "bad", "tool")
    # Then the run completed: nothing crashed
    assert result.status == "completed", result.error
    assert result.state["answer"] == "Sorry, I could not find it."
    # And each problem went back to the model as a tool message it could act on
    told = [json.loads(m["content"])["error"] for m in tool_messages(chat.requests[-1])]
    assert "arguments are not valid JSON" in told[0]
    assert "there is no tool named 'book_everything'; the tools are: search, details" in told[1]
    assert "invalid arguments for tool 'search': limit: Input should be less than or equal to 10" in told[2]
    assert "invalid arguments for tool 'search': city: Field required; town: Extra inputs" in told[3]
    assert told[4] == "KeyError: \"no venue 'Atlantis'\""
    # And the journal records every one, the rejected ones marked as never run
    assert [c["response"].get("rejected", False) for c in journal] == [True, True, True, True, False]
    assert journal[0]["request"]["arguments"] == '{"city": "Lisbon", '  # the model's raw text, kept


def test_the_loop_is_bounded_by_max_iterations(db_url, chat):
    # Given a model that never stops calling tools
    chat.script(lambda body, n: tool_call("search", {"city": f"city {n}"}))
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY)
    wf = loop_workflow(llm, venue_tools(), max_iterations=3)
    # When the step runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="endless")
    # Then it stopped after three model calls with an error that says what happened
    assert result.status == "failed" and chat.count == 3
    assert "ToolLoopLimitError" in result.error
    assert "made 3 model calls (max_iterations) and the model still asked for tools (search)" in result.error


def test_schemas_come_from_type_hints_or_a_pydantic_model():
    tools = venue_tools()

    class Booking(pydantic.BaseModel):
        venue: str
        people: int = pydantic.Field(ge=1, description="how many attend")

    @tools.tool(description="Book a venue.")
    def book(tctx: ToolContext, booking: Booking) -> str:
        return booking.venue

    search, details, booked = tools.schemas()
    assert search["function"]["description"] == "Find venues in a city."
    params = search["function"]["parameters"]
    assert params["required"] == ["city"] and params["properties"]["limit"]["maximum"] == 10
    assert params["properties"]["limit"]["default"] == 3 and params["additionalProperties"] is False
    # A ToolContext parameter is injected, not described; a single pydantic model is the schema
    assert booked["function"]["parameters"]["required"] == ["venue", "people"]
    assert booked["function"]["parameters"]["properties"]["people"]["description"] == "how many attend"
    assert tools["book"].bind({"venue": "Hall", "people": 3}) == {"booking": Booking(venue="Hall", people=3)}
    with pytest.raises(ValueError, match="people: Input should be greater than or equal to 1"):
        tools["book"].bind({"venue": "Hall", "people": 0})


def test_effect_tools_send_their_own_idempotency_key_and_are_compensated_newest_first(db_url, chat):
    # Given a tool that books over HTTP as an effect, with a compensation that cancels
    tools = ToolRegistry()

    def cancel(tctx: ToolContext, record: dict) -> None:
        tctx.http.delete(f"{record['arguments']['api']}/hotels/{record['result']['id']}")

    @tools.tool(effect=True, compensate=cancel)
    def book(tctx: ToolContext, api: str, venue: str) -> dict:
        """Book a venue."""
        return tctx.http.post(f"{api}/hotels", json={"venue": venue}).json()

    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY)
    wf = Workflow("effects")

    @wf.step(start=True, effect=True, compensate=tools.compensate)
    def reserve(ctx, state):
        out = run_tool_loop(ctx, llm, "book two", tools)
        return out.update(answer=out.content)

    @wf.step()
    def pay(ctx, state):
        raise RuntimeError("card declined")

    wf.edge("reserve", "pay")
    wf.edge("pay", END)
    with BookingService() as service:
        chat.script([tool_calls(("book", {"api": service.url, "venue": "A"}),
                                ("book", {"api": service.url, "venue": "B"})),
                     reply("booked both")])
        # When the run books twice, then fails
        with Orchestrator(db_url, workflows=[wf]) as orc:
            result = orc.run(wf, {}, run_id="fx")
        ledger = service.ledger()
    # Then each booking carried a key of its own, derived from the step's key and the tool call
    booked = [e for e in ledger if e["action"] == "book"]
    assert [e["idempotency_key"] for e in booked] == ["fx:reserve:0:tools:0.0", "fx:reserve:0:tools:0.1"]
    # And the saga undid them newest first, each with its compensation key
    assert result.status == "compensated", result.error
    cancels = [e for e in ledger if e["action"] == "cancel"]
    assert [e["id"] for e in cancels] == ["hotel-2", "hotel-1"]
    assert [e["idempotency_key"] for e in cancels] == ["fx:reserve:0:tools:0.1:compensate",
                                                      "fx:reserve:0:tools:0.0:compensate"]


def test_the_async_loop_with_async_tools(db_url, chat):
    # Given an async step, an async client and an async tool
    tools = ToolRegistry()

    @tools.tool
    async def lookup(term: str) -> str:
        """Look a term up."""
        return f"{term}: a durable workflow engine"

    chat.script([tool_call("lookup", {"term": "agentsaga"}), reply("It is a durable workflow engine.")])
    llm = AsyncLLM(base_url=chat.url, model="m", api_key=API_KEY)
    wf = Workflow("async-loop")

    @wf.step(start=True)
    async def research(ctx, state):
        out = await arun_tool_loop(ctx, llm, "what is agentsaga?", tools)
        return {"answer": out.content}

    wf.edge("research", END)
    # When it runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="async")
        journal = calls(orc, "async")
    # Then the tool's result reached the model and everything is journaled
    assert result.status == "completed" and result.state["answer"] == "It is a durable workflow engine."
    assert tool_messages(chat.requests[1])[0]["content"] == "agentsaga: a durable workflow engine"
    assert [c["kind"] for c in journal] == ["llm", "tool", "llm"]


def _booking_tools():
    tools = ToolRegistry()

    def cancel(tctx: ToolContext, record: dict) -> None:
        tctx.http.delete(f"{record['arguments']['api']}/hotels/{record['result']['id']}")

    @tools.tool(effect=True, compensate=cancel)
    def book(tctx: ToolContext, api: str, venue: str) -> dict:
        """Book a venue."""
        return tctx.http.post(f"{api}/hotels", json={"venue": venue}).json()

    return tools


def test_bookings_made_by_a_loop_that_then_fails_are_compensated_newest_first(db_url, chat):
    # Given a tool loop that books twice and then runs out of iterations (its step fails for good)
    tools = _booking_tools()
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY)
    wf = Workflow("loop-fails")

    @wf.step(start=True, effect=True, compensate=tools.compensate)
    def reserve(ctx, state):
        out = run_tool_loop(ctx, llm, "book two", tools, max_iterations=2)
        return out.update(answer=out.content)

    wf.edge("reserve", END)
    with BookingService() as service:
        chat.script([tool_call("book", {"api": service.url, "venue": "A"}),
                     tool_call("book", {"api": service.url, "venue": "B"})])
        # When the run is driven
        with Orchestrator(db_url, workflows=[wf]) as orc:
            result = orc.run(wf, {}, run_id="lf")
        ledger = service.ledger()
    # Then the step failed, and both bookings its tools made were cancelled, newest first
    assert result.status == "compensated", result.error
    assert [e["id"] for e in ledger if e["action"] == "cancel"] == ["hotel-2", "hotel-1"]


def test_bookings_made_by_a_loop_whose_step_has_no_compensation_are_listed_as_not_undone(db_url, chat):
    # Given the same loop in a step with no compensation
    tools = _booking_tools()
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY)
    wf = Workflow("loop-fails-bare")

    @wf.step(start=True)
    def reserve(ctx, state):
        out = run_tool_loop(ctx, llm, "book two", tools, max_iterations=2)
        return {"answer": out.content}

    wf.edge("reserve", END)
    with BookingService() as service:
        chat.script([tool_call("book", {"api": service.url, "venue": "A"}),
                     tool_call("book", {"api": service.url, "venue": "B"})])
        with Orchestrator(db_url, workflows=[wf]) as orc:
            result = orc.run(wf, {}, run_id="lb")
    # Then the run failed and says which bookings were NOT undone (never silently)
    assert result.status == "failed"
    assert "NOT undone" in result.error and "lb:reserve:0:tools:0.0" in result.error
    assert "lb:reserve:0:tools:1.0" in result.error
    # naming each by its tool, in the step that called it
    assert "book in step reserve (key lb:reserve:0:tools:1.0)" in result.error


def test_tools_may_be_a_list_of_plain_functions(db_url, chat):
    # Given two plain functions, no registry, and a model that calls one of them
    def weather(city: str) -> str:
        """Today's weather in a city."""
        return f"sunny in {city}"

    def forecast(city: str, days: int = 3) -> str:
        """The forecast for the next days."""
        return f"rain in {city} for {days} days"

    chat.script([tool_call("weather", {"city": "Lisbon"}), reply("Take sunglasses.")])
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY)
    wf = Workflow("plain-tools")

    @wf.step
    def ask(ctx, state):
        return {"answer": run_tool_loop(ctx, llm, "umbrella in Lisbon?", [weather, forecast]).content}

    # When the step runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="plain")
        journal = calls(orc, "plain", "tool")
    # Then the model was offered both, described by their hints and docstrings, and the call ran
    assert result.status == "completed", result.error
    assert result.state["answer"] == "Take sunglasses."
    offered = {t["function"]["name"]: t["function"] for t in chat.requests[0]["body"]["tools"]}
    assert offered["weather"]["description"] == "Today's weather in a city."
    assert offered["forecast"]["parameters"]["required"] == ["city"]
    assert journal[0]["response"] == {"ok": True, "result": "sunny in Lisbon"}


def test_a_tool_list_with_something_not_callable_is_a_clear_error():
    with pytest.raises(TypeError, match="'weather' \\(str\\) is not callable"):
        ToolRegistry(["weather"])
    with pytest.raises(TypeError, match="takes a list of functions, got str"):
        ToolRegistry("weather")
