"""A signal that also drives the run where no worker runs (issue 12, point 4), on SQLite and Postgres.

``orc.signal(run, name, data, resume=True)`` and ``agentsaga signal RUN NAME --resume`` deliver the
signal, then continue the run in the calling process; when a live process holds the run's lease,
they only deliver it and say who continues the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Orchestrator, WorkflowNotFoundError
from workflows import Workflow

FLOW = """\
from workflows import Workflow

wf = Workflow("approve-resume")


@wf.step()
def ask(ctx, state):
    return {"decision": ctx.wait_for("approval")}


@wf.step()
def book(ctx, state):
    return {"booked": state["decision"]["ok"]}
"""


def approval_workflow() -> Workflow:
    wf = Workflow("approve-resume")

    @wf.step()
    def ask(ctx, state):
        return {"decision": ctx.wait_for("approval")}

    @wf.step()
    def book(ctx, state):
        return {"booked": state["decision"]["ok"]}

    return wf


def kinds(orc: Orchestrator, run_id: str) -> list[str]:
    return [e["kind"] for e in orc.history(run_id)]


def test_signal_with_resume_drives_the_waiting_run_to_its_end(db_url):
    # Given a run parked waiting for approval, and no worker anywhere
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="sr1").status == "waiting"
    # When another process sends the approval with resume=True
    with Orchestrator(db_url, workflows=[wf]) as approver:
        result = approver.signal("sr1", "approval", {"ok": True}, resume=True)
        history = kinds(approver, "sr1")
    # Then the run went on here and completed with the signal's data, without a separate resume
    assert result is not None and result.status == "completed"
    assert result.state == {"decision": {"ok": True}, "booked": True}
    assert history.count("SignalReceived") == 1 and history.count("Resumed") == 1
    assert history[-1] == "RunCompleted"


def test_signal_without_resume_only_delivers(db_url):
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="sr2")
        before = kinds(orc, "sr2")
        # When the signal is sent without resume
        assert orc.signal("sr2", "approval", {"ok": False}) is None
        # Then nothing was driven: the journal is unchanged until a worker or recover continues it
        assert kinds(orc, "sr2") == before and orc.get_run("sr2").status == "waiting"
        [done] = orc.recover()
    assert done.state["booked"] is False


def test_a_run_held_by_a_live_worker_only_gets_the_signal(db_url):
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # Given a waiting run whose lease a live worker on another machine has just taken
        orc.run(wf, {}, run_id="sr3")
        orc.store.leases.acquire("sr3", owner="elsewhere:4242:w1", ttl=300, now=orc.engine.config.clock(),
                                 force=True, status="running")
        before = kinds(orc, "sr3")
        # When the approval is sent with resume=True
        result = orc.signal("sr3", "approval", {"ok": True}, resume=True)
        # Then the signal is delivered (pending for the worker), the run is not driven here, and the
        # result says who continues it
        assert result is not None and result.status == "running"
        assert "elsewhere:4242:w1" in result.note and "not driven here" in result.note
        assert [name for _, name, *_ in orc.store.signals.pending("sr3")] == ["approval"]
        assert kinds(orc, "sr3") == before
        assert orc.get_run("sr3").lease_owner == "elsewhere:4242:w1"


def test_resume_without_the_workflow_fails_before_sending_anything(db_url):
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="sr4")
    # Given a process that does not have the run's workflow
    with Orchestrator(db_url) as stranger:
        # When it sends the signal with resume=True
        with pytest.raises(WorkflowNotFoundError):
            stranger.signal("sr4", "approval", {"ok": True}, resume=True)
        # Then nothing was sent: no half-done signal-and-drive
        assert stranger.store.signals.pending("sr4") == []


def test_the_async_twin_resumes_inside_an_event_loop(db_url):
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="sr5")

        async def approve():
            return await orc.asignal("sr5", "approval", {"ok": True}, resume=True)

        result = asyncio.run(approve())
    assert result.status == "completed" and result.state["booked"] is True


def _agentsaga(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "agentsaga"
    env = {k: v for k, v in os.environ.items() if k != "AGENTSAGA_DB"}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def test_agentsaga_signal_resume_continues_the_run_from_another_process(db_url, tmp_path):
    # Given a run started from the command line that waits for approval
    flow = tmp_path / "approve_flow.py"
    flow.write_text(FLOW, encoding="utf-8")
    started = _agentsaga("run", f"{flow}:wf", "--run-id", "cli-sr", "--db", db_url)
    assert started.returncode == 4 and "status waiting" in started.stdout, started.stderr
    assert f"send it with: agentsaga signal cli-sr approval --resume --app {flow}:wf --db " in started.stderr
    # When the approver sends the signal with --resume and the app
    sent = _agentsaga("signal", "cli-sr", "approval", "--data", '{"ok": true}', "--resume", "--app", str(flow),
                      "--db", db_url, "--json")
    # Then that one command continued the run to its end
    assert sent.returncode == 0, sent.stderr
    out = json.loads(sent.stdout)
    assert out["status"] == "completed" and out["state"]["booked"] is True


def test_agentsaga_signal_without_resume_says_what_continues_the_run(sqlite_url, tmp_path):
    flow = tmp_path / "approve_flow.py"
    flow.write_text(FLOW, encoding="utf-8")
    _agentsaga("run", f"{flow}:wf", "--run-id", "cli-sr2", "--db", sqlite_url)
    sent = _agentsaga("signal", "cli-sr2", "approval", "--data", '{"ok": true}', "--db", sqlite_url)
    assert sent.returncode == 0, sent.stderr
    assert "delivered to run cli-sr2" in sent.stdout and "--resume" in sent.stdout
    with Orchestrator(sqlite_url) as orc:
        assert orc.get_run("cli-sr2").status == "waiting"


def test_agentsaga_signal_resume_leaves_a_run_held_by_a_live_worker_to_it(db_url, tmp_path):
    flow = tmp_path / "approve_flow.py"
    flow.write_text(FLOW, encoding="utf-8")
    # Given a waiting run whose lease a live worker elsewhere holds
    _agentsaga("run", f"{flow}:wf", "--run-id", "cli-sr3", "--db", db_url)
    with Orchestrator(db_url) as orc:
        orc.store.leases.acquire("cli-sr3", owner="elsewhere:4242:w1", ttl=300, now=orc.engine.config.clock(),
                                 force=True, status="running")
    # When the approver sends the signal with --resume
    sent = _agentsaga("signal", "cli-sr3", "approval", "--data", '{"ok": true}', "--resume", "--app", str(flow),
                      "--db", db_url)
    # Then it exits 0 saying the signal was delivered and who continues the run, which it did not drive
    assert sent.returncode == 0, sent.stderr
    assert "signal 'approval' delivered" in sent.stdout and "elsewhere:4242:w1" in sent.stdout
    assert "not driven here" in sent.stdout
    with Orchestrator(db_url) as orc:
        assert orc.get_run("cli-sr3").lease_owner == "elsewhere:4242:w1"
        assert [e["kind"] for e in orc.history("cli-sr3")][-1] == "WaitStarted"
