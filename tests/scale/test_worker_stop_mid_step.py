"""`agentsaga worker` stopped (SIGTERM) while a sync step it cannot interrupt still runs, inline on
its slot or on a thread: a lease is released only once no code of the process can act for the run
any more (invariant 6), the log says what became of it, and a step that returns after the worker
gave its run up journals nothing and is no failure.

Each test holds the step on a gate file and watches the worker's log, its exit, ``agentsaga runs
--json`` and the journal; nothing waits on a sleep."""

from __future__ import annotations

import datetime
import json
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target
from orchestrator.scale.worker import Worker

from .conftest import HANG, ROOT, target, wait_for

pytestmark = pytest.mark.slow


def runs_json(db_url: str) -> dict[str, dict]:
    """``agentsaga runs --json``, by run id."""
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "runs", "--db", db_url, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=HANG, check=True).stdout
    return {r["run_id"]: r for r in map(json.loads, out.splitlines())}


def owner_of(log: Path) -> str:
    return re.search(r"worker (\S+) ready:", log.read_text()).group(1)


def summary(log: Path) -> dict:
    line = [x for x in log.read_text().splitlines() if " stopped: {" in x][-1]
    return eval(line.split(" stopped: ", 1)[1], {})  # the counts dict, as the worker logs it


def enqueue_held(orc: Orchestrator, workflow, gate: Path) -> str:
    return orc.enqueue(workflow, {"gate": str(gate)})


def step_events(orc: Orchestrator, run_id: str) -> list[tuple[str, str]]:
    return [(e["kind"], e["data"].get("step")) for e in orc.history(run_id) if e["kind"].startswith("Step")]


def test_a_step_thread_that_ends_within_the_grace_keeps_the_lease_until_then_and_releases_it(
        db_url, workers, tmp_path):
    # Given a worker driving a run whose sync step runs on a thread (it has a timeout), held there
    held = load_target(target("held_thread"))
    gate = tmp_path / "gate"
    with Orchestrator(db_url, workflows=[held]) as orc:
        run_id = enqueue_held(orc, held, gate)
        procs = workers(db_url)
        # (a grace far longer than the test needs: the gate opens while the worker waits, however slow)
        proc, log = procs.start(target("held_thread"), args=("--drain", "0", "--hand-back-grace", "600"))
        wait_for(lambda: gate.with_name(f"gate.inside.{run_id}").exists(), timeout=HANG, what="the step")
        owner = owner_of(log)
        # When it gets SIGTERM
        proc.send_signal(signal.SIGTERM)
        # Then it hands the run back but keeps the lease while the thread runs, and does not exit
        wait_for(lambda: "its lease is kept until its step's thread ends" in log.read_text() or proc.poll() is not None,
                 timeout=HANG, what="the hand-back")
        assert proc.poll() is None, log.read_text()
        assert orc.get_run(run_id).lease_owner == owner
        # And once the thread ends, the lease is released at once and the worker exits 0
        gate.touch()
        assert proc.wait(timeout=HANG) == 0, log.read_text()
        text = log.read_text()
        assert f"run {run_id}: its step's thread ended; handed back (lease released for another worker)" in text
        counts = summary(log)
        assert (counts["handed_back"], counts["abandoned"], counts["failed_recoveries"]) == (1, 0, 0)
        row = runs_json(db_url)[run_id]
        assert (row["status"], row["lease_owner"], row["lease_expires_at"]) == ("running", None, None)
        # And the journal holds the cancelled step (still running then), nothing it did after
        cancelled = [e["data"] for e in orc.history(run_id) if e["kind"] == "StepCancelled"]
        assert len(cancelled) == 1 and cancelled[0]["still_running"] is True
        assert ("StepCompleted", "hold") not in step_events(orc, run_id)
        # And another worker takes it without waiting for an expiry, and without a takeover
        procs.start(target("held_thread"))
        wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="the run to complete")
        assert orc.get_run(run_id).recoveries == 0


