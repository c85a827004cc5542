"""Limits across worker processes on Postgres: runs of a queue in flight, and calls to one tool in
flight, never exceed what is configured, whichever worker holds them."""

from __future__ import annotations

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target

from .conftest import HANG, target, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def test_queue_and_tool_limits_hold_across_workers(pg_url, slow_service, workers, tmp_path):
    fanout = load_target(target("fanout"))
    host = slow_service.url.split("//", 1)[1]
    gate = tmp_path / "gate"
    with Orchestrator(pg_url, workflows=[fanout]) as orc:
        ids = [orc.enqueue(fanout, {"api": slow_service.url, "n": n, "gate": str(gate)}, queue="api")
               for n in range(12)]
        # When two workers with four slots each serve a queue limited to three runs in flight (two
        # per worker), whose runs call a tool limited to two calls in flight
        procs = workers(pg_url)
        for _ in range(2):
            procs.start(target("fanout"), args=("--concurrency", "4", "--queue", "api", "--queue-concurrency",
                                                "api=3", "--worker-concurrency", "api=2", "--tool-limit",
                                                f"{host}=2", "--poll", "0.2"))
        # (the runs' first step waits on a gate until both workers hold runs: however much sooner
        # the first worker started, it cannot have driven them all alone)
        wait_for(lambda: len({orc.get_run(r).lease_owner for r in ids} - {None}) == 2, timeout=HANG,
                 what=f"runs leased by both workers\n{procs.logs()}")
        gate.touch()
        wait_for(lambda: orc.store.count_by_status() == {"completed": 12}, timeout=HANG,
                 what=f"12 runs\n{procs.logs()}")
        # Then at no moment were more than three runs of the queue being driven...
        spans = []
        for run_id in ids:
            history = orc.history(run_id)
            start = next(e["at"] for e in history if e["kind"] == "Resumed")
            spans.append((start, history[-1]["at"]))
        assert 2 <= max_overlap(spans) <= 3
        owners = {e["data"]["owner"] for r in ids for e in orc.history(r) if e["kind"] == "Resumed"}
        assert len(owners) == 2
    # ... and never more than two calls at the service, of the 36 made
    assert len([e for e in slow_service.ledger() if e["action"] == "book"]) == 36
    assert slow_service.stats()["max_in_flight"] == 2
