"""A dead worker's runs are taken over when their leases expire: the idle worker's next look is at the
next lease expiry, after a partial claim too (an injected clock, no waiting); and a SIGKILLed worker
process's runs are taken over by another worker process (the journal shows who drove what)."""

from __future__ import annotations

import signal

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.events import ACTIVE_STATUSES
from orchestrator.engine.loader import load_target
from orchestrator.scale import Worker
from orchestrator.testing import FakeClock

from .conftest import HANG, journal_problems, target, wait_for


def test_after_a_partial_claim_the_worker_looks_again_at_the_next_lease_expiry(db_url):
    # Given two runs leased (ttl 10 s) by a worker that then died, renewed one second apart
    clock = FakeClock()
    gated = load_target(target("gated"))
    orc = Orchestrator(db_url, workflows=[gated], clock=clock.clock, lease_ttl=10)
    worker = Worker(orc, concurrency=4, poll=2.0)
    try:
        first, second = orc.enqueue(gated, {"gate": "unused"}), orc.enqueue(gated, {"gate": "unused"})
        [(got, _)] = orc.store.queues.claim_some(owner="dead", ttl=10, now=clock.clock(), statuses=ACTIVE_STATUSES,
                                                 limit=1, not_runs=[second])
        assert got == first
        clock.advance(1.0)
        [(got, _)] = orc.store.queues.claim_some(owner="dead", ttl=10, now=clock.clock(), statuses=ACTIVE_STATUSES,
                                                 limit=1)
        assert got == second
        # When the first lease has expired and the second has not, and an idle worker claims
        clock.advance(9.5)
        found, blocked = worker._claim(4)
        # Then it took the expired run only
        assert (found, blocked) == (1, False)
        assert orc.get_run(first).lease_owner == worker.owner and orc.get_run(second).lease_owner == "dead"
        # And it plans its next look for when the second lease expires (0.5 s on), not its idle backoff
        # or a safety-net interval later
        wake = worker._idle_timeout(free=4, found=1, blocked=False, idle=2.0)
        assert wake == pytest.approx(0.51, abs=1e-6)
        # And at that moment the second run is claimable and claimed
        clock.advance(wake)
        assert worker._claim(3) == (1, False)
        assert orc.get_run(second).lease_owner == worker.owner
    finally:
        orc.close()


pg_or_sqlite = pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])


@pytest.mark.slow
@pg_or_sqlite
def test_a_sigkilled_workers_runs_are_taken_over_by_another_worker_process(backend, request, workers, tmp_path):
    db = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    gated = load_target(target("gated"))
    gate = tmp_path / "gate"
    with Orchestrator(db, workflows=[gated]) as orc:
        ids = [orc.enqueue(gated, {"gate": str(gate)}) for _ in range(3)]
        procs = workers(db)
        # Given a worker holding three runs inside their first step, and an idle second worker
        a, _ = procs.start(target("gated"), args=("--concurrency", "3", "--lease-ttl", "2", "--poll", "0.5"))
        wait_for(lambda: all(gate.with_name(f"gate.inside.{r}").exists() for r in ids), timeout=HANG,
                 what="the three runs inside their first step")
        owner_a = orc.get_run(ids[0]).lease_owner
        b, _ = procs.start(target("gated"), args=("--concurrency", "4", "--lease-ttl", "2", "--poll", "0.5"))
        # When the first worker is SIGKILLed
        a.send_signal(signal.SIGKILL)
        assert a.wait(timeout=HANG) == -signal.SIGKILL
        gate.touch()
        # Then the second worker takes every run over once its lease expires, and finishes it
        wait_for(lambda: orc.store.count_by_status() == {"completed": 3}, timeout=HANG, what="three runs")
        for run_id in ids:
            history = orc.history(run_id)
            assert journal_problems(history) == []
            resumed = [e["data"]["owner"] for e in history if e["kind"] == "Resumed"]
            assert resumed[0] == owner_a and len(resumed) == 2 and resumed[1] != owner_a
            assert orc.get_run(run_id).recoveries == 1  # taken over after the lease expired
        assert b.poll() is None
