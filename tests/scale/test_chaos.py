"""The chaos test: four workers on Postgres, 200 runs of a saga-shaped workflow against a real HTTP
service, and a supervisor that SIGKILLs a random worker about every second and starts a new one.

The service's ledger (a file outside the database) and the journals are the judges: every run ends
completed, no booking is made twice, every step completes once per tick, and no journal holds an
append by a lease holder other than the one that resumed the run last.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

import pytest

from orchestrator import Orchestrator
from orchestrator.engine import TERMINAL_STATUSES
from orchestrator.engine.loader import load_target

from .conftest import journal_problems, target

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

RUNS = 200
WORKERS = 4
ARGS = ("--concurrency", "3", "--lease-ttl", "2", "--max-failures", "1000", "--drain", "0", "--poll", "0.5")


def test_runs_survive_workers_killed_every_second(pg_url, service, workers):
    mixed = load_target(target("mixed"))
    rng = random.Random(7)
    with Orchestrator(pg_url, workflows=[mixed]) as orc:
        ids = [orc.enqueue(mixed, {"api": service.url, "city": f"c{i}", "pause": 0.15}) for i in range(RUNS)]
        procs = workers(pg_url)
        live = [procs.start(target("mixed"), args=ARGS)[0] for _ in range(WORKERS)]
        # When a supervisor kills a random worker about every second and replaces it
        kills = 0
        deadline = time.monotonic() + 150
        while True:
            counts = orc.store.count_by_status()
            if sum(n for status, n in counts.items() if status in TERMINAL_STATUSES) == RUNS:
                break
            assert time.monotonic() < deadline, f"not all runs ended: {counts}\n{procs.logs()}"
            time.sleep(rng.uniform(0.7, 1.3))
            victim = live.pop(rng.randrange(len(live)))
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            kills += 1
            live.append(procs.start(target("mixed"), args=ARGS, ready=False)[0])
        # Then every run completed
        assert orc.store.count_by_status() == {"completed": RUNS}, procs.logs()
        # And the kills did hit runs in flight (the test tested something)
        recoveries = sum(orc.get_run(r).recoveries for r in ids)
        assert kills >= 3 and recoveries >= 1, (kills, recoveries)
        # And no journal completed a step twice or interleaved two lease holders
        for run_id in ids:
            history = orc.history(run_id)
            assert journal_problems(history) == [], (run_id, journal_problems(history))
            steps = Counter(e["data"]["step"] for e in history if e["kind"] == "StepCompleted")
            assert steps == Counter({"plan": 1, "flight": 1, "notes": 1, "hotel": 1}), (run_id, steps)
    # And the service booked every flight and hotel exactly once (re-sent calls were replays)
    booked = Counter(e["idempotency_key"] for e in service.ledger() if e["action"] == "book")
    assert len(booked) == 2 * RUNS
    assert [key for key, n in booked.items() if n > 1] == []
