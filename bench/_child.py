"""One measurement in a fresh process: ``python bench/_child.py '<json spec>'``.

Prints one JSON object as its last stdout line. Operations (``spec["op"]``):
- ``steps``: one run of ``n`` steps; ms per step (the run call only, not opening the database).
- ``many``: ``count`` runs of ``n`` steps one after another; runs per second.
- ``bytes``: database bytes before and after one run of ``n`` steps, on a database that already
  holds one finished 200-step run (SQLite: file + WAL after a TRUNCATE checkpoint; Postgres: every
  table of the run's schema with indexes and TOAST).
- ``crash``: a run of ``n`` steps with a hook that SIGKILLs the process when step ``kill_at``
  begins; it never prints (the parent checks it died by SIGKILL).
- ``resume``: opens the database anew and resumes ``run_id``; reports when the first new step
  began (wall clock, for the parent's process-start measurement, and in-process from the start of
  opening the engine), the final state, and how many steps this process executed.
"""

import time

T_MAIN = time.time()  # before any import that costs: separates interpreter start from imports

import json  # noqa: E402
import sys  # noqa: E402

import _hooks  # noqa: E402
from _floor import pg_schema_bytes, sqlite_bytes  # noqa: E402
from _systems import make_system  # noqa: E402


def db_bytes(target: dict) -> int:
    if "path" in target:
        return sqlite_bytes(target["path"])
    return pg_schema_bytes(target["url"], target["schema"])


def main() -> dict:
    spec = json.loads(sys.argv[1])
    op = spec["op"]
    _hooks.set_pad(spec.get("pad", 40))
    target = spec["target"]
    system = make_system(spec["system"], target, spec.get("extra"))
    out: dict = {"op": op, "system": spec["system"], "t_main": T_MAIN}
    n = spec.get("n", 1000)
    run_id = spec.get("run_id", "bench-run")

    if op in ("crash", "resume"):
        _hooks.HOOK = _hooks.Hook(kill_at=spec.get("kill_at"), ledger=spec.get("ledger"))

    if op != "resume":
        system.prepare()
    t_open_wall = time.time()
    t_open = time.perf_counter()
    system.open()
    t_opened = time.perf_counter()
    out["open_ms"] = (t_opened - t_open) * 1000
    out["config"] = system.describe()

    if op == "steps":
        t0 = time.perf_counter()
        final = system.run(run_id, n)
        dt = time.perf_counter() - t0
        out["ms_per_step"] = dt * 1000 / n
        out["final_ok"] = final["n"] == n
    elif op == "many":
        count = spec["count"]
        t0 = time.perf_counter()
        ok = True
        for i in range(count):
            ok &= system.run(f"{run_id}-{i}", n)["n"] == n
        dt = time.perf_counter() - t0
        out["wf_per_s"] = count / dt
        out["ms_per_step"] = dt * 1000 / (count * n)
        out["final_ok"] = ok
    elif op == "bytes":
        # A finished 200-step run first, so every table and index already has its first pages
        # and Postgres has created each table's free-space map (a 24 KB fork, made once a heap
        # passes 4 pages), as in any database in use: the growth is then what the N steps cost.
        system.run(run_id + "-warm", 200)
        system.close()
        before = db_bytes(target)
        system.open()
        final = system.run(run_id, n)
        system.close()
        after = db_bytes(target)
        out.update(bytes_before=before, bytes_after=after, bytes_per_step=(after - before) / n,
                   final_ok=final["n"] == n)
        return out
    elif op == "crash":
        system.run(run_id, n)
        out["error"] = "the run finished: the kill hook never fired"
    elif op == "resume":
        final = system.resume(run_id)
        hook = _hooks.HOOK
        out["t_open_wall"] = t_open_wall
        out["t_first_wall"] = hook.first_wall
        out["resume_ms"] = None if hook.first_perf is None else (hook.first_perf - t_open) * 1000
        out["executed"] = hook.executed
        out["final_n"] = final["n"]
        out["final_ok"] = final["n"] == n and final.get("pad") == _hooks.PAD
    else:
        raise SystemExit(f"unknown op {op!r}")
    system.close()
    return out


if __name__ == "__main__":
    result = main()
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
