"""`agentsaga worker` as real processes on one machine (SQLite): sharing work, stopping on SIGTERM,
and a run that kills every worker that touches it."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target

from .conftest import HANG, journal_problems, target, wait_for

pytestmark = pytest.mark.slow


def test_two_worker_processes_share_the_runs_and_stop_cleanly_on_sigterm(sqlite_url, workers, tmp_path):
    gated = load_target(target("gated"))
    gate = tmp_path / "gate"
    with Orchestrator(sqlite_url, workflows=[gated]) as orc:
        ids = [orc.enqueue(gated, {"gate": str(gate)}) for _ in range(30)]
        # When two worker processes run against the same SQLite file, and the runs' first step waits
        # on a gate that opens only once runs are leased by two different workers (so however much
        # sooner the first worker starts, it cannot drain the queue alone)
        procs = workers(sqlite_url)
        a, _ = procs.start(target("gated"), args=("--concurrency", "2", "--poll", "0.2"))
        b, _ = procs.start(target("gated"), args=("--concurrency", "2", "--poll", "0.2"))
        wait_for(lambda: len({orc.get_run(r).lease_owner for r in ids} - {None}) == 2, timeout=HANG,
                 what="runs leased by both workers")
        gate.touch()
        wait_for(lambda: orc.store.count_by_status() == {"completed": 30}, timeout=HANG, what="30 runs")
        # Then every run completed once, each journal written by one lease holder at a time
        owners = set()
        for run_id in ids:
            history = orc.history(run_id)
            assert journal_problems(history) == []
            owners |= {e["data"]["owner"] for e in history if e["kind"] == "Resumed"}
        assert len(owners) == 2, "both workers took part"
    # And SIGTERM stops an idle worker at once, with exit code 0
    for proc in (a, b):
        proc.send_signal(signal.SIGTERM)
    assert a.wait(timeout=HANG) == 0 and b.wait(timeout=HANG) == 0
    assert procs.logs().count(" stopped: ") == 2


def test_sigterm_hands_in_flight_runs_back_to_another_worker(sqlite_url, workers, tmp_path):
    gated = load_target(target("gated"))
    gate = tmp_path / "gate"
    with Orchestrator(sqlite_url, workflows=[gated]) as orc:
        ids = [orc.enqueue(gated, {"gate": str(gate)}) for _ in range(2)]
        procs = workers(sqlite_url)
        a, log_a = procs.start(target("gated"), args=("--concurrency", "2", "--drain", "0"))
        wait_for(lambda: all(gate.with_name(f"gate.inside.{r}").exists() for r in ids), timeout=HANG,
                 what="both runs inside their first step")
        # When the worker is told to stop while both runs are inside their first step (held there by
        # a gate that stays shut until the worker has exited)
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=HANG) == 0
        # Then it gave both back (leases released, nothing failed) instead of leaving them to expire,
        # and completed no step of either
        assert log_a.read_text().count("handed back") == 2
        for run_id in ids:
            rec = orc.get_run(run_id)
            assert rec.lease_owner is None and rec.status not in ("failed", "dead")
            assert [e for e in orc.history(run_id) if e["kind"] == "StepCompleted"] == []
        # And another worker finishes them, without running a completed step again
        gate.touch()
        procs.start(target("gated"), args=("--concurrency", "2"))
        wait_for(lambda: orc.store.count_by_status() == {"completed": 2}, timeout=HANG, what="both runs")
        for run_id in ids:
            history = orc.history(run_id)
            assert journal_problems(history) == []
            assert [e["data"]["step"] for e in history if e["kind"] == "StepCompleted"] == ["first", "second"]
            assert len({e["data"]["owner"] for e in history if e["kind"] == "Resumed"}) == 2
            assert orc.get_run(run_id).recoveries == 0  # handed back, not taken over


def test_a_run_that_kills_its_workers_ends_dead_after_max_failures(sqlite_url, workers):
    poison = load_target(target("poison"))
    with Orchestrator(sqlite_url, workflows=[poison]) as orc:
        run_id = orc.enqueue(poison, {})
        procs = workers(sqlite_url)
        args = ("--lease-ttl", "1", "--max-failures", "2", "--poll", "0.2")
        # When every worker that drives it dies, and a supervisor keeps starting new ones
        started = 0
        deadline = time.monotonic() + HANG
        while orc.get_run(run_id).status != "dead":
            assert time.monotonic() < deadline, procs.logs()
            if not procs.procs or procs.procs[-1][0].poll() is not None:
                assert started < 6, procs.logs()
                procs.start(target("poison"), args=args, ready=False)
                started += 1
            time.sleep(0.1)
        # Then three workers died (the first claim, then two recoveries allowed) and the fourth
        # moved the run to dead instead of driving it
        assert started == 4
        assert [p.poll() for p, _ in procs.procs] == [-signal.SIGKILL] * 3 + [None]
        rec = orc.get_run(run_id)
        assert rec.error.startswith("dead after 3 failed recoveries (more than 2)")
        assert "taken over 3 times" in rec.error


SLOW_APP = '''
"""An app whose import takes its time (a model loaded at import, a slow network mount): while
STARTING_MARKER is set it says it is importing, then waits for a gate that this test never opens."""
import os, pathlib, time
from workflows import END, Workflow

marker = os.environ.get("STARTING_MARKER")
if marker:
    pathlib.Path(marker).touch()
    deadline = time.monotonic() + 120
    while not pathlib.Path(marker + ".open").exists() and time.monotonic() < deadline:
        time.sleep(0.02)

slow = Workflow("slow-import")

@slow.step(start=True)
def only(ctx, state):
    return {"done": True}

slow.edge("only", END)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_worker_is_starting_ends_it_in_order_with_exit_0(sqlite_url, workers, tmp_path,
                                                                              monkeypatch, sig):
    # Given a queued run, and a worker for it whose app is still being imported (it said so)
    app = tmp_path / "slow_app.py"
    app.write_text(SLOW_APP)
    with Orchestrator(sqlite_url, workflows=[load_target(f"{app}:slow")]) as orc:
        run_id = orc.enqueue(orc.workflows.get("slow-import"), {})
    marker = tmp_path / "importing"
    monkeypatch.setenv("STARTING_MARKER", str(marker))
    proc, log = workers(sqlite_url).start(f"{app}:slow", ready=False)
    wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=HANG, what="the app's import to begin")
    assert proc.poll() is None, log.read_text()
    # When it is told to stop before it is ready
    proc.send_signal(sig)
    # Then it exits 0 (not killed by the signal), saying it stopped while starting
    assert proc.wait(timeout=HANG) == 0, log.read_text()
    assert log.read_text().strip().splitlines()[-1] == (
        f"agentsaga: worker stopped by {sig.name} while starting, before it claimed any run")
    assert "Traceback" not in log.read_text()
    # And it claimed nothing: the run is still pending, without a lease, its journal untouched
    with Orchestrator(sqlite_url) as orc:
        rec = orc.get_run(run_id)
        assert (rec.status, rec.lease_owner) == ("pending", None)
        assert [e["kind"] for e in orc.history(run_id)] == ["RunStarted"]


def test_sigterm_once_the_worker_runs_its_claimed_run_hands_it_back_with_exit_0(sqlite_url, workers, tmp_path):
    # Given a worker that is ready and drives a run held inside its first step by a gate
    gated = load_target(target("gated"))
    gate = tmp_path / "gate"
    with Orchestrator(sqlite_url, workflows=[gated]) as orc:
        run_id = orc.enqueue(gated, {"gate": str(gate)})
        proc, log = workers(sqlite_url).start(target("gated"), args=("--drain", "0"))
        wait_for(lambda: gate.with_name(f"gate.inside.{run_id}").exists(), timeout=HANG, what="the run's first step")
        # When it gets SIGTERM, and then another one while it stops
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        # Then it exits 0 having handed the run back: no lease left held for another worker to wait out
        assert proc.wait(timeout=HANG) == 0, log.read_text()
        assert "handed back" in log.read_text() and "while starting" not in log.read_text()
        rec = orc.get_run(run_id)
        assert rec.lease_owner is None and rec.status not in ("failed", "dead")
