"""tool_agent: a model with tools answering a question, as a ready workflow, durable like any step."""

from __future__ import annotations

import pytest
from agent_helpers import API_KEY, calls

from orchestrator import Orchestrator
from orchestrator.agents import LLM, ToolContext, ToolRegistry, tool_agent
from orchestrator.testing import BookingService, reply, tool_call


def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"rain in {city}"


def test_a_tool_agent_answers_the_question_with_plain_function_tools(db_url, chat):
    # Given an agent made of one plain function and a model that calls it once
    chat.script([tool_call("weather", {"city": "Lisbon"}), reply("Take an umbrella.")])
    agent = tool_agent("umbrella", [weather], llm=LLM(base_url=chat.url, model="m", api_key=API_KEY),
                       system="Answer in one sentence.")
    # When it runs on a question
    with Orchestrator(db_url) as orc:
        result = orc.run(agent, {"question": "Umbrella in Lisbon?"}, run_id="u1")
        journal = calls(orc, "u1")
    # Then the model's answer is the run's answer, after the system message, the question and the tool
    assert result.status == "completed", result.error
    assert result.state["answer"] == "Take an umbrella."
    assert chat.requests[0]["body"]["messages"] == [{"role": "system", "content": "Answer in one sentence."},
                                                    {"role": "user", "content": "Umbrella in Lisbon?"}]
    assert [c["kind"] for c in journal] == ["llm", "tool", "llm"]
    assert journal[1]["response"] == {"ok": True, "result": "rain in Lisbon"}


def test_a_tool_agent_run_again_asks_the_model_nothing_more(db_url, chat):
    # Given a tool agent run that completed
    chat.script([tool_call("weather", {"city": "Porto"}), reply("Dry.")])
    agent = tool_agent("again", [weather], llm=LLM(base_url=chat.url, model="m", api_key=API_KEY))
    with Orchestrator(db_url) as orc:
        orc.run(agent, {"question": "Porto?"}, run_id="a1")
        # When the same run is asked for again
        result = orc.run(agent, {"question": "Porto?"}, run_id="a1")
    # Then the answer comes from the journal: the model was asked twice in all, not four times
    assert result.state["answer"] == "Dry." and chat.count == 2


def test_a_tool_agent_without_a_question_fails_saying_so(db_url, chat):
    agent = tool_agent("noq", [weather], llm=LLM(base_url=chat.url, model="m", api_key=API_KEY))
    with Orchestrator(db_url) as orc:
        result = orc.run(agent, {"q": "typo"}, run_id="n1")
    assert result.status == "failed"
    assert "tool_agent 'noq': the run's input needs a 'question' (a non-empty string), got None" in result.error
    assert chat.count == 0


def test_a_tool_agent_undoes_its_effect_tools_when_it_fails_for_good(db_url, chat):
    # Given an effect tool with its compensation, and a model that books, then never stops asking
    tools = ToolRegistry()

    def cancel(tctx: ToolContext, record: dict) -> None:
        tctx.http.delete(f"{record['arguments']['api']}/hotels/{record['result']['id']}")

    @tools.tool(effect=True, compensate=cancel)
    def book(tctx: ToolContext, api: str, venue: str) -> dict:
        """Book a venue."""
        return tctx.http.post(f"{api}/hotels", json={"venue": venue}).json()

    agent = tool_agent("booker", tools, llm=LLM(base_url=chat.url, model="m", api_key=API_KEY), max_iterations=2)
    with BookingService() as service:
        chat.script([tool_call("book", {"api": service.url, "venue": "A"}),
                     tool_call("book", {"api": service.url, "venue": "B"})])
        # When the loop runs out of iterations
        with Orchestrator(db_url) as orc:
            result = orc.run(agent, {"question": "book two"}, run_id="b1")
        ledger = service.ledger()
    # Then both bookings were cancelled, newest first
    assert result.status == "compensated", result.error
    assert [e["id"] for e in ledger if e["action"] == "cancel"] == ["hotel-2", "hotel-1"]


def test_bad_tool_agents_are_refused_where_they_are_made():
    with pytest.raises(ValueError, match="tool_agent 'x': give it at least one tool"):
        tool_agent("x", [])
    tools = ToolRegistry()
    tools.tool(effect=True)(weather)
    with pytest.raises(ValueError, match="effect tool\\(s\\) weather need compensate"):
        tool_agent("x", tools)
    with pytest.raises(TypeError, match="'weather' \\(str\\) is not callable"):
        tool_agent("x", ["weather"])
