"""Snapshot policies: what each costs per step, on disk and at recovery, against no snapshots.

    python bench/checkpoints.py            # 1,000 and 10,000 steps, 1,000- and 10,000-turn conversations
    python bench/checkpoints.py --quick    # smoke: small counts
    python bench/checkpoints.py --no-long  # without the 10,000-turn conversation (~20 MB of state)

Two workloads, each run once per policy on SQLite (a file, WAL, synchronous=FULL) and on the local
Postgres (``AGENTSAGA_TEST_PG``; a fresh schema each, dropped at the end):

- ``steps``: a loop whose step returns a small update (the state stays small);
- ``conversation``: one ~2 KB message appended per step under the ``append`` reducer (the state
  grows to ~2 MB at 1,000 turns, ~20 MB at 10,000): the case where a full snapshot every N events
  makes later steps dearer, and where incremental snapshots (``_incr``: only the appended tail, a
  full one closing each chain of 10) are meant to pay. The 10,000-turn conversation runs only the
  policies that tell full from incremental apart (``LONG_POLICIES``).

Per policy: milliseconds per step over the whole run and its overhead against the ``none`` policy
measured in the same run (the floor: only the final snapshot), the per-step cost of the last tenth
of the run against the first tenth (``growth``: flat is 1.0), bytes on disk, snapshots written, and
recovery time: the run is interrupted two steps before its end and a fresh process restores it
(newest verified snapshot + the events after it) ``RECOVERIES`` times; the median is reported.
Prints a table per workload and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from _floor import (
    PgSchemas,
    pg_schema_bytes,
    pg_unavailable,
    pg_url,
    sqlite_bytes,
    with_search_path,
)
from _report import machine, table

from orchestrator import Orchestrator
from workflows import END, Adaptive, Snapshots, Workflow, reducers

#: the policies compared; "none" writes only the final snapshot (and is the floor)
#: ``_full``: every snapshot full; ``_incr``: incremental links, a full snapshot every 10 (the default)
POLICIES: dict[str, Snapshots] = {
    "none": Snapshots(every=None),
    "every_100_full": Snapshots(every=100, incremental=None),
    "every_100_incr": Snapshots(every=100, incremental=10),
    "every_10_full": Snapshots(every=10, incremental=None),
    "every_10_incr": Snapshots(every=10, incremental=10),
    "every_100_ratio_1": Snapshots(every=100, replay_ratio=1.0),
    "adaptive_50_1000": Snapshots(adaptive=Adaptive(min_every=50, max_every=1000)),
}
LONG_POLICIES = ("none", "every_100_full", "every_100_incr")
MESSAGE = "m" * 2000
RECOVERIES = 5


class Stop(Exception):
    """Raised by the step at the chosen count: the run stays interrupted (its lease is given up below)."""


def workflow(kind: str, steps: int, policy: Snapshots, stop_at: int | None) -> Workflow:
    wf = Workflow(f"bench_{kind}", reducers={"messages": reducers.append}, snapshots=policy, max_visits=steps + 1)

    @wf.step(start=True)
    def turn(ctx, state):
        n = state["n"]
        if n == stop_at:
            raise KeyboardInterrupt
        if kind == "conversation":
            return {"n": n + 1, "messages": {"role": "user" if n % 2 else "assistant", "text": f"{n}:{MESSAGE}"}}
        return {"n": n + 1, "pad": "x" * 40}

    wf.route("turn", lambda s: "turn" if s["n"] < steps else END)
    return wf


def measure(url: str, kind: str, steps: int, name: str, policy: Snapshots) -> dict:
    """One run to the end (per-step times from commit to commit) and one interrupted run (recovery)."""
    stamps: list[float] = []
    seen = {"last": 0, "written": 0}

    def observe(run, events) -> None:
        stamps.append(time.perf_counter())
        if run.last_snapshot_seq != seen["last"]:  # this commit wrote a snapshot
            seen["last"] = run.last_snapshot_seq
            seen["written"] += 1

    wf = workflow(kind, steps, policy, None)
    initial = {"n": 0, "messages": []} if kind == "conversation" else {"n": 0}
    with Orchestrator(url, workflows=[wf], observers=[observe]) as orc:
        start = time.perf_counter()
        result = orc.run(wf, initial, run_id="full")
        total = time.perf_counter() - start
        assert result.status == "completed", result.error
        snapshots = seen["written"]
        written = sum(1 for e in orc.history("full") if e["kind"] == "StepCompleted")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    tenth = max(1, len(gaps) // 10)
    first, last = statistics.mean(gaps[:tenth]), statistics.mean(gaps[-tenth:])
    # Recovery: the same run interrupted two steps before its end (just before every_100's next
    # snapshot would be due: the most a count policy makes a recovery replay), restored afresh.
    cut = workflow(kind, steps, policy, steps - 2)
    with Orchestrator(url, workflows=[cut]) as orc:
        try:
            orc.run(cut, initial, run_id="cut")
        except KeyboardInterrupt:
            pass
    times, replayed = [], 0
    for _ in range(RECOVERIES):
        with Orchestrator(url, workflows=[workflow(kind, steps, policy, None)]) as orc:
            t0 = time.perf_counter()
            folded, snap_seq, _ = orc.engine.restore("cut", orc.workflows.get(wf.name))
            times.append(time.perf_counter() - t0)
            replayed = folded.seq - snap_seq
    return {"ms_per_step": total * 1000 / written, "first_tenth_ms": first * 1000, "last_tenth_ms": last * 1000,
            "growth": last / first if first else None, "snapshots": snapshots,
            "recovery_ms": statistics.median(times) * 1000, "replayed": replayed}


def run_backend(backend: str, kinds: list[tuple[str, int]], pg: str | None) -> dict:
    out: dict = {}
    schemas = PgSchemas(pg) if backend == "postgres" and pg else None
    try:
        for kind, steps in kinds:
            key = f"{kind}_{steps}"
            out[key] = {}
            for name, policy in POLICIES.items():
                if kind == "conversation" and steps > 1000 and name not in LONG_POLICIES:
                    continue
                if schemas is not None:
                    schema = schemas.new(name[:12])
                    url = with_search_path(pg, schema)
                    row = measure(url, kind, steps, name, policy)
                    row["bytes"] = pg_schema_bytes(pg, schema)
                    schemas.drop(schema)
                else:
                    with tempfile.TemporaryDirectory() as tmp:
                        path = os.path.join(tmp, "bench.db")
                        row = measure(f"sqlite:///{path}", kind, steps, name, policy)
                        row["bytes"] = sqlite_bytes(path)
                out[key][name] = row
            floor = out[key]["none"]["ms_per_step"]
            for row in out[key].values():
                row["overhead"] = row["ms_per_step"] / floor if floor else None
    finally:
        if schemas is not None:
            schemas.close()
    return out


def print_tables(backend: str, results: dict) -> None:
    for key, rows in results.items():
        print(f"\n{backend}: {key.replace('_', ' ')} steps")
        headers = ["policy", "ms/step", "x none", "growth last/first tenth", "snapshots written", "bytes",
                   "recovery ms", "replayed"]
        body = [[name, f"{r['ms_per_step']:.3f}", f"{r['overhead']:.2f}", f"{r['growth']:.2f}", str(r["snapshots"]),
                 f"{r['bytes']:,}", f"{r['recovery_ms']:.1f}", str(r["replayed"])] for name, r in rows.items()]
        print(table(headers, body))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small counts")
    ap.add_argument("--no-long", action="store_true", help="skip the 10,000-turn conversation")
    args = ap.parse_args(argv)
    kinds = [("steps", 200), ("conversation", 100)] if args.quick else \
        [("steps", 1000), ("steps", 10000), ("conversation", 1000)] + ([] if args.no_long else [("conversation", 10000)])
    global RECOVERIES
    if args.quick:
        RECOVERIES = 1
    pg = pg_url()
    reason = pg_unavailable(pg)
    out: dict = {"quick": args.quick, "policies": {k: v.to_json() for k, v in POLICIES.items()}}
    out["sqlite"] = run_backend("sqlite", kinds, None)
    print_tables("sqlite", out["sqlite"])
    out["postgres"] = None if reason else run_backend("postgres", kinds, pg)
    out["pg_reason"] = reason
    if out["postgres"]:
        print_tables("postgres", out["postgres"])
    out["machine"] = machine(pg, reason)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
