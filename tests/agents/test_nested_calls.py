"""A tool of the tool loop that asks the model itself: its model calls are made inside the tool's
durable call, and a process SIGKILLed around them resumes without paying for any of them twice.

The chat server runs in the test process and counts the requests it answers; the agent
(nestedchild.py) runs in a child process that kills itself right after a chosen call was committed
to the journal; this process resumes the run. Model call 0 asks for the tool, call 1 is the tool,
which asks the model twice (calls 1.0 and 1.1), call 2 is the loop's answer, call 3 a summary.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import nestedchild  # noqa: E402
from agent_helpers import API_KEY, calls  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.agents import LLM, AsyncLLM, Cassette, ToolContext, ToolRegistry, arun_tool_loop, run_tool_loop  # noqa: E402
from orchestrator.testing import BookingService, Reply, reply  # noqa: E402
from workflows import END, Workflow  # noqa: E402

CHILD = Path(__file__).parent / "nestedchild.py"
QUESTIONS = ["research Lisbon", "describe the old town of Lisbon", "describe the river of Lisbon", "research Lisbon",
             "summarise: researched Lisbon"]
POSITIONS = [0, "1.0", "1.1", 1, 2, 3]
FINAL = {"city": "Lisbon", "answer": "researched Lisbon", "summary": "in short: researched Lisbon",
         "looked": {"old town": "old town in Lisbon: lovely", "river": "river in Lisbon: lovely"}}


@pytest.fixture
def nested(chat, tmp_path, monkeypatch):
    """The scripted model of nestedchild.py, and the ledger its tool writes each time it starts."""
    chat.script(nestedchild.script)
    ledger = tmp_path / "tool-ledger"
    monkeypatch.setenv("AGENT_TEST_LLM_URL", chat.url)
    monkeypatch.setenv("AGENT_TEST_TOOL_LEDGER", str(ledger))
    return ledger


def run_child(db_url: str, run_id: str, kill_after: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), db_url, run_id, kill_after], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)


def asked(chat) -> list[str]:
    return [r["body"]["messages"][0]["content"] for r in chat.requests]


def tool_runs(ledger: Path) -> int:
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


@pytest.mark.slow
def test_sigkill_after_the_tool_completed_resumes_without_asking_its_questions_again(db_url, chat, nested):
    # Given a run SIGKILLed right after its tool's call (with the tool's two model calls) was journaled
    killed = run_child(db_url, "k1", "call:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert asked(chat) == QUESTIONS[:3] and tool_runs(nested) == 1
    # When this process resumes it
    with Orchestrator(db_url, workflows=[nestedchild.agent]) as orc:
        result = orc.resume("k1")
        journal = calls(orc, "k1")
    # Then it completes (no CallChangedError): the tool came from the journal, did not run again, and
    # its questions were not asked again; only the loop's answer and the summary were asked
    assert result.status == "completed", result.error
    assert result.state == FINAL
    assert asked(chat) == QUESTIONS and tool_runs(nested) == 1
    # And each call is journaled once, at its position
    assert [c["index"] for c in journal] == POSITIONS


@pytest.mark.slow
def test_sigkill_inside_the_tool_after_its_questions_runs_the_tool_again_but_asks_nothing_twice(db_url, chat, nested):
    # Given a run SIGKILLed after the tool's second model call was journaled, before the tool's own call
    killed = run_child(db_url, "k2", "call:1.1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert chat.count == 3 and tool_runs(nested) == 1
    # When this process resumes it
    with Orchestrator(db_url, workflows=[nestedchild.agent]) as orc:
        result = orc.resume("k2")
        journal = calls(orc, "k2")
    # Then the tool ran again (its call had not completed) and its two questions came from the journal
    assert result.status == "completed", result.error
    assert result.state == FINAL
    assert tool_runs(nested) == 2
    assert asked(chat) == QUESTIONS and chat.count == 5
    assert [c["index"] for c in journal] == POSITIONS


@pytest.mark.slow
def test_a_nested_run_recorded_as_a_cassette_replays_with_no_model_at_all(db_url, chat, nested, tmp_path):
    # Given an uninterrupted run, recorded as a cassette file
    done = run_child(db_url, "rec", "none")
    assert done.returncode == 0 and done.stdout.strip() == "completed", done.stderr
    agent = nestedchild.agent
    with Orchestrator(db_url, workflows=[agent]) as orc:
        Cassette.from_run(orc, "rec").save(tmp_path / "nested.json")
    recorded = Cassette.load(tmp_path / "nested.json")
    assert [c["index"] for c in recorded.calls] == POSITIONS
    # When it is replayed under another run id, the model server gone
    chat.stop()
    with Orchestrator(db_url, workflows=[agent], replay=recorded) as orc:
        result = orc.run(agent, {"city": "Lisbon"}, run_id="replayed")
        journal = calls(orc, "replayed")
    # Then every call the step made came from the cassette: the tool's call was answered whole, so
    # its inner model calls were not even asked for; the outcome is the recorded one
    assert result.status == "completed", result.error
    assert result.state == FINAL
    assert [(c["index"], c.get("replayed")) for c in journal] == [(0, True), (1, True), (2, True), (3, True)]
    assert tool_runs(nested) == 1 and chat.count == 5


def test_an_async_tool_asking_the_model_twice_is_not_paid_again_when_the_step_runs_again(db_url, chat):
    # Given an async step whose tool asks the model twice, and a first attempt that fails after the tool
    chat.script(nestedchild.script)
    llm = AsyncLLM(base_url=chat.url, model="scripted-model", api_key=API_KEY, max_attempts=1)
    tools = ToolRegistry()

    @tools.tool
    async def look(tctx: ToolContext, city: str) -> list[str]:
        """Look around a city."""
        old_town, river = await asyncio.gather(llm.chat(tctx.step, f"describe the old town of {city}"),
                                               llm.chat(tctx.step, f"describe the river of {city}"))
        return [old_town.content, river.content]

    wf = Workflow("async-nested")
    attempts: list[int] = []

    @wf.step(start=True)
    async def research(ctx, state):
        attempts.append(ctx.attempt)
        out = await arun_tool_loop(ctx, llm, "research Lisbon", tools)
        if len(attempts) == 1:
            ctx.wait_for("go")  # parks: the step runs again from its first line when the signal comes
        summary = await llm.chat(ctx, f"summarise: {out.content}")
        return {"summary": summary.content, "looked": out.calls[0]["result"]}

    wf.edge("research", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="a1").status == "waiting"
        assert chat.count == 4
        # When the signal wakes it
        orc.signal("a1", "go", {})
        result = orc.resume("a1")
        journal = calls(orc, "a1")
    # Then the whole loop, the tool and its two gathered questions came from the journal: one more request
    assert result.status == "completed", result.error
    assert result.state["looked"] == ["old town in Lisbon: lovely", "river in Lisbon: lovely"]
    assert chat.count == 5
    assert sorted(str(c["index"]) for c in journal) == ["0", "1", "1.0", "1.1", "2", "3"]


def test_a_tool_loop_run_inside_a_tool_gives_its_effect_tools_keys_of_their_own(db_url, chat):
    # Given a loop whose model books a venue and asks a delegate tool, which runs a loop of its own
    # booking another venue with the same tool; a later step fails, so the saga undoes both
    llm = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY, max_attempts=1)
    with BookingService() as service:
        def cancel(tctx: ToolContext, record: dict) -> None:
            tctx.http.delete(f"{service.url}/hotels/{record['result']['id']}")

        def book(tctx: ToolContext, venue: str) -> dict:
            """Book a venue."""
            return tctx.http.post(f"{service.url}/hotels", json={"venue": venue}).json()

        inner = ToolRegistry()
        inner.tool(book, effect=True, compensate=cancel)
        tools = ToolRegistry()
        tools.tool(book, effect=True, compensate=cancel)

        @tools.tool
        def delegate(tctx: ToolContext, city: str) -> str:
            """Let an assistant book in a city."""
            return run_tool_loop(tctx.step, llm, f"book in {city}", inner).content

        def script(body: dict, n: int) -> Reply:
            first, answered = body["messages"][0]["content"], any(m["role"] == "tool" for m in body["messages"])
            if first == "book in Lisbon":
                return reply("booked Belem Loft") if answered else Reply(tool_calls=[
                    {"name": "book", "arguments": {"venue": "Belem Loft"}, "id": "b2"}])
            return reply("planned") if answered else Reply(tool_calls=[
                {"name": "book", "arguments": {"venue": "Alfama Hall"}, "id": "b1"},
                {"name": "delegate", "arguments": {"city": "Lisbon"}, "id": "d1"}])

        chat.script(script)
        wf = Workflow("loop-in-a-tool")

        @wf.step(start=True, effect=True, compensate=tools.compensate)
        def plan(ctx, state):
            out = run_tool_loop(ctx, llm, "plan Lisbon", tools)
            return out.update(answer=out.content)

        @wf.step()
        def pay(ctx, state):
            raise RuntimeError("card declined")

        wf.edge("plan", "pay")
        wf.edge("pay", END)
        # When the run books both, then fails
        with Orchestrator(db_url, workflows=[wf]) as orc:
            result = orc.run(wf, {}, run_id="l1")
            journal = calls(orc, "l1")
        ledger = service.ledger()
    # Then the inner loop's booking (made inside the delegate's call 2) carried a key of its own,
    # with the call's position, not the outer loop's first key again
    assert [c["index"] for c in journal] == [0, 1, "2.0", "2.1", "2.2", 2, 3]
    booked = [(e["body"], e["idempotency_key"]) for e in ledger if e["action"] == "book"]
    assert booked == [({"venue": "Alfama Hall"}, "l1:plan:0:tools:0.0"), ({"venue": "Belem Loft"}, "l1:plan:0:2:tools:0.0")]
    # And the saga undid both, newest first, each once
    assert result.status == "compensated", result.error
    assert [e["idempotency_key"] for e in ledger if e["action"] == "cancel"] == [
        "l1:plan:0:2:tools:0.0:compensate", "l1:plan:0:tools:0.0:compensate"]
