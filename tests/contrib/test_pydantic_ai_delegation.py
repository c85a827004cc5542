"""A pydantic-ai agent whose tool delegates to another agent, made durable by agentsaga, on SQLite
and Postgres: the delegate's model requests and tool calls are durable calls made inside the tool's
call (tests/contrib/delegateflow.py; the planner's call 1 is its ``research`` tool, the researcher's
requests and its ``lookup`` are calls 1.0, 1.1 and 1.2 inside it).

Crash tests run the flow in a child process that SIGKILLs itself, and resume it in another fresh
process; the ledger file outside the database says which requests were answered and which lookups
were made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI"):
    import pydantic_ai  # noqa: F401  CI installs the extra (.ci/run): its absence is a failure there
pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed: pip install -e '.[pydantic-ai]'")

sys.path.insert(0, str(Path(__file__).parent))

import delegateflow  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.testing import FakeClock  # noqa: E402
from workflows import END, Retry, Workflow  # noqa: E402

FLOW = Path(__file__).parent / "delegateflow.py"
ANSWER = "plan for 'a day in Lisbon' from research Lisbon: seven hills"
#: (position, kind, agent, tool) of every CallCompleted of an uninterrupted run, in journal order
JOURNAL = [(0, "llm", "planner", None), ("1.0", "llm", "researcher", None), ("1.1", "tool", "researcher", "lookup"),
           ("1.2", "llm", "researcher", None), (1, "tool", "planner", "research"), (2, "llm", "planner", None)]
LOOKUP_KEY = "d1:plan:0:researcher:1.1:l1"


@pytest.fixture
def ledger(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTSAGA_TEST_LEDGER", str(path))
    monkeypatch.delenv("AGENTSAGA_TEST_KILL", raising=False)
    return path


def child(db_url: str, run_id: str, verb: str, *, kill: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AGENTSAGA_TEST_KILL"}
    if kill:
        env["AGENTSAGA_TEST_KILL"] = kill
    return subprocess.run([sys.executable, str(FLOW), db_url, run_id, verb], env=env, capture_output=True,
                          text=True, timeout=180)


def outcome(done: subprocess.CompletedProcess) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def entries(path: Path) -> list[list[Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def journal(db_url: str, run_id: str) -> list[tuple[Any, str, str, str | None]]:
    with Orchestrator(db_url, workflows=[delegateflow.delegating]) as orc:
        return [(e["data"]["index"], e["data"]["kind"], e["data"]["request"].get("agent"),
                 e["data"]["request"].get("tool")) for e in orc.history(run_id) if e["kind"] == "CallCompleted"]


@pytest.mark.slow
def test_sigkill_inside_the_delegate_resumes_without_repeating_its_journaled_request_or_lookup(db_url, ledger):
    # Given a run SIGKILLed during the delegate's second model request, after its first request and
    # its lookup were journaled inside the planner's research call (which had not completed)
    killed = child(db_url, "d1", "run", kill="researcher:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert entries(ledger) == [["planner", 1, "a day in Lisbon"], ["researcher", 1, "research Lisbon"],
                               ["lookup", "research Lisbon", LOOKUP_KEY]]
    # When a fresh process resumes it
    resumed = outcome(child(db_url, "d1", "resume"))
    # Then the research tool ran again, and its delegate's journaled request and lookup came from the
    # journal: only the delegate's second request and the planner's answer were made
    assert resumed["status"] == "completed", resumed
    assert resumed["state"]["answer"] == ANSWER
    assert entries(ledger)[3:] == [["researcher", 2, "research Lisbon"], ["planner", 2, "a day in Lisbon"]]
    # And every call is journaled once, the delegate's under the tool call that ran it
    assert journal(db_url, "d1") == JOURNAL


@pytest.mark.slow
def test_sigkill_after_the_delegating_tool_completed_runs_no_delegate_again(db_url, ledger):
    # Given a run SIGKILLed when the planner's second request starts (its research tool, delegate and
    # all, was journaled)
    killed = child(db_url, "d1", "run", kill="planner:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = entries(ledger)
    assert [e[0] for e in before] == ["planner", "researcher", "lookup", "researcher"]
    # When a fresh process resumes it
    resumed = outcome(child(db_url, "d1", "resume"))
    # Then the research tool came from the journal whole: the delegate did not run, and the planner's
    # answer kept its position (no CallChangedError)
    assert resumed["status"] == "completed", resumed
    assert resumed["state"]["answer"] == ANSWER
    assert entries(ledger)[len(before):] == [["planner", 2, "a day in Lisbon"]]
    assert journal(db_url, "d1") == JOURNAL


def test_a_delegating_step_run_again_after_a_failure_pays_for_nothing_twice(db_url, ledger):
    # Given the delegating step, failing once after its agent run (the retry runs it again)
    retried = Workflow("delegating-retried")
    clock = FakeClock()

    @retried.step(start=True, retry=Retry(attempts=2, initial=1.0, jitter=False))
    async def plan(ctx, state):
        result = await delegateflow.planner.run("a day in Lisbon")
        if ctx.attempt == 1:
            raise RuntimeError("lost the answer on the way")
        return {"answer": result.output}

    retried.edge("plan", END)
    # When it is run
    with Orchestrator(db_url, workflows=[retried], clock=clock.clock, sleep=clock.sleep) as orc:
        result = orc.run(retried, {}, run_id="d1")
    # Then the second attempt got the whole agent run, delegate and all, from the journal
    assert result.status == "completed", result.error
    assert result.state["answer"] == ANSWER
    assert [e[0] for e in entries(ledger)] == ["planner", "researcher", "lookup", "researcher", "planner"]
