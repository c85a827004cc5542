"""The chaos test: four workers on Postgres, 200 runs of a saga-shaped workflow against a real HTTP
service, and a supervisor that SIGKILLs a worker in the middle of its runs, again and again, and
starts a new one each time.

The service's ledger (a file outside the database) and the journals are the judges: every run ends
completed, no booking is made twice, every step completes once per tick, and no journal holds an
append by a lease holder other than the one that resumed the run last.

The kills are paced by progress, not by the clock: one each time another share of the runs has
ended, and each lands on a worker that holds unfinished runs at that moment (it is frozen with
SIGSTOP, its leases read, then killed). So a slow machine gets the same number of kills, each of
which certainly hits runs in flight, and a fast one cannot finish before the kills are done: the
last runs wait on a gate in their first step until then.
"""

from __future__ import annotations

import random
import signal
from collections import Counter

import pytest

from orchestrator import Orchestrator
from orchestrator.engine import TERMINAL_STATUSES
from orchestrator.engine.loader import load_target

from .conftest import HANG, journal_problems, stopped, target, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

RUNS = 200
GATED = 20  # the last runs enqueued: more than all workers' slots, so some worker always holds runs
WORKERS = 4
KILLS = 6
ARGS = ("--concurrency", "3", "--lease-ttl", "2", "--max-failures", "1000", "--drain", "0", "--poll", "0.5")


def pid_of(owner: str) -> int:
    return int(owner.rsplit(":", 2)[1])  # a worker's owner id is host:pid:random


def test_runs_survive_workers_killed_in_the_middle_of_them(pg_url, service, workers, tmp_path):
    mixed = load_target(target("mixed"))
    rng = random.Random(7)
    gate = tmp_path / "gate"
    with Orchestrator(pg_url, workflows=[mixed]) as orc:
        ids = [orc.enqueue(mixed, {"api": service.url, "city": f"c{i}", "pause": 0.15}) for i in range(RUNS - GATED)]
        # (the gated runs go last: a lower priority, so they never take slots the others need)
        ids += [orc.enqueue(mixed, {"api": service.url, "city": f"c{i}", "pause": 0.15, "gate": str(gate)},
                            priority=-1) for i in range(RUNS - GATED, RUNS)]
        procs = workers(pg_url)
        live = [procs.start(target("mixed"), args=ARGS)[0] for _ in range(WORKERS)]

        def ended() -> int:
            return sum(n for status, n in orc.store.count_by_status().items() if status in TERMINAL_STATUSES)

        def holding() -> dict[int, list[str]]:
            """Live workers' pids -> the unfinished runs they hold leases on."""
            pids = {p.pid for p in live}
            held: dict[int, list[str]] = {}
            for rec in orc.store.list_runs(limit=None):
                if rec.lease_owner and rec.status not in TERMINAL_STATUSES and pid_of(rec.lease_owner) in pids:
                    held.setdefault(pid_of(rec.lease_owner), []).append(rec.run_id)
            return held

        # When, each time another share of the ungated runs has ended, a supervisor kills a worker
        # that holds unfinished runs, and starts a new one
        orphaned: set[str] = set()
        for k in range(1, KILLS + 1):
            milestone = (RUNS - GATED) * k // (KILLS + 1)
            wait_for(lambda: ended() >= milestone, timeout=HANG, what=f"{milestone} runs to end\n{procs.logs()}")
            while True:
                held = wait_for(holding, timeout=HANG, what=f"a worker holding runs\n{procs.logs()}")
                pid = rng.choice(sorted(held))
                victim = next(p for p in live if p.pid == pid)
                victim.send_signal(signal.SIGSTOP)
                wait_for(lambda: stopped(victim), timeout=HANG, what="the victim to stop")
                frozen = holding().get(victim.pid, [])  # cannot change now, but for its leases expiring
                if frozen:
                    break
                victim.send_signal(signal.SIGCONT)  # it finished them before it froze: pick again
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=HANG)
            live.remove(victim)
            orphaned |= set(frozen)
            live.append(procs.start(target("mixed"), args=ARGS, ready=False)[0])
        gate.touch()
        wait_for(lambda: ended() == RUNS, timeout=4 * HANG, what=f"all runs to end\n{procs.logs()}")
        # Then every run completed
        assert orc.store.count_by_status() == {"completed": RUNS}, procs.logs()
        # And every run a killed worker held was recovered by another (the kills hit runs in flight)
        assert orphaned and all(orc.get_run(r).recoveries >= 1 for r in orphaned), orphaned
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
