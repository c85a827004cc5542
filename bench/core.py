"""agentsaga's own cost model (issue 2): per-step cost against the floor, bytes, resume time.

    python bench/core.py            # full: 11 repetitions, 1,000-step runs, resume after 1k and 10k
    python bench/core.py --quick    # smoke: one repetition, small counts

Per step: one workflow of 1,000 trivial steps (each returns ~60 bytes), timed around ``orc.run``
in a fresh process, next to the floor (one small INSERT+COMMIT per transaction through the driver,
same durability) measured just before it in the same run; the ratio is the median of those
per-repetition pairs. Bytes: growth of the SQLite
database (file + WAL after a TRUNCATE checkpoint) per step. Resume: a child runs the workflow and
is SIGKILLed inside the step after 1,000 (10,000) completed steps; each repetition copies that
crashed file and resumes it in a new process, timed from the start of ``Orchestrator(...)`` to the
first new step beginning (process start and imports are reported beside it).

The last stdout line is one JSON object; Postgres numbers are null with ``pg_reason`` when the
server cannot be reached.
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
from _report import ChildError, check_import, fmt_num, fmt_summary, machine, run_child, table
from _systems import REQUIRES

FULL = {"reps": 11, "steps_n": 1000, "floor_n": 1000, "bytes_n": 1000, "resume_points": [1000, 10000], "tail": 100}
QUICK = {"reps": 1, "steps_n": 200, "floor_n": 200, "bytes_n": 200, "resume_points": [1000, 10000], "tail": 10}
STATE_KB = 10  # the nested state of the per-step copy row (issue 14, case 10)
TARGETS = {"sqlite_ratio": 2.0, "pg_ratio": 1.5, "bytes_per_step": 400, "resume_ms_10k_abs": 20.0, "resume_growth": 2.0}


def med(s: dict | None) -> float | None:
    return s["median"] if s else None


class Core:
    def __init__(self, plan: dict, extra: dict, workdir: str) -> None:
        self.plan = plan
        self.extra = extra
        self.workdir = workdir
        self.pg = pg_url()
        self.pg_reason = pg_unavailable(self.pg)
        self.schemas = PgSchemas(self.pg)
        self._seq = 0
        self.errors: dict[str, str] = {}

    def sqlite_target(self) -> dict:
        self._seq += 1
        path = os.path.join(self.workdir, f"core-{self._seq}.db")
        remove_sqlite(path)
        return {"path": path}

    def pg_target(self) -> dict:
        schema = self.schemas.new("core")
        return {"url": self.pg, "schema": schema, "url_with_schema": with_search_path(self.pg, schema)}

    def child(self, system: str, op: str, target: dict, **spec) -> tuple[dict | None, float]:
        return run_child({"system": system, "op": op, "target": target, "extra": self.extra, **spec})

    def steps(self) -> dict:
        n = self.plan["steps_n"]
        vals: dict[str, list[float]] = {"floor_sqlite": [], "floor_sqlite_1stmt": [], "floor_pg": [],
                                        "floor_pg_1stmt": [], "sqlite": [], "pg": []}
        floor_db = os.path.join(self.workdir, "floor.db")
        for rep in range(self.plan["reps"]):
            vals["floor_sqlite"].append(sqlite_floor_once(floor_db, self.plan["floor_n"]))
            vals["floor_sqlite_1stmt"].append(sqlite_floor_once(floor_db, self.plan["floor_n"], single=True))
            t = self.sqlite_target()
            try:
                vals["sqlite"].append(self.child("agentsaga-sqlite", "steps", t, n=n)[0]["ms_per_step"])
            except ChildError as exc:
                vals["sqlite"].append(None)  # keeps repetitions aligned with their floors
                self.errors["sqlite_steps"] = str(exc)
            finally:
                remove_sqlite(t["path"])
            if not self.pg_reason:
                t = None
                try:
                    vals["floor_pg"].append(pg_floor_once(self.pg, self.plan["floor_n"]))
                    vals["floor_pg_1stmt"].append(pg_floor_once(self.pg, self.plan["floor_n"], single=True))
                    t = self.pg_target()
                    vals["pg"].append(self.child("agentsaga-pg", "steps", t, n=n)[0]["ms_per_step"])
                except Exception as exc:  # a failed child, or the server went away: one sample lost
                    for key in ("floor_pg", "floor_pg_1stmt", "pg"):  # keep the pairs aligned
                        del vals[key][rep:]
                        vals[key].append(None)
                    self.errors["pg_steps"] = str(exc)
                finally:
                    if t is not None:
                        try:
                            self.schemas.drop(t["schema"])
                        except Exception:  # close() drops leftovers at the end
                            pass
            print(f"  steps rep {rep + 1}/{self.plan['reps']} done", file=sys.stderr, flush=True)
        out = {k: summary(v) for k, v in vals.items()}
        # Ratios are taken per repetition, against the floor measured just before that run, then
        # the median: drift on a shared machine moves both halves of a pair alike.
        for eng, floor in (("sqlite", "floor_sqlite"), ("sqlite", "floor_sqlite_1stmt"),
                           ("pg", "floor_pg"), ("pg", "floor_pg_1stmt")):
            pairs = [a / f for a, f in zip(vals[eng], vals[floor]) if a is not None and f]
            out["ratio_" + floor.removeprefix("floor_")] = summary(pairs)
        return out

    def effect_steps(self) -> tuple[dict | None, str | None]:
        """ms/step with ``effect=True`` steps (a durable intent before each call), if supported."""
        vals = []
        for _ in range(self.plan["reps"]):
            t = self.sqlite_target()
            try:
                r, _ = run_child({"system": "agentsaga-sqlite", "op": "steps", "target": t, "n": self.plan["steps_n"],
                                  "extra": {**self.extra, "effect": True}})
                vals.append(r["ms_per_step"])
            except ChildError as exc:
                return None, str(exc)[-300:]
            finally:
                remove_sqlite(t["path"])
        return summary(vals), None

    def state_copy(self) -> dict:
        """Issue 14, case 10: each step is shown a deep copy of the state. Per step with a ~10 KB nested
        state that no step changes, against the tiny counter state in the same repetition, and the
        copy itself (``copy_json`` of that state, in this process). Both runs with ``synchronous=OFF``, so
        the difference is CPU, not fsync noise."""
        from _sys_agentsaga import nested_doc

        from orchestrator.engine.steps import copy_json

        doc = {"n": 0, "pad": "", "target": 1, "doc": nested_doc(STATE_KB)}
        reps = max(200, self.plan["steps_n"])
        t0 = time.perf_counter()
        for _ in range(reps):
            copy_json(doc)
        copy_us = (time.perf_counter() - t0) * 1e6 / reps
        vals: dict[str, list[float]] = {"tiny": [], "big": [], "extra": []}
        for _ in range(self.plan["reps"]):
            pair = []
            for kb in (0, STATE_KB):
                t = self.sqlite_target()
                try:
                    # synchronous=OFF: an fsync (milliseconds, and noisy) would drown the copy's CPU cost.
                    r, _ = run_child({"system": "agentsaga-sqlite", "op": "steps", "target": t,
                                      "n": self.plan["steps_n"],
                                      "extra": {**self.extra, "state_kb": kb,
                                                "store_options": {"sqlite_synchronous": "OFF"}}})
                    pair.append(r["ms_per_step"])
                except ChildError as exc:
                    self.errors["state_copy"] = str(exc)
                finally:
                    remove_sqlite(t["path"])
            if len(pair) == 2:
                vals["tiny"].append(pair[0])
                vals["big"].append(pair[1])
                vals["extra"].append(pair[1] - pair[0])
        out = {k: summary(v) for k, v in vals.items()}
        out["copy_us"] = copy_us
        out["state_bytes"] = len(json.dumps(doc))
        return out

    def bytes(self) -> dict | None:
        t = self.sqlite_target()
        try:
            r, _ = self.child("agentsaga-sqlite", "bytes", t, n=self.plan["bytes_n"])
            return r
        except ChildError as exc:
            self.errors["bytes"] = str(exc)
            return None
        finally:
            remove_sqlite(t["path"])

    def resume(self, completed: int) -> dict | None:
        n = completed + self.plan["tail"]
        golden = self.sqlite_target()
        ledger = golden["path"] + ".ledger"
        try:
            run_child({"system": "agentsaga-sqlite", "op": "crash", "target": golden, "n": n, "kill_at": completed + 1,
                       "run_id": "crash", "ledger": ledger, "extra": self.extra}, expect_kill=True)
        except ChildError as exc:
            self.errors[f"crash_{completed}"] = str(exc)
            return None
        rows = []
        for _ in range(self.plan["reps"]):
            t = self.sqlite_target()
            for suffix in ("", "-wal"):
                if os.path.exists(golden["path"] + suffix):
                    shutil.copyfile(golden["path"] + suffix, t["path"] + suffix)
            try:
                r, t_spawn = self.child("agentsaga-sqlite", "resume", t, n=n, run_id="crash")
                if r["t_first_wall"] is None or not r["final_ok"]:
                    raise ChildError(f"resume ran no new step or ended wrong: {r}")
                rows.append({"resume_ms": r["resume_ms"], "proc_ms": (r["t_first_wall"] - t_spawn) * 1000,
                             "interp_ms": (r["t_main"] - t_spawn) * 1000,
                             "import_ms": (r["t_open_wall"] - r["t_main"]) * 1000,
                             "executed": r["executed"]})
            except ChildError as exc:
                self.errors[f"resume_{completed}"] = str(exc)
            finally:
                remove_sqlite(t["path"])
        remove_sqlite(golden["path"])
        if not rows:
            return None
        out = {k: summary([r[k] for r in rows]) for k in ("resume_ms", "proc_ms", "interp_ms", "import_ms")}
        # A completed step executed again would show as more than the tail being executed.
        out["re_executed"] = max(r["executed"] for r in rows) - self.plan["tail"]
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: one repetition, small counts")
    ap.add_argument("--reps", type=int, help="repetitions (default 11)")
    ap.add_argument("--snapshot-every", type=int, help="pass snapshot_every=N to Orchestrator (default: engine's)")
    args = ap.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    if args.reps:
        plan["reps"] = args.reps
    extra = {} if args.snapshot_every is None else {"snapshot_every": args.snapshot_every}

    missing = check_import(REQUIRES["_sys_agentsaga"])
    workdir = tempfile.mkdtemp(prefix="agentsaga-core-")
    core = Core(plan, extra, workdir)
    t0 = time.time()
    steps: dict = {}
    effect, effect_reason = None, None
    by = None
    copying: dict | None = None
    resumes: dict = {}
    try:
        steps = core.steps() if not missing else {
            "floor_sqlite": summary([sqlite_floor_once(os.path.join(workdir, "floor.db"), plan["floor_n"])]),
            "floor_sqlite_1stmt": summary([sqlite_floor_once(os.path.join(workdir, "floor.db"), plan["floor_n"],
                                                             single=True)]),
            "floor_pg": None if core.pg_reason else summary([pg_floor_once(core.pg, plan["floor_n"])]),
            "floor_pg_1stmt": None if core.pg_reason else summary(
                [pg_floor_once(core.pg, plan["floor_n"], single=True)]),
            "sqlite": None, "pg": None}
        if not missing:
            effect, effect_reason = core.effect_steps()
            by = core.bytes()
            copying = core.state_copy()
            for point in plan["resume_points"]:
                resumes[point] = core.resume(point)
                print(f"  resume after {point} done", file=sys.stderr, flush=True)
    finally:
        core.schemas.close()
        shutil.rmtree(workdir, ignore_errors=True)

    r1k, r10k = resumes.get(plan["resume_points"][0]), resumes.get(plan["resume_points"][-1])
    out = {
        "sqlite_ms_per_step": med(steps.get("sqlite")),
        "sqlite_floor_ms": med(steps.get("floor_sqlite")),
        "sqlite_ratio": med(steps.get("ratio_sqlite")),
        "pg_ms_per_step": med(steps.get("pg")),
        "pg_floor_ms": med(steps.get("floor_pg")),
        "pg_ratio": med(steps.get("ratio_pg")),
        # The stricter floor: one INSERT that is its own transaction (what the store's append issues).
        "sqlite_floor_1stmt_ms": med(steps.get("floor_sqlite_1stmt")),
        "sqlite_ratio_1stmt": med(steps.get("ratio_sqlite_1stmt")),
        "pg_floor_1stmt_ms": med(steps.get("floor_pg_1stmt")),
        "pg_ratio_1stmt": med(steps.get("ratio_pg_1stmt")),
        "bytes_per_step": by["bytes_per_step"] if by else None,
        "resume_ms_1k": med(r1k["resume_ms"]) if r1k else None,
        "resume_ms_10k": med(r10k["resume_ms"]) if r10k else None,
        "resume_proc_ms_1k": med(r1k["proc_ms"]) if r1k else None,
        "resume_proc_ms_10k": med(r10k["proc_ms"]) if r10k else None,
        "resume_re_executed": max(r["re_executed"] for r in resumes.values() if r) if any(resumes.values()) else None,
        "sqlite_effect_ms_per_step": med(effect),
        "state_copy_us": copying["copy_us"] if copying else None,
        "sqlite_ms_per_step_10kb_state": med(copying["big"]) if copying else None,
        "sqlite_extra_ms_per_step_10kb_state": med(copying["extra"]) if copying else None,
    }
    # An effect step pays two commits (the intent, then the result): its ratio to the same floor.
    floor_sqlite = out.get("sqlite_floor_ms")
    out["sqlite_effect_ratio"] = (out["sqlite_effect_ms_per_step"] / floor_sqlite
                                  if out["sqlite_effect_ms_per_step"] and floor_sqlite else None)
    if core.pg_reason:
        out["pg_reason"] = core.pg_reason
    if effect is None:
        out["sqlite_effect_reason"] = effect_reason or missing
    if missing:
        out["agentsaga_reason"] = f"engine not importable: {missing}"

    pg_ok = not core.pg_reason
    rows = [
        ["sqlite floor (BEGIN; INSERT; COMMIT)", fmt_summary(steps.get("floor_sqlite")), "ms", ""],
        ["sqlite floor, 1 autocommit INSERT", fmt_summary(steps.get("floor_sqlite_1stmt")), "ms", ""],
        ["agentsaga sqlite, per step", fmt_summary(steps.get("sqlite")), "ms", ""],
        ["  sqlite_ratio (per-rep pairs)", fmt_summary(steps.get("ratio_sqlite"), 2), "x",
         f"<= {TARGETS['sqlite_ratio']}"],
        ["  vs 1-INSERT floor", fmt_summary(steps.get("ratio_sqlite_1stmt"), 2), "x", ""],
        ["postgres floor (INSERT; commit())", fmt_summary(steps.get("floor_pg")) if pg_ok else "-", "ms", ""],
        ["postgres floor, 1 autocommit INSERT", fmt_summary(steps.get("floor_pg_1stmt")) if pg_ok else "-", "ms", ""],
        ["agentsaga postgres, per step", fmt_summary(steps.get("pg")) if pg_ok else "-", "ms", ""],
        ["  pg_ratio (per-rep pairs)", fmt_summary(steps.get("ratio_pg"), 2), "x", f"<= {TARGETS['pg_ratio']}"],
        ["  vs 1-INSERT floor", fmt_summary(steps.get("ratio_pg_1stmt"), 2), "x", ""],
        ["agentsaga sqlite, effect step", fmt_summary(effect), "ms", ""],
        ["  sqlite_effect_ratio (2 commits)",
         f"{out['sqlite_effect_ratio']:.2f}" if out.get("sqlite_effect_ratio") else "n/a", "x", ""],
        ["bytes_per_step (sqlite)", fmt_num(out["bytes_per_step"], 0), "B", f"<= {TARGETS['bytes_per_step']}"],
        [f"agentsaga sqlite sync=OFF, step, ~{STATE_KB} KB state", fmt_summary(copying["big"] if copying else None),
         "ms", ""],
        ["  same repetition, tiny state", fmt_summary(copying["tiny"] if copying else None), "ms", ""],
        ["  extra per step for the state", fmt_summary(copying["extra"] if copying else None), "ms", ""],
        [f"  copy_json of that state ({copying['state_bytes'] if copying else '-'} B)",
         fmt_num(copying["copy_us"], 1) if copying else "-", "us", ""],
    ]
    for point, label in zip(plan["resume_points"], ("1k", "10k")):
        r = resumes.get(point)
        rows.append([f"resume after {point}: Orchestrator()->step", fmt_summary(r["resume_ms"] if r else None, 2), "ms",
                     f"<= {TARGETS['resume_ms_10k_abs']:.0f} and <= {TARGETS['resume_growth']:.0f}x 1k"
                     if label == "10k" else ""])
        proc = "-"
        if r:
            split = f"{fmt_num(med(r['interp_ms']), 0)}+{fmt_num(med(r['import_ms']), 0)}"
            proc = f"{fmt_summary(r['proc_ms'], 1)} ({split})"
        rows.append(["  process start->step (interp+imports)", proc, "ms", ""])
    print(f"agentsaga core benchmark ({'quick' if args.quick else 'full'}; median (min-max) of {plan['reps']})")
    print(table(["measure", "value", "unit", "target"], rows))
    if core.pg_reason:
        print(f"postgres: {core.pg_reason}")
    if effect is None:
        print(f"effect steps: {out['sqlite_effect_reason']}")
    for k, v in core.errors.items():
        print(f"error in {k}: {v[:300]}")
    print(f"(total {time.time() - t0:.0f} s)")
    out.update(quick=args.quick, plan=plan, extra=extra, errors=core.errors,
               detail={"steps": steps, "effect": effect, "bytes": by, "state_copy": copying,
                       "resume": {str(k): v for k, v in resumes.items()}},
               machine=machine(core.pg, core.pg_reason))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
