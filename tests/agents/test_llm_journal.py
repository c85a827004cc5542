"""Model calls through ``ctx``: what the journal holds (prompts, tokens, tool calls), on SQLite and Postgres,
against the scripted chat server on loopback."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import API_KEY, calls, raw_journal  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.agents import run_tool_loop, ToolRegistry  # noqa: E402
from orchestrator.testing import reply, tool_call  # noqa: E402
from orchestrator.agents import LLM  # noqa: E402
from orchestrator.agents import Prompt  # noqa: E402
from workflows import END, Workflow  # noqa: E402

ASK = Prompt("Which venue in {{ city }} seats {{ people }}?", name="ask")
SYSTEM = Prompt("You are terse.", name="system", role="system")


def one_call_workflow(llm: LLM) -> Workflow:
    wf = Workflow("one-call")

    @wf.step(start=True)
    def ask(ctx, state):
        result = llm.chat(ctx, [SYSTEM.message(), ASK.message(city=state["city"], people=40)], temperature=0.2)
        return {"answer": result.content, "tokens": result.usage["total_tokens"], "finish": result.finish_reason}

    wf.edge("ask", END)
    return wf


def test_a_model_call_is_journaled_with_prompt_template_tokens_and_latency(db_url, chat):
    # Given a step that renders two templates and calls the model once
    chat.script([reply("Alfama Hall seats 120.")])
    llm = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    wf = one_call_workflow(llm)
    # When the run completes
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"city": "Lisbon"}, run_id="j1")
        [call] = calls(orc, "j1")
        text = raw_journal(orc, "j1")
    # Then the step got the answer and its token count
    assert result.status == "completed", result.error
    assert result.state["answer"] == "Alfama Hall seats 120." and result.state["finish"] == "stop"
    # And the journal holds the rendered messages, the templates they came from, model and parameters
    request = call["request"]
    assert call["kind"] == "llm" and call["index"] == 0 and call["step"] == "ask"
    assert request["model"] == "scripted-model" and request["params"] == {"temperature": 0.2}
    assert request["messages"] == [{"role": "system", "content": "You are terse."},
                                   {"role": "user", "content": "Which venue in Lisbon seats 40?"}]
    assert [(p["message"], p["template"]) for p in request["prompts"]] == [(0, "system"), (1, "ask")]
    assert request["prompts"][1]["sha256"] == ASK.sha256
    # And the response: the provider's body, finish reason, token usage, latency, retries
    response = call["response"]
    assert response["usage"] == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    assert result.state["tokens"] == 15
    assert response["finish_reason"] == "stop" and response["retries"] == 0 and response["truncated"] is False
    assert response["body"]["choices"][0]["message"]["content"] == "Alfama Hall seats 120."
    assert response["ms"] >= 0 and call["ms"] >= response["ms"] * 0.5
    # And the API key was sent (the server accepted it) but never reached the journal
    assert chat.requests[0]["authorized"] is True
    assert API_KEY not in text and "Bearer" not in text


def test_tool_calls_are_journaled_with_name_arguments_and_result(db_url, chat):
    # Given a model that calls a tool, then answers
    tools = ToolRegistry()

    @tools.tool
    def capacity(venue: str) -> int:
        """Seats in a venue."""
        return {"Alfama Hall": 120}.get(venue, 0)

    chat.script([tool_call("capacity", {"venue": "Alfama Hall"}), reply("It seats 120.")])
    llm = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    wf = Workflow("tooly")

    @wf.step(start=True)
    def research(ctx, state):
        out = run_tool_loop(ctx, llm, "How many seats in Alfama Hall?", tools)
        return {"answer": out.content, "usage": out.usage, "iterations": out.iterations}

    wf.edge("research", END)
    # When the run completes
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="t1")
        journal = calls(orc, "t1")
    # Then the journal holds model call, tool call, model call, in order
    assert result.status == "completed", result.error
    assert [(c["index"], c["kind"]) for c in journal] == [(0, "llm"), (1, "tool"), (2, "llm")]
    tool = journal[1]
    assert tool["request"] == {"name": "capacity", "call_id": "call_0_0", "arguments": {"venue": "Alfama Hall"}}
    assert tool["response"] == {"ok": True, "result": 120}
    # And the model was offered the tool's JSON schema, and got the result back as a tool message
    offered = journal[0]["request"]["tools"][0]["function"]
    assert offered["name"] == "capacity" and offered["description"] == "Seats in a venue."
    assert offered["parameters"]["properties"]["venue"]["type"] == "string"
    assert chat.requests[1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "120"}
    # And the loop's token usage adds up both model calls
    total = sum(c["response"]["usage"]["total_tokens"] for c in journal if c["kind"] == "llm")
    assert result.state["usage"]["total_tokens"] == total and result.state["iterations"] == 2


def test_a_response_over_the_bound_is_stored_truncated_with_a_marker_and_its_size(db_url, chat):
    # Given a model that answers with 20,000 characters and a client bounded to 2 KiB
    chat.script([reply("x" * 20_000)])
    llm = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY, max_response_bytes=2048)
    wf = Workflow("big")

    @wf.step(start=True)
    def ask(ctx, state):
        result = llm.chat(ctx, "say a lot")
        return {"length": len(result.content), "tail": result.content[-40:], "truncated": result.truncated}

    wf.edge("ask", END)
    # When it runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="b1")
        [call] = calls(orc, "b1")
        stored = max(len(e.data) for e in orc.store.events("b1"))
    # Then the journal holds a bounded response, marked, with the full size
    response = call["response"]
    assert response["truncated"] is True and response["size"] > 20_000
    content = response["body"]["choices"][0]["message"]["content"]
    assert content.endswith("…[truncated: 20000 chars]") and len(content) < 2048
    assert stored < 4096  # the whole event, request included
    # And the step saw what the journal holds (the same on a resumed run)
    assert result.state["truncated"] is True and result.state["tail"].endswith("[truncated: 20000 chars]")
    # And the token usage survived the cut
    assert response["usage"]["completion_tokens"] == 1