@pytest.mark.parametrize("flow, where", [("held_thread", "on a thread"), ("held_inline", "inline")])
def test_a_step_still_running_after_the_grace_keeps_its_lease_until_it_expires(db_url, workers, tmp_path, flow,
                                                                                where):
    # Given a worker (lease 3 s) driving a run held in a sync step that outlasts the hand-back grace
    held = load_target(target(flow))
    gate = tmp_path / "gate"
    with Orchestrator(db_url, workflows=[held]) as orc:
        run_id = enqueue_held(orc, held, gate)
        procs = workers(db_url)
        # (a short grace: the step is held on its gate until the worker has given the run up)
        proc, log = procs.start(target(flow), args=("--drain", "0", "--lease-ttl", "3", "--hand-back-grace", "0.2"))
        wait_for(lambda: gate.with_name(f"gate.inside.{run_id}").exists(), timeout=HANG, what="the step")
        owner = owner_of(log)
        # When it gets SIGTERM, and the step ends only once the worker has given the run up (inline,
        # that may be before the process exits: the step then returns into a stopping worker)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "when the worker stopped" in log.read_text() or proc.poll() is not None, timeout=HANG,
                 what="the worker to give the run up")
        gate.touch()
        # Then it exits 0 without releasing the lease, and says so with the time it expires
        assert proc.wait(timeout=HANG) == 0, log.read_text()
        text = log.read_text()
        assert "lease released" not in text and "releasing" not in text and " ERROR " not in text, text
        said = re.search(rf"run {run_id}: a step was still running {where} when the worker stopped; its lease is "
                         r"kept until it expires at (\S+) \(in \d+s\)", text)
        assert said, text
        counts = summary(log)
        assert (counts["abandoned"], counts["handed_back"], counts["failed_recoveries"]) == (1, 0, 0)
        row = runs_json(db_url)[run_id]
        assert row["lease_owner"] == owner and row["status"] == "running"
        logged = datetime.datetime.fromisoformat(said.group(1).replace("Z", "+00:00")).timestamp()
        assert abs(logged - row["lease_expires_at"]) < 1.0
        # And nothing the step did after the worker gave the run up is in the journal
        assert not any(kind in ("StepCompleted", "StepFailed") for kind, _ in step_events(orc, run_id))
        # And another worker takes the run once the lease expires, and completes it
        procs.start(target(flow))
        wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="the run to complete")
        assert [s for k, s in step_events(orc, run_id) if k == "StepCompleted"] == ["hold", "after"]


def test_an_inline_step_returning_after_its_worker_stopped_is_neither_failed_nor_journaled(
        db_url, tmp_path, thread_worker, caplog):
    # Given a worker with its own Orchestrator (as `agentsaga worker` has) driving a run held in an
    # inline sync step; in-process, so that the step can be let go after the worker has closed its
    # store, a moment a real process may not live to see
    held = load_target(target("held_inline"))
    gate = tmp_path / "gate"
    caplog.set_level(logging.INFO, logger="agentsaga")
    with Orchestrator(db_url, workflows=[held]) as orc:
        run_id = enqueue_held(orc, held, gate)
        tw = thread_worker(Worker(db_url, [held], drain=0, lease_ttl=3, hand_back_grace=0.2))
        wait_for(lambda: gate.with_name(f"gate.inside.{run_id}").exists(), timeout=HANG, what="the step")
        slots = list(tw.worker._slots)
        # When the worker stops (giving the run up after the grace, its store closed) and only then
        # the step returns
        tw.stop()
        gate.touch()
        wait_for(lambda: not any(slot.is_alive() for slot in slots), timeout=HANG, what="the slot to end")
        # Then the run was abandoned, not failed, and the late return is said as such
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == []
        counts = tw.worker.counts
        assert (counts["failed_recoveries"], counts["dead"], counts.get("abandoned")) == (0, 0, 1)
        assert gate.with_name(f"gate.returned.{run_id}").exists()
        assert any(f"run {run_id}: its step returned after the worker gave the run up" in r.getMessage()
                   for r in caplog.records)
        # And nothing of it was journaled; the run is as it was, its lease left to expire
        assert step_events(orc, run_id) in ([], [("StepStarted", "hold")])
        rec = orc.get_run(run_id)
        assert (rec.status, rec.lease_owner, rec.error) == ("running", tw.worker.owner, None)


def test_with_an_orchestrator_given_an_abandoned_inline_step_keeps_the_lease_renewed_until_it_returns(
        db_url, tmp_path, thread_worker, caplog):
    # Given a worker sharing an Orchestrator that stays open (its heartbeat goes on) driving a run
    # held in an inline sync step
    held = load_target(target("held_inline"))
    gate = tmp_path / "gate"
    caplog.set_level(logging.INFO, logger="agentsaga")
    with Orchestrator(db_url, workflows=[held], lease_ttl=3) as orc:
        run_id = enqueue_held(orc, held, gate)
        tw = thread_worker(Worker(orc, [held], drain=0, hand_back_grace=0.2))
        wait_for(lambda: gate.with_name(f"gate.inside.{run_id}").exists(), timeout=HANG, what="the step")
        slots = list(tw.worker._slots)
        # When the worker stops while the step still runs
        tw.stop()
        # Then the lease is still held by this process, renewed, while the step runs
        assert orc.engine.heartbeat.holds(run_id)
        assert orc.get_run(run_id).lease_owner == orc.owner
        assert any("its lease is kept, renewed by this process, until the step ends" in r.getMessage()
                   for r in caplog.records)
        # And once it returns, nothing of it is journaled and the lease is released
        gate.touch()
        wait_for(lambda: not any(slot.is_alive() for slot in slots), timeout=HANG, what="the slot to end")
        rec = orc.get_run(run_id)
        assert (rec.status, rec.lease_owner) == ("running", None)
        assert step_events(orc, run_id) in ([], [("StepStarted", "hold")])
        assert not orc.engine.heartbeat.holds(run_id)
        counts = tw.worker.counts
        assert (counts["abandoned"], counts["failed_recoveries"]) == (1, 0)
