"""agentsaga's audit paths at scale (issue 4): `runs` and `show` over 100,000 runs and 1,000,000
events, and the HTML report of a 1,000-step run.

    python bench/audit.py            # full: 100,000 runs x 10 events each, a 1,000-step report
    python bench/audit.py --quick    # smoke: 2,000 runs, a 200-step report

The databases are filled by bulk inserts straight into the store's tables (one executemany
transaction on SQLite, COPY on Postgres), not through the engine: 100,000 real runs would take
minutes and measure the engine, not the audit queries. Each run's journal is a real one that folds
(RunStarted, eight steps, RunCompleted) with the final snapshot the engine would write, so `show`
does its full work on it. Runs spread over 100 days, 20 workflows and the usual mix of statuses.

Listing and show are timed through the library in this process (what the CLI spends once Python
has started); one more row times the real `agentsaga runs` process end to end, interpreter start
and imports included, for scale. The report run is made by the engine (a think/act/observe loop
with traces and a growing list of notes). Each time is the median of several repetitions after a
warm-up. The last stdout line is one JSON object; Postgres numbers are null, with `pg_reason`, when
the server cannot be reached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from _floor import PgSchemas, pg_unavailable, pg_url, with_search_path
from _report import ROOT, fmt_num, machine, table

sys.path.insert(0, ROOT)

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.payload import codec  # noqa: E402
from orchestrator.cli.audit import _show_lines  # noqa: E402
from orchestrator.engine import fold  # noqa: E402
from workflows import END, Workflow, reducers  # noqa: E402

FULL = {"runs": 100_000, "report_steps": 1000, "reps": 15}
QUICK = {"runs": 2_000, "report_steps": 200, "reps": 5}
TARGETS = {"list_ms": 100.0, "report_ms": 1000.0}
T0 = 1_790_000_000.0
SPAN = 100 * 86400.0
WORKFLOWS = 20
STEPS = [f"s{i}" for i in range(8)]
STATUSES = ["completed"] * 88 + ["failed"] * 6 + ["compensated"] * 2 + ["running"] * 2 + ["pending", "cancelled"]

# -- the chain every generated run followed --------------------------------------------------------
chain = Workflow("bench-chain", version="1", reducers={"notes": reducers.append})
for _i, _name in enumerate(STEPS):
    chain.step(name=_name, start=_i == 0)(lambda ctx, state: {"notes": "x"})
for _a, _b in zip(STEPS, STEPS[1:]):
    chain.edge(_a, _b)
chain.edge(STEPS[-1], END)


def chain_journal() -> tuple[list[tuple[str, str]], str, str]:
    """The events (kind, JSON text) of one run of the chain, its final snapshot text and hash."""
    started = {"workflow": chain.name, "version": chain.version, "fingerprint": chain.fingerprint,
               "graph": chain.describe(), "target": None, "input": {"question": "what happened?"},
               "start": [STEPS[0]]}
    events = [("RunStarted", codec.dumps(started))]
    for tick, name in enumerate(STEPS):
        nxt = [STEPS[tick + 1]] if tick + 1 < len(STEPS) else []
        events.append(("StepCompleted", codec.dumps({
            "step": name, "tick": tick, "attempt": 1, "input": {"state_at": len(events)},
            "update": {"notes": f"{name} looked at 3 documents and kept 1"}, "next": nxt, "ms": 12.5,
            "trace": [{"msg": f"{name}: chose the second source", "ms": 3.1}]})))
    events.append(("RunCompleted", "{}"))
    rs = fold([(i + 1, k, codec.loads(t)) for i, (k, t) in enumerate(events)], chain.reduce)
    state = codec.canonical_dumps(rs.to_json())
    return events, state, hashlib.sha256(state.encode()).hexdigest()


def run_rows(n: int) -> Iterator[tuple[Any, ...]]:
    rnd = random.Random(4)
    for i in range(n):
        created = T0 + i * SPAN / n + rnd.random()
        status = rnd.choice(STATUSES)
        done = status not in ("running", "pending")
        finished = created + 2.0 if done else None
        error = "ValueError: the tool said no" if status == "failed" else None
        yield (i + 1, f"run-{i:07d}", f"wf-{i % WORKFLOWS:02d}", "1", chain.fingerprint, "", status, created,
               finished or created + 1.0, finished, error)


RUN_COLUMNS = ("pk, run_id, workflow, version, fingerprint, target, status, created_at, updated_at, finished_at, "
               "error")


def event_rows(n: int, events: list[tuple[str, str]]) -> Iterator[tuple[Any, ...]]:
    for pk in range(1, n + 1):
        at = T0 + (pk - 1) * SPAN / n
        for seq, (kind, text) in enumerate(events, 1):
            yield (pk, seq, kind, at + seq * 0.25, text)


def fill_sqlite(path: str, n: int) -> None:
    events, state, digest = chain_journal()
    Orchestrator(f"sqlite:///{path}").close()  # the store creates its schema
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")  # filling only; the timed reads do not care
    conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO agentsaga_runs ({RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", run_rows(n))
    conn.executemany("INSERT INTO agentsaga_events (run_pk, seq, kind, at, data) VALUES (?,?,?,?,?)",
                     event_rows(n, events))
    conn.executemany("INSERT INTO agentsaga_snapshots (run_pk, seq, state, sha256, schema_version, trigger, "
                     "created_at) VALUES (?,?,?,?,1,'final',?)",
                     ((pk, len(events), state, digest, T0) for pk in range(1, n + 1)))
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def fill_pg(url: str, n: int) -> None:
    import psycopg

    events, state, digest = chain_journal()
    Orchestrator(url).close()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY agentsaga_runs ({RUN_COLUMNS}) FROM STDIN") as copy:
            for row in run_rows(n):
                copy.write_row(row)
        with cur.copy("COPY agentsaga_events (run_pk, seq, kind, at, data) FROM STDIN") as copy:
            for row in event_rows(n, events):
                copy.write_row(row)
        with cur.copy("COPY agentsaga_snapshots (run_pk, seq, state, sha256, schema_version, trigger, created_at) "
                      "FROM STDIN") as copy:
            for pk in range(1, n + 1):
                copy.write_row((pk, len(events), state, digest, 1, "final", T0))
        cur.execute("SELECT setval(pg_get_serial_sequence('agentsaga_runs', 'pk'), %s)", (n,))
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


# -- timing ----------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any], reps: int) -> dict[str, float]:
    fn()  # warm-up: connections, prepared plans, the page cache
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": reps}


def listing_queries(n: int) -> dict[str, dict[str, Any]]:
    day = T0 + SPAN / 2
    return {
        "newest 50": {},
        "status=failed": {"status": "failed"},
        "status=failed,running": {"status": ["failed", "running"]},
        "workflow=wf-07": {"workflow": "wf-07"},
        "workflow + status": {"workflow": "wf-07", "status": "failed"},
        "one day (since/until)": {"since": day, "until": day + 86400.0},
        "page 100 (offset 4,950)": {"offset": 4950},
    }


def measure_backend(url: str, n: int, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"list": {}, "show": None}
    with Orchestrator(url, workflows=[chain]) as orc:
        for name, filters in listing_queries(n).items():
            out["list"][name] = timed(lambda f=filters: orc.list_runs(limit=50, **f), reps)
        ids = [f"run-{i:07d}" for i in random.Random(9).sample(range(n), reps + 1)]
        it = iter(ids)
        out["show"] = timed(lambda: "\n".join(_show_lines(orc.summary(next(it)), limit=50)), reps)
    exe = shutil.which("agentsaga") or os.path.join(os.path.dirname(sys.executable), "agentsaga")
    if os.path.exists(exe):
        out["cli_runs"] = timed(lambda: subprocess.run([exe, "runs", "--db", url], check=True,
                                                       capture_output=True, cwd=ROOT), max(3, reps // 5))
    return out


# -- the report of a long run ----------------------------------------------------------------------
def agent_loop(steps: int) -> Workflow:
    wf = Workflow("bench-agent", version="1", reducers={"notes": reducers.append}, max_visits=steps)

    @wf.step(start=True)
    def think(ctx, state):
        ctx.trace("decided what to look up next", round=state.get("round", 0))
        return {"round": state.get("round", 0) + 1}

    @wf.step()
    def act(ctx, state):
        ctx.trace("called the search tool", query=f"topic {state['round']}")
        return {"last": {"hits": 3, "query": f"topic {state['round']}"}}

    @wf.step()
    def observe(ctx, state):
        return {"notes": f"round {state['round']}: kept 1 of {state['last']['hits']} hits"}

    wf.edge("think", "act")
    wf.edge("act", "observe")
    wf.route("observe", lambda s: "think" if s["round"] * 3 < steps else END, targets=["think", END])
    return wf


def measure_report(workdir: str, steps: int, reps: int) -> dict[str, Any]:
    wf = agent_loop(steps)
    path = os.path.join(workdir, "report.db")
    with Orchestrator(f"sqlite:///{path}", workflows=[wf]) as orc:
        result = orc.run(wf, {"question": "what is a saga?"}, run_id="long")
        executions = len(orc.summary("long").executions)
        target = os.path.join(workdir, "long.html")
        ms = timed(lambda: orc.report("long", target), max(3, reps // 3))
    return {"report": ms, "steps": executions, "status": result.status, "bytes": os.path.getsize(target)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2,000 runs, a 200-step report")
    ap.add_argument("--runs", type=int, help="runs in the listing database (10 events each)")
    args = ap.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    if args.runs:
        plan["runs"] = args.runs
    n, reps = plan["runs"], plan["reps"]
    workdir = tempfile.mkdtemp(prefix="agentsaga-audit-")
    pg = pg_url()
    pg_reason = pg_unavailable(pg)
    schemas = PgSchemas(pg)
    results: dict[str, Any] = {}
    fill: dict[str, float] = {}
    t_start = time.time()
    try:
        t = time.perf_counter()
        db = os.path.join(workdir, "audit.db")
        fill_sqlite(db, n)
        fill["sqlite"] = time.perf_counter() - t
        print(f"  sqlite filled: {n:,} runs, {n * 10:,} events in {fill['sqlite']:.1f} s", file=sys.stderr)
        results["sqlite"] = measure_backend(f"sqlite:///{db}", n, reps)
        if not pg_reason:
            url = with_search_path(pg, schemas.new("audit"))
            t = time.perf_counter()
            fill_pg(url, n)
            fill["postgres"] = time.perf_counter() - t
            print(f"  postgres filled in {fill['postgres']:.1f} s", file=sys.stderr)
            results["postgres"] = measure_backend(url, n, reps)
        report = measure_report(workdir, plan["report_steps"], reps)
    finally:
        schemas.close()
        shutil.rmtree(workdir, ignore_errors=True)

    def worst(backend: str) -> float | None:
        r = results.get(backend)
        return max(v["median"] for k, v in r["list"].items() if not k.startswith("page")) if r else None

    rows = []
    for backend in ("sqlite", "postgres"):
        r = results.get(backend)
        if r is None:
            rows.append([f"{backend}: not measured", "-", "", pg_reason or ""])
            continue
        for name, s in r["list"].items():
            rows.append([f"{backend} runs: {name}", f"{fmt_num(s['median'])} ({fmt_num(s['min'])}-{fmt_num(s['max'])})",
                         "ms", f"< {TARGETS['list_ms']:.0f}" if not name.startswith("page") else ""])
        s = r["show"]
        rows.append([f"{backend} show RUN (summary + text)", f"{fmt_num(s['median'])} ({fmt_num(s['min'])}-"
                     f"{fmt_num(s['max'])})", "ms", ""])
        if "cli_runs" in r:
            rows.append([f"{backend} `agentsaga runs` process, end to end", fmt_num(r["cli_runs"]["median"]), "ms",
                         "(interpreter start + imports included)"])
    s = report["report"]
    rows.append([f"report of a {report['steps']}-step run ({report['bytes']:,} B)",
                 f"{fmt_num(s['median'])} ({fmt_num(s['min'])}-{fmt_num(s['max'])})", "ms",
                 f"< {TARGETS['report_ms']:.0f}"])
    print(f"agentsaga audit benchmark ({'quick' if args.quick else 'full'}: {n:,} runs, {n * 10:,} events; "
          f"median (min-max) of {reps})")
    print(table(["measure", "value", "unit", "target"], rows))
    if pg_reason:
        print(f"postgres: {pg_reason}")
    print(f"(total {time.time() - t_start:.0f} s)")
    out = {
        "quick": args.quick, "runs": n, "events": n * 10,
        "sqlite_list_ms": worst("sqlite"), "pg_list_ms": worst("postgres"),
        "sqlite_show_ms": results["sqlite"]["show"]["median"],
        "pg_show_ms": results["postgres"]["show"]["median"] if "postgres" in results else None,
        "report_ms": report["report"]["median"], "report_steps": report["steps"], "report_bytes": report["bytes"],
        "targets": TARGETS, "fill_s": fill, "detail": results, "machine": machine(pg, pg_reason),
    }
    out["targets_met"] = {
        "list": all(v is not None and v < TARGETS["list_ms"] for v in (out["sqlite_list_ms"], out["pg_list_ms"])
                    if v is not None or not pg_reason),
        "report": out["report_ms"] < TARGETS["report_ms"],
    }
    if pg_reason:
        out["pg_reason"] = pg_reason
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
