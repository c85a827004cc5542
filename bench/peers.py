"""agentsaga side by side with DBOS and LangGraph, in one run, against the physical floor.

    python bench/peers.py            # the full run (about 10-15 minutes on 2 cores)
    python bench/peers.py --quick    # a smoke run: small counts, one repetition, under a minute

Every measurement runs in a fresh child process (``_child.py``), so no engine shares an
interpreter, an import or a cache with another, and repetitions are interleaved
(A, B, C, A, B, C, ...) so drift on the machine hits every engine alike. How each engine is
configured is written at the top of its adapter (``_sys_*.py``) and in docs/benchmarks.md.

Prints the tables, then as its last line one JSON object with every number. An engine that is not
installed, or a Postgres that cannot be reached, is reported as such in the tables and the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from _floor import (
    PgSchemas,
    pg_floor_once,
    pg_unavailable,
    pg_url,
    remove_sqlite,
    sqlite_floor_once,
    summary,
    with_search_path,
)
from _hooks import read_ledger
from _report import ChildError, check_import, fmt_num, fmt_summary, machine, run_child, table
from _systems import REQUIRES, REQUIRES_PG, SYSTEMS, backend_of

FULL = {
    "reps": 3,
    "steps_reps": 9,
    "steps_n": 1000,
    "floor_n": 1000,
    "many_count": 500,
    "many_n": 10,
    "crash_points": [(100, 1000), (500, 1000), (900, 1000), (9000, 10000)],
    "bytes_n": [100, 1000, 10000],
    "bytes_pads": [40, 1000],
}
QUICK = {
    "reps": 1,
    "steps_reps": 1,
    "steps_n": 100,
    "floor_n": 100,
    "many_count": 20,
    "many_n": 10,
    "crash_points": [(50, 100)],
    "bytes_n": [100],
    "bytes_pads": [40],
}
PAD_LABEL = {40: "60B", 1000: "1KB"}


def baseline_of(system: str) -> str:
    return "agentsaga-pg" if backend_of(system) == "pg" else "agentsaga-sqlite"


class Bench:
    def __init__(self, plan: dict, systems: list[str], workdir: str) -> None:
        self.plan = plan
        self.workdir = workdir
        self.pg = pg_url()
        self.pg_reason = pg_unavailable(self.pg)
        self.schemas = PgSchemas(self.pg)
        self.status: dict[str, str | None] = {}
        self.errors: dict[str, dict[str, str]] = {}
        self._seq = 0
        for s in systems:
            self.status[s] = self._unavailable(s)
        self.active = [s for s in systems if self.status[s] is None]

    def _unavailable(self, system: str) -> str | None:
        module = SYSTEMS[system][0]
        if backend_of(system) == "pg":
            if self.pg_reason:
                return f"skipped: {self.pg_reason}"
            if module in REQUIRES_PG and (why := check_import(REQUIRES_PG[module])):
                return f"not installed: {why}"
        why = check_import(REQUIRES[module])
        return f"not installed: {why}" if why else None

    # -- fresh databases --------------------------------------------------------------------
    def target(self, system: str) -> dict:
        self._seq += 1
        if backend_of(system) == "sqlite":
            path = os.path.join(self.workdir, f"{system}-{self._seq}.db")
            remove_sqlite(path)
            return {"path": path}
        schema = self.schemas.new(system.split("-")[0])
        return {"url": self.pg, "schema": schema, "url_with_schema": with_search_path(self.pg, schema)}

    def release(self, target: dict) -> None:
        if "path" in target:
            remove_sqlite(target["path"])
            for extra in (target["path"] + ".ledger",):
                if os.path.exists(extra):
                    os.remove(extra)
        else:
            try:
                self.schemas.drop(target["schema"])
            except Exception:  # server briefly away: close() drops the leftovers at the end
                pass

    def copy(self, golden: dict, system: str) -> dict:
        """A fresh copy of a crashed SQLite database (and its ledger) for one resume repetition."""
        fresh = self.target(system)
        for suffix in ("", "-wal"):
            if os.path.exists(golden["path"] + suffix):
                shutil.copyfile(golden["path"] + suffix, fresh["path"] + suffix)
        shutil.copyfile(golden["path"] + ".ledger", fresh["path"] + ".ledger")
        return fresh

    def fail(self, workload: str, system: str, exc: Exception) -> None:
        self.errors.setdefault(workload, {})[system] = str(exc)[:400]
        print(f"  ! {workload} {system}: {str(exc)[:300]}", file=sys.stderr, flush=True)

    # -- workloads --------------------------------------------------------------------------
    def steps(self) -> dict:
        n, reps = self.plan["steps_n"], self.plan["steps_reps"]
        vals: dict[str, list[float]] = {s: [] for s in self.active}
        floor = {"sqlite": [], "sqlite_1stmt": [], "pg": [], "pg_1stmt": []}
        floor_db = os.path.join(self.workdir, "floor.db")
        config: dict[str, dict] = {}
        for rep in range(reps):
            floor["sqlite"].append(sqlite_floor_once(floor_db, self.plan["floor_n"]))
            floor["sqlite_1stmt"].append(sqlite_floor_once(floor_db, self.plan["floor_n"], single=True))
            if not self.pg_reason:
                for key, single in (("pg", False), ("pg_1stmt", True)):
                    try:
                        floor[key].append(pg_floor_once(self.pg, self.plan["floor_n"], single=single))
                    except Exception as exc:  # the server went away mid-run: lose one sample
                        floor[key].append(None)
                        self.fail("floor", key, exc)
            for s in self.active:
                t = None
                try:
                    t = self.target(s)
                    r, _ = run_child({"system": s, "op": "steps", "n": n, "target": t})
                    vals[s].append(r["ms_per_step"])
                    config[s] = r.get("config", {})
                except Exception as exc:  # a failed child or database: reported in its cell
                    vals[s].append(None)  # keeps repetitions aligned for the paired ratios
                    self.fail("steps", s, exc)
                finally:
                    if t is not None:
                        self.release(t)
            print(f"  steps rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
        # Ratios per repetition (each engine against the floor and the agentsaga run of the same
        # round), then the median: drift on the machine moves both halves of a pair alike.
        paired: dict[str, dict] = {}
        for s, v in vals.items():
            f = floor["pg" if backend_of(s) == "pg" else "sqlite"]
            base = vals.get(baseline_of(s), [])
            paired[s] = {
                "x_floor": summary([a / b for a, b in zip(v, f) if a is not None and b]),
                "x_agentsaga": summary([a / b for a, b in zip(v, base) if a is not None and b is not None]),
            }
            f1 = floor["pg_1stmt" if backend_of(s) == "pg" else "sqlite_1stmt"]
            paired[s]["x_floor_1stmt"] = summary([a / b for a, b in zip(v, f1) if a is not None and b])
        return {"n": n, "floor": {k: summary(v) for k, v in floor.items()},
                "systems": {s: summary(v) for s, v in vals.items()}, "paired": paired, "config": config}

    def many(self) -> dict:
        count, n, reps = self.plan["many_count"], self.plan["many_n"], self.plan["reps"]
        vals: dict[str, list[float]] = {s: [] for s in self.active}
        for rep in range(reps):
            for s in self.active:
                t = None
                try:
                    t = self.target(s)
                    r, _ = run_child({"system": s, "op": "many", "n": n, "count": count, "target": t})
                    if not r["final_ok"]:
                        raise ChildError("a workflow ended with the wrong state")
                    vals[s].append(r["wf_per_s"])
                except Exception as exc:  # a failed child or database: reported in its cell
                    self.fail("many", s, exc)
                finally:
                    if t is not None:
                        self.release(t)
            print(f"  many rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
        return {"count": count, "n": n, "systems": {s: summary(v) for s, v in vals.items()}}

    def _crash(self, s: str, k: int, n: int) -> dict:
        t = self.target(s)
        ledger = (t["path"] if "path" in t else os.path.join(self.workdir, t["schema"])) + ".ledger"
        t["ledger"] = ledger
        run_child({"system": s, "op": "crash", "n": n, "kill_at": k + 1, "run_id": "crash",
                   "ledger": ledger, "target": t}, expect_kill=True)
        return t

    def _resume(self, s: str, t: dict, n: int) -> dict:
        ledger = t.get("ledger") or t["path"] + ".ledger"
        r, t_spawn = run_child({"system": s, "op": "resume", "n": n, "run_id": "crash",
                                "ledger": ledger, "target": t})
        done = read_ledger(ledger)
        if "ledger" in t and os.path.exists(ledger) and "path" not in t:
            os.remove(ledger)
        if r["t_first_wall"] is None:
            raise ChildError("the resume ran no new step")
        return {
            "proc_ms": (r["t_first_wall"] - t_spawn) * 1000,
            "resume_ms": r["resume_ms"],
            "interp_ms": (r["t_main"] - t_spawn) * 1000,
            "import_ms": (r["t_open_wall"] - r["t_main"]) * 1000,
            "re_executed": len(done) - len(set(done)),
            "final_ok": bool(r["final_ok"]) and set(done) == set(range(1, n + 1)),
        }

    def crash_resume(self) -> dict:
        out: dict = {}
        for k, n in self.plan["crash_points"]:
            key = f"{k}/{n}"
            rows: dict[str, list[dict]] = {s: [] for s in self.active}
            golden: dict[str, dict] = {}
            # SQLite: crash once, resume each repetition on a byte-for-byte copy of the crashed
            # file. Postgres databases cannot be copied that way, so each repetition crashes anew.
            for s in self.active:
                if backend_of(s) == "sqlite":
                    try:
                        golden[s] = self._crash(s, k, n)
                        os.replace(golden[s]["ledger"], golden[s]["path"] + ".ledger")
                    except Exception as exc:  # a failed child or database: reported in its cell
                        self.fail(f"crash {key}", s, exc)
            for rep in range(self.plan["reps"]):
                for s in self.active:
                    t = None
                    try:
                        if backend_of(s) == "sqlite":
                            if s not in golden:
                                continue
                            t = self.copy(golden[s], s)
                        else:
                            t = self._crash(s, k, n)
                        rows[s].append(self._resume(s, t, n))
                    except Exception as exc:  # a failed child or database: reported in its cell
                        self.fail(f"resume {key}", s, exc)
                    finally:
                        if t is not None:
                            self.release(t)
            for t in golden.values():
                self.release(t)
            out[key] = {
                s: {
                    "proc_ms": summary([r["proc_ms"] for r in v]),
                    "resume_ms": summary([r["resume_ms"] for r in v]),
                    "interp_ms": summary([r["interp_ms"] for r in v]),
                    "import_ms": summary([r["import_ms"] for r in v]),
                    "re_executed": max(r["re_executed"] for r in v),
                    "final_ok": all(r["final_ok"] for r in v),
                } if v else None
                for s, v in rows.items()
            }
            print(f"  crash/resume {key} done", file=sys.stderr, flush=True)
        return out

    def bytes(self) -> dict:
        out: dict = {}
        for pad in self.plan["bytes_pads"]:
            label = PAD_LABEL.get(pad, f"pad{pad}")
            out[label] = {s: {} for s in self.active}
            for n in self.plan["bytes_n"]:
                for s in self.active:
                    t = None
                    try:
                        t = self.target(s)
                        r, _ = run_child({"system": s, "op": "bytes", "n": n, "pad": pad, "target": t})
                        out[label][s][str(n)] = r["bytes_per_step"]
                    except Exception as exc:  # a failed child or database: reported in its cell
                        self.fail(f"bytes {label}@{n}", s, exc)
                    finally:
                        if t is not None:
                            self.release(t)
            print(f"  bytes {label} done", file=sys.stderr, flush=True)
        return out


# -- reporting ----------------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def med(s: dict | None) -> float | None:
    return s["median"] if s else None


def report(bench: Bench, res: dict) -> tuple[str, dict]:
    lines: list[str] = []
    status_rows = [[s, "ok" if why is None else why[:110]] for s, why in bench.status.items()]
    lines += ["Engines", table(["engine", "status"], status_rows), ""]

    st = res["steps"]
    floor = st["floor"]
    rows = [["floor sqlite (BEGIN; INSERT; COMMIT)", fmt_summary(floor["sqlite"]), "1.00", ""],
            ["floor sqlite, 1 autocommit INSERT", fmt_summary(floor.get("sqlite_1stmt")),
             fmt_num(ratio(med(floor.get("sqlite_1stmt")), med(floor["sqlite"])), 2), ""]]
    if floor["pg"]:
        rows.append(["floor postgres (INSERT; commit())", fmt_summary(floor["pg"]), "1.00", ""])
        rows.append(["floor postgres, 1 autocommit INSERT", fmt_summary(floor.get("pg_1stmt")),
                     fmt_num(ratio(med(floor.get("pg_1stmt")), med(floor["pg"])), 2), ""])
    else:
        rows.append(["floor postgres", f"- ({bench.pg_reason})", "", ""])
    for s, v in st["systems"].items():
        p = st.get("paired", {}).get(s, {})
        rows.append([s, fmt_summary(v), fmt_num(med(p.get("x_floor")), 2), fmt_num(med(p.get("x_agentsaga")), 2)])
    lines += [f"One workflow of {st['n']} trivial steps: ms per step, median (min-max) of {bench.plan['steps_reps']};"
              " ratios are medians of per-round pairs",
              table(["engine", "ms/step", "x floor", "x agentsaga"], rows), ""]

    mw = res["many"]
    rows = []
    for s, v in mw["systems"].items():
        rows.append([s, fmt_summary(v, 1), fmt_num(ratio(med(mw["systems"].get(baseline_of(s))), med(v)), 2)])
    lines += [f"{mw['count']} workflows x {mw['n']} steps in one process: workflows/s, median (min-max)",
              table(["engine", "workflows/s", "agentsaga faster by"], rows), ""]

    rows = []
    for key, per in res["crash_resume"].items():
        for s, v in per.items():
            if v is None:
                rows.append([s, key, "failed", "", "", "", ""])
                continue
            rows.append([s, key, fmt_summary(v["proc_ms"], 1), fmt_summary(v["resume_ms"], 1),
                         f"{fmt_num(med(v['interp_ms']), 0)}+{fmt_num(med(v['import_ms']), 0)}",
                         str(v["re_executed"]), "yes" if v["final_ok"] else "NO"])
    lines += ["Crash (SIGKILL inside step K+1) and resume in a new process: ms to the first new step",
              table(["engine", "K/N", "process start->step", "open engine->step", "interp+imports",
                     "re-executed", "final ok"], rows), ""]

    by = res["bytes"]
    ns = [str(n) for n in bench.plan["bytes_n"]]
    headers = ["engine"] + [f"{label}@{n}" for label in by for n in ns]
    rows = []
    for s in bench.active:
        rows.append([s] + [fmt_num(by[label].get(s, {}).get(n), 0) if by[label].get(s, {}).get(n) is not None
                           else "-" for label in by for n in ns])
    lines += ["Database bytes per step: growth during one N-step run / N, on a database already holding a finished"
              " 200-step run (SQLite: file+WAL after checkpoint; Postgres: tables+indexes+TOAST)",
              table(headers, rows), ""]

    targets = check_targets(res)
    lines.append("Targets (issue 6)")
    for name, t in targets.items():
        verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")
        lines.append(f"  {verdict:6s} {name}: {t['detail']}")
    return "\n".join(lines), targets


def check_targets(res: dict) -> dict:
    paired = res["steps"].get("paired", {})
    out: dict = {}

    def add(name: str, value: float | None, limit: float, fmt: str, smaller_is_met: bool = True) -> None:
        met = None if value is None else (value <= limit if smaller_is_met else value >= limit)
        out[name] = {"value": value, "limit": limit, "met": met,
                     "detail": "no data" if value is None else fmt.format(v=value, lim=limit)}

    for s, label in (("agentsaga-sqlite", "sqlite"), ("agentsaga-pg", "pg")):
        p = paired.get(s, {})
        strict = med(p.get("x_floor_1stmt"))
        add(f"agentsaga {label} per step <= 2x floor", med(p.get("x_floor")), 2, "{v:.2f}x the floor (limit {lim}x); "
            + ("-" if strict is None else f"{strict:.2f}x the 1-INSERT autocommit floor"))
    for peer, lim in (("dbos-sqlite", 5), ("dbos-sqlite-wal", 5), ("langgraph-sqlite-sync", 4), ("dbos-pg", 4)):
        add(f">= {lim}x faster per step than {peer}", med(paired.get(peer, {}).get("x_agentsaga")), lim,
            "{v:.2f}x faster (need {lim}x)", smaller_is_met=False)
    cr = res["crash_resume"]
    first = next(iter(cr), None)
    last = next(reversed(cr), None) if cr else None
    if first and last and first != last:
        for s in ("agentsaga-sqlite", "agentsaga-pg"):
            lo, hi = (cr[first].get(s) or {}), (cr[last].get(s) or {})
            add(f"{s} resume after {last} within 2x of after {first}",
                ratio(med(hi.get("resume_ms")), med(lo.get("resume_ms"))), 2, "{v:.2f}x (limit {lim}x)")
    for label, per in res["bytes"].items():
        for s, page in (("agentsaga-sqlite", 4096), ("agentsaga-pg", 8192)):
            vals = {int(k): v for k, v in (per.get(s) or {}).items() if v}
            if len(vals) < 2:
                continue
            spread = max(vals.values()) / min(vals.values())
            big = [v for k, v in vals.items() if k >= 1000]
            spread_big = max(big) / min(big) if len(big) >= 2 else spread
            # Files grow by whole pages: at N steps one page is page/N bytes per step, so a
            # small run can only be judged to within a couple of pages.
            smallest = min(vals)
            slack = 2 * page / smallest
            within = abs(vals[smallest] - vals[max(vals)]) <= slack
            met = spread <= 1.25 or (spread_big <= 1.25 and within)
            out[f"{s} bytes/step flat ({label}, {min(vals)}..{max(vals)} steps)"] = {
                "value": spread, "limit": 1.25, "met": met,
                "detail": f"max/min {spread:.2f} over all counts, {spread_big:.2f} over >= 1000 steps; "
                          f"at {smallest} steps one {page // 1024} KB page is {page / smallest:.0f} B/step",
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small counts, one repetition")
    ap.add_argument("--reps", type=int, help="repetitions per measurement (default 3, steps 9)")
    ap.add_argument("--systems", help="comma-separated subset of: " + ", ".join(SYSTEMS))
    ap.add_argument("--workloads", default="steps,many,crash,bytes", help="comma-separated subset")
    args = ap.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    if args.reps:
        plan["reps"] = plan["steps_reps"] = args.reps
    systems = args.systems.split(",") if args.systems else list(SYSTEMS)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; known: {list(SYSTEMS)}")
    workloads = set(args.workloads.split(","))

    workdir = tempfile.mkdtemp(prefix="agentsaga-bench-")
    bench = Bench(plan, systems, workdir)
    t0 = time.time()
    res: dict = {"steps": {"n": plan["steps_n"], "floor": {"sqlite": None, "sqlite_1stmt": None, "pg": None,
                                                          "pg_1stmt": None}, "systems": {}},
                 "many": {"count": plan["many_count"], "n": plan["many_n"], "systems": {}},
                 "crash_resume": {}, "bytes": {}}
    try:
        if "steps" in workloads:
            res["steps"] = bench.steps()
        if "many" in workloads:
            res["many"] = bench.many()
        if "crash" in workloads:
            res["crash_resume"] = bench.crash_resume()
        if "bytes" in workloads:
            res["bytes"] = bench.bytes()
    finally:
        bench.schemas.close()
        shutil.rmtree(workdir, ignore_errors=True)
    text, targets = report(bench, res)
    print(text)
    print(f"\n(total {time.time() - t0:.0f} s; {'quick' if args.quick else 'full'} mode)")
    summary_json = {
        "bench": "peers",
        "quick": args.quick,
        "plan": {k: v for k, v in plan.items()},
        "machine": machine(bench.pg, bench.pg_reason),
        "pg_reason": bench.pg_reason,
        "engines": bench.status,
        "errors": bench.errors,
        "steps_ms": res["steps"],
        "workflows_per_s": res["many"],
        "crash_resume": res["crash_resume"],
        "bytes_per_step": res["bytes"],
        "targets": targets,
    }
    print(json.dumps(summary_json, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
