"""Crash tests: a real child process is SIGKILLed at a chosen point, a new process resumes the run.

The ledger (a file outside the database, fsynced per execution) counts executions: every step
completed in the journal ran exactly once, except the one step that was running when the process
died (invariant 1); the final state equals an uninterrupted run's.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_app

HERE = Path(__file__).parent
CHILD = HERE / "crashflow.py"
ROOT = HERE.parent.parent

pytestmark = pytest.mark.slow


def run_child(url: str, run_id: str, ledger: Path, crash: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), url, run_id, str(ledger), crash],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def reference_state(tmp_path_factory):
    """The state of an uninterrupted run (computed once, on SQLite)."""
    tmp = tmp_path_factory.mktemp("ref")
    done = run_child(f"sqlite:///{tmp}/ref.db", "ref", tmp / "ledger", "none")
    assert done.returncode == 0, done.stderr
    with Orchestrator(f"sqlite:///{tmp}/ref.db") as orc:
        state = orc.result("ref").state
    assert state["round"] == 3 and state["done"] is True
    return state


@pytest.mark.parametrize("crash, in_flight", [
    ("mid:begin:2", "begin"),        # inside a step (the second round's first step)
    ("after:merge:1", None),         # between a step's committed completion and the next step
    ("branch", "right"),             # mid parallel branch: left committed, right running
    ("snapshot", None),              # right after a transaction that wrote a snapshot
    ("mid:finish:1", "finish"),      # inside the last step
])
def test_sigkill_then_resume_runs_each_completed_step_once(db_url, tmp_path, reference_state, crash, in_flight,
                                                          monkeypatch):
    # Given a run whose process is killed with SIGKILL at the chosen point
    ledger = tmp_path / "ledger"
    killed = run_child(db_url, "r1", ledger, crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    monkeypatch.setenv("CRASHFLOW_LEDGER", str(ledger))
    # When a new process (this one, knowing the URL and registering the app) resumes it by id
    with Orchestrator(db_url, workflows=load_app(str(CHILD))) as orc:
        result = orc.resume("r1")
        history = orc.history("r1")
    # Then it completes with the state of an uninterrupted run
    assert result.status == "completed", result.error
    assert result.state == reference_state
    # And every completed step was executed exactly once, but for the one that was killed mid-way
    completed = Counter(e["data"]["step"] for e in history if e["kind"] == "StepCompleted")
    executed = Counter(ledger.read_text().split())
    expected = completed.copy()
    if in_flight:
        expected[in_flight] += 1
    assert executed == expected
    # And each step's completion appears once per tick in the journal
    ticks = [(e["data"]["step"], e["data"]["tick"]) for e in history if e["kind"] == "StepCompleted"]
    assert len(ticks) == len(set(ticks))
    assert [e["kind"] for e in history].count("Resumed") == 1


def test_sigkill_inside_a_snapshot_write_loses_the_whole_transaction_and_nothing_else(db_url, tmp_path,
                                                                                       reference_state, monkeypatch):
    # Given a run whose process is killed inside the first transaction that writes a snapshot,
    # after the snapshot row was inserted and before the commit
    ledger = tmp_path / "ledger"
    killed = run_child(db_url, "ins", ledger, "in-snapshot")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    monkeypatch.setenv("CRASHFLOW_LEDGER", str(ledger))
    with Orchestrator(db_url, workflows=load_app(str(CHILD))) as orc:
        # Then neither the snapshot nor the events it was written with were kept: no snapshot, and
        # the journal still verifies
        assert orc.snapshots("ins") == []
        before = orc.history("ins")
        assert orc.verify("ins", mark=False).ok
        # When a new process resumes it
        result = orc.resume("ins")
        history = orc.history("ins")
        catalog = orc.snapshots("ins")
    # Then it completes as an uninterrupted run, and its snapshots verify
    assert result.status == "completed", result.error
    assert result.state == reference_state
    assert catalog and all(s.validity == "unchecked" for s in catalog)
    # And exactly one step ran twice: the one whose completion died with the snapshot's transaction
    completed = Counter(e["data"]["step"] for e in history if e["kind"] == "StepCompleted")
    executed = Counter(ledger.read_text().split())
    twice = executed - completed
    assert sum(twice.values()) == 1, (executed, completed)
    lost = next(iter(twice))
    assert Counter(e["data"]["step"] for e in before if e["kind"] == "StepCompleted")[lost] < completed[lost]


def test_sigkill_inside_an_incremental_snapshot_write_loses_that_link_and_its_chain_still_verifies(
        db_url, tmp_path, reference_state, monkeypatch):
    # Given a run whose process is killed inside the first transaction that writes an incremental
    # snapshot (incremental snapshots are the default), after its row was inserted, before the commit
    ledger = tmp_path / "ledger"
    killed = run_child(db_url, "inc", ledger, "in-incremental")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    monkeypatch.setenv("CRASHFLOW_LEDGER", str(ledger))
    with Orchestrator(db_url, workflows=load_app(str(CHILD)), snapshot_every=4) as orc:
        # Then only the full snapshot before it is there, and the journal verifies
        assert [s.kind for s in orc.snapshots("inc")] == ["full"]
        assert orc.verify("inc", mark=False).ok
        # When a new process resumes it
        result = orc.resume("inc")
        catalog = orc.snapshots("inc")
        report = orc.verify("inc", mark=False)
    # Then it completes as an uninterrupted run, writing a new chain whose links all verify
    assert result.status == "completed", result.error
    assert result.state == reference_state
    assert "incremental" in {s.kind for s in catalog} and report.ok, report.lines()
    # And exactly one step ran twice: the one whose completion died with the link's transaction
    history_steps = Counter(e["data"]["step"] for e in orc_history(db_url, "inc") if e["kind"] == "StepCompleted")
    assert sum((Counter(ledger.read_text().split()) - history_steps).values()) == 1


def orc_history(db_url: str, run_id: str) -> list[dict]:
    with Orchestrator(db_url) as orc:
        return orc.history(run_id)


def test_running_the_same_program_again_after_a_crash_continues_the_run(db_url, tmp_path, reference_state,
                                                                        monkeypatch):
    # Given a run whose process was killed with SIGKILL while it held the run's (30 s) lease
    ledger = tmp_path / "ledger"
    killed = run_child(db_url, "again", ledger, "mid:begin:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    monkeypatch.setenv("CRASHFLOW_LEDGER", str(ledger))
    monkeypatch.syspath_prepend(str(HERE))
    import crashflow

    # When the same program runs again at once, with the same run id
    with Orchestrator(db_url, workflows=[crashflow.wf], snapshot_every=4) as orc:
        result = orc.run(crashflow.wf, {"round": 0}, run_id="again")
    # Then the dead owner's lease does not stand in the way: the run is taken over and completes
    assert result.status == "completed", result.error
    assert result.state == reference_state


def test_a_run_held_by_a_live_process_is_not_taken_and_the_error_says_what_to_do(db_url):
    # Given a run leased by another live process (this test's own parent stands in for it)
    from orchestrator import LeaseHeldError
    from workflows import END, Workflow

    wf = Workflow("held")

    @wf.step(start=True)
    def only(ctx, state):
        return {"ok": True}

    wf.edge("only", END)
    import os
    import socket

    live_owner = f"{socket.gethostname()}:{os.getppid()}:abc123"
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.start(wf, {}, run_id="held")
        orc.store.leases.acquire("held", owner=live_owner, ttl=300, now=orc.engine.config.clock())
        # When the program asks to run it again
        with pytest.raises(LeaseHeldError) as raised:
            orc.run(wf, {}, run_id="held")
    # Then it is refused, naming the owner, a readable time and the way to take it over
    message = str(raised.value)
    assert live_owner in message and "UTC" in message and "agentsaga resume held" in message


def test_running_again_after_a_create_whose_reply_was_lost_continues_the_run(db_url):
    # Given a run whose creation was committed but whose reply never came back to this process
    from store import StoreUnavailableError
    from workflows import END, Workflow

    wf = Workflow("lost-create")

    @wf.step(start=True)
    def only(ctx, state):
        return {"ok": True}

    wf.edge("only", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        real = orc.store.create_run

        def create_then_lose_the_reply(*args, **kwargs):
            real(*args, **kwargs)
            raise StoreUnavailableError("the connection dropped before the commit's reply arrived")

        orc.store.create_run = create_then_lose_the_reply
        with pytest.raises(StoreUnavailableError):
            orc.run(wf, {}, run_id="lost")
        orc.store.create_run = real
        # When the same program runs it again in the same process (it holds the lease, drives nothing)
        result = orc.run(wf, {}, run_id="lost")
        # Then the run is taken over at once and completes, its step run once
        assert (result.status, result.state) == ("completed", {"ok": True})
        assert [e["kind"] for e in orc.history("lost")].count("StepCompleted") == 1
