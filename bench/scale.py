"""Scale-out on Postgres: throughput with 1, 2 and 4 workers, claim latency, recovery after a kill,
an idle worker's CPU, and DBOS's queue on the same Postgres in the same run.

    python bench/scale.py            # the full run (a few minutes on 2 cores)
    python bench/scale.py --quick    # a smoke run: small counts (under a minute)

Every worker is a real ``agentsaga worker`` process (DBOS: a process that launched DBOS), each
configuration on a fresh schema. How each number is made:

- **throughput**: N runs of a ten-step workflow are enqueued and held back, k workers start and
  report ready, then the runs are released at once; runs/s = N / (last run finished - release),
  so neither enqueueing nor start-up is timed. DBOS the same way: enqueued by a ``DBOSClient``
  with a delay that outlasts its workers' launch, timed from the first dequeue
  (``started_at_epoch_ms``) to the last ``updated_at``. Where the time goes: CPU seconds of the
  workers and of the Postgres server over the drain, against the drain time times the cores.
- **claim latency**: one idle worker; runs enqueued one at a time 100 ms apart; the time from a
  run's ``created_at`` to its ``Resumed`` event (NOTIFY, claim, restore, first commit).
- **recovery**: worker A (lease L s) drives runs of thirty 0.1 s steps, worker B waits idle; A is
  SIGKILLed; the time until each of A's runs has its next event (B's ``Resumed``). Target: <= L + 1.
- **idle CPU**: CPU seconds one worker with nothing to do uses over 10 s (1.5 s in --quick, scaled).

Prints the tables, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _floor import PgSchemas, mask, pg_unavailable, pg_url, with_search_path  # noqa: E402
from _report import ROOT, child_env, fmt_num, machine, table  # noqa: E402

FULL = {"workers": [1, 2, 4], "runs": 2000, "dbos_workers": [1, 2, 4], "dbos_runs": 400, "concurrency": 8,
        "latency_runs": 30, "recovery_runs": 4, "lease": 2.0, "idle_s": 10.0, "dbos_hold": 6.0}
# (quick: DBOS's one worker process needs no hold for others to launch; its drain is timed from its
# first dequeue whenever that is, so the hold is left at the 2 s a process launches in)
QUICK = {"workers": [1, 2], "runs": 120, "dbos_workers": [1], "dbos_runs": 60, "concurrency": 8,
         "latency_runs": 5, "recovery_runs": 1, "lease": 2.0, "idle_s": 1.5, "dbos_hold": 0.0}
TEN = "bench/_scale_flows.py:ten"
SLEEPY = "bench/_scale_flows.py:sleepy"
TICK = os.sysconf("SC_CLK_TCK")


# -- processes ------------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` has stopped (SIGSTOP takes effect after kill() returns)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as fh:
                states.append(fh.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


def postgres_cpu() -> float:
    """CPU seconds of every process named postgres (the server and its backends), dead ones excluded."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as fh:
                    if fh.read().strip() == "postgres":
                        total += cpu_seconds(int(pid))
            except OSError:
                continue
    return total


class Workers:
    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[subprocess.Popen, str]] = []

    def start(self, url: str, target: str, *args: str) -> subprocess.Popen:
        log = os.path.join(self.log_dir, f"worker-{len(self.procs)}.log")
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "worker", target, "--db", url,
                                 "--log-level", "WARNING", *args], cwd=ROOT, env=child_env(),
                                stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        self.procs.append((proc, log))
        return proc

    def start_dbos(self, url: str, schema: str, concurrency: int) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_scale_dbos.py"), "worker", url, schema,
                                 str(concurrency)], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        self.procs.append((proc, ""))
        return proc

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


def wait_until(predicate, timeout: float, what: str, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


# -- agentsaga ----------------------------------------------------------------------------------------
def one(conn, sql: str, params=()):
    return conn.execute(sql, params).fetchone()


def throughput(base: str, schemas: PgSchemas, k: int, cfg: dict, log_dir: str) -> dict:
    """N runs enqueued and held back (``wake_at`` far ahead), k workers started and ready, then all
    runs released in one UPDATE: its NOTIFY wakes every worker at once, so start-up is not timed."""
    import psycopg

    from orchestrator import Orchestrator
    from orchestrator.engine.loader import load_target

    schema = schemas.new(f"scale{k}")
    url = with_search_path(base, schema)
    ten = load_target(TEN)
    n = cfg["runs"]
    with Orchestrator(url, workflows=[ten]) as orc:
        for _ in range(n):
            orc.enqueue(ten, {})
    workers = Workers(log_dir)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE agentsaga_runs SET wake_at = 1e18")
            procs = [workers.start(url, TEN, "--concurrency", str(cfg["concurrency"]), "--log-level", "INFO")
                     for _ in range(k)]
            for (proc, log) in workers.procs:
                wait_until(lambda: " ready: " in open(log).read() or proc.poll() is not None, 120, "a worker")
            time.sleep(0.5)  # LISTEN connections up
            cpu0, pg0 = sum(cpu_seconds(p.pid) for p in procs), postgres_cpu()
            released = time.time()
            conn.execute("UPDATE agentsaga_runs SET wake_at = NULL")
            count = "SELECT COUNT(*) FROM agentsaga_runs WHERE status = 'completed'"
            wait_until(lambda: one(conn, count)[0] == n, timeout=600, what=f"{n} runs with {k} workers", every=0.05)
            worker_cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
            pg_cpu = postgres_cpu() - pg0
            last = one(conn, "SELECT MAX(finished_at) FROM agentsaga_runs")[0]
            owners = one(conn, "SELECT COUNT(DISTINCT data::json->>'owner') FROM agentsaga_events WHERE kind = 'Resumed'")[0]
    finally:
        workers.stop()
        schemas.drop(schema)
    drain = last - released
    return {"workers": k, "runs": n, "drain_s": round(drain, 3), "runs_per_s": round(n / drain, 1),
            "steps_per_s": round(10 * n / drain, 1), "worker_cpu_s": round(worker_cpu, 2),
            "postgres_cpu_s": round(pg_cpu, 2), "cpu_busy": round((worker_cpu + pg_cpu) / (drain * (os.cpu_count() or 1)), 2),
            "workers_that_drove_runs": owners}


def claim_latency(base: str, schemas: PgSchemas, cfg: dict, log_dir: str) -> dict:
    from orchestrator import Orchestrator
    from orchestrator.engine.loader import load_target

    schema = schemas.new("latency")
    url = with_search_path(base, schema)
    ten = load_target(TEN)
    workers = Workers(log_dir)
    proc = workers.start(url, TEN, "--concurrency", "4", "--log-level", "INFO")
    log = workers.procs[-1][1]
    try:
        wait_until(lambda: " ready: " in open(log).read() or proc.poll() is not None, 120, "the worker")
        time.sleep(0.5)  # let its LISTEN connection settle
        lat = []
        with Orchestrator(url, workflows=[ten]) as orc:
            for _ in range(cfg["latency_runs"]):
                run_id = orc.enqueue(ten, {})
                wait_until(lambda: orc.get_run(run_id).status == "completed", 120, "a run")
                created = orc.get_run(run_id).created_at
                resumed = next(e["at"] for e in orc.history(run_id) if e["kind"] == "Resumed")
                lat.append((resumed - created) * 1000)
                time.sleep(0.1)
    finally:
        workers.stop()
        schemas.drop(schema)
    lat.sort()
    return {"n": len(lat), "p50_ms": round(lat[len(lat) // 2], 2), "p90_ms": round(lat[int(len(lat) * 0.9)], 2),
            "max_ms": round(lat[-1], 2)}


def recovery(base: str, schemas: PgSchemas, cfg: dict, log_dir: str) -> dict:
    from orchestrator import Orchestrator
    from orchestrator.engine.loader import load_target

    schema = schemas.new("recovery")
    url = with_search_path(base, schema)
    sleepy = load_target(SLEEPY)
    lease = cfg["lease"]
    workers = Workers(log_dir)
    args = ("--concurrency", str(cfg["recovery_runs"]), "--lease-ttl", str(lease), "--log-level", "INFO")
    try:
        with Orchestrator(url, workflows=[sleepy]) as orc:
            # B starts first and is frozen once ready, so A alone claims the runs; B starting after
            # A had claimed them raced A's runs (on a loaded machine A could finish them all before
            # B was ready, leaving nothing to recover)
            b = workers.start(url, SLEEPY, *args)
            log_b = workers.procs[-1][1]
            wait_until(lambda: " ready: " in open(log_b).read() or b.poll() is not None, 120, "worker B")
            b.send_signal(signal.SIGSTOP)
            wait_until(lambda: stopped(b.pid), 120, "worker B to stop")
            a = workers.start(url, SLEEPY, *args)
            ids = [orc.enqueue(sleepy, {}) for _ in range(cfg["recovery_runs"])]
            wait_until(lambda: all(orc.get_run(r).lease_owner for r in ids), 120, "A to claim every run")
            wait_until(lambda: all(any(e["kind"] == "StepCompleted" for e in orc.history(r)) for r in ids), 120,
                       "A to be a few steps into each run")
            b.send_signal(signal.SIGCONT)
            a.send_signal(signal.SIGKILL)
            killed = time.time()
            a.wait()
            wait_until(lambda: all(orc.get_run(r).status == "completed" for r in ids), 300, "B to finish the runs")
            # Each run A left unfinished has a next event (B's Resumed); one A finished just before
            # the kill has none, and is not a recovery to time
            after = [[e["at"] for e in orc.history(r) if e["at"] > killed] for r in ids]
            delays = [events[0] - killed for events in after if events]
            if not delays:
                raise RuntimeError("A had finished every run when it was killed: no recovery to time")
    finally:
        workers.stop()
        schemas.drop(schema)
    return {"runs": len(delays), "lease_s": lease, "max_s": round(max(delays), 3), "min_s": round(min(delays), 3),
            "target_s": lease + 1.0, "met": max(delays) <= lease + 1.0}


def idle_cpu(base: str, schemas: PgSchemas, cfg: dict, log_dir: str) -> dict:
    schema = schemas.new("idle")
    url = with_search_path(base, schema)
    from orchestrator import Orchestrator

    Orchestrator(url).close()  # create the schema before the worker starts
    workers = Workers(log_dir)
    proc = workers.start(url, TEN, "--concurrency", "8", "--log-level", "INFO")
    log = workers.procs[-1][1]
    try:
        wait_until(lambda: " ready: " in open(log).read() or proc.poll() is not None, 120, "the worker")
        time.sleep(1.0)
        before = cpu_seconds(proc.pid)
        time.sleep(cfg["idle_s"])
        used = cpu_seconds(proc.pid) - before
    finally:
        workers.stop()
        schemas.drop(schema)
    return {"window_s": cfg["idle_s"], "cpu_s": round(used, 3), "cpu_s_per_10s": round(used * 10 / cfg["idle_s"], 3)}


# -- DBOS ------------------------------------------------------------------------------------------------
def dbos_throughput(base: str, schemas: PgSchemas, k: int, cfg: dict, log_dir: str) -> dict:
    """The same drain for DBOS: workflows enqueued by a client with a delay long enough for k
    processes to launch (the plan's ``dbos_hold`` seconds plus 2 per process), so they too start
    dequeueing together; timed from the first dequeue."""
    import psycopg

    schema = schemas.new(f"dbos{k}")
    workers = Workers(log_dir)
    n = cfg["dbos_runs"]
    try:
        first = workers.start_dbos(base, schema, cfg["concurrency"])  # creates DBOS's tables
        assert first.stdout.readline().strip() == "ready"
        workers.stop()
        subprocess.run([sys.executable, os.path.join(HERE, "_scale_dbos.py"), "enqueue", base, schema, str(n),
                        str(cfg["dbos_hold"] + 2 * k)], cwd=ROOT, env=child_env(), check=True, capture_output=True, timeout=600)
        procs = [workers.start_dbos(base, schema, cfg["concurrency"]) for _ in range(k)]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        cpu0, pg0 = sum(cpu_seconds(p.pid) for p in procs), postgres_cpu()
        with psycopg.connect(base, autocommit=True) as conn:
            count = f'SELECT COUNT(*) FROM "{schema}".workflow_status WHERE status = \'SUCCESS\''
            wait_until(lambda: one(conn, count)[0] == n, timeout=900, what=f"DBOS with {k} workers", every=0.05)
            worker_cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
            pg_cpu = postgres_cpu() - pg0
            lo, hi = one(conn, f'SELECT MIN(started_at_epoch_ms), MAX(updated_at) FROM "{schema}".workflow_status')
    finally:
        workers.stop()
        schemas.drop(schema)
    drain = (hi - lo) / 1000.0
    return {"workers": k, "runs": n, "drain_s": round(drain, 3), "runs_per_s": round(n / drain, 1),
            "steps_per_s": round(10 * n / drain, 1), "worker_cpu_s": round(worker_cpu, 2),
            "postgres_cpu_s": round(pg_cpu, 2)}


def dbos_missing() -> str | None:
    try:
        import dbos  # noqa: F401  (only whether it imports)
    except ImportError as exc:
        return f"dbos not installed ({exc}); pip install -e '.[bench]'"
    return None


# -- main -----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    base = pg_url()
    out: dict = {"quick": args.quick, "config": cfg, "errors": {}, "throughput": {}, "dbos": {}}
    reason = pg_unavailable(base)
    out["machine"] = machine(None if reason else base, reason)
    if reason:
        out["pg_reason"] = reason
        print(f"Postgres unavailable at {mask(base)}: {reason}")
        print(json.dumps(out))
        return 0
    import tempfile

    log_dir = tempfile.mkdtemp(prefix="agentsaga-scale-")
    schemas = PgSchemas(base)
    try:
        for k in cfg["workers"]:
            try:
                out["throughput"][str(k)] = throughput(base, schemas, k, cfg, log_dir)
            except Exception as exc:
                out["errors"][f"throughput_{k}"] = f"{type(exc).__name__}: {exc}"
        missing = dbos_missing()
        if missing:
            out["dbos_reason"] = missing
        else:
            for k in cfg["dbos_workers"]:
                try:
                    out["dbos"][str(k)] = dbos_throughput(base, schemas, k, cfg, log_dir)
                except Exception as exc:
                    out["errors"][f"dbos_{k}"] = f"{type(exc).__name__}: {exc}"
        for name, fn in (("claim_latency", claim_latency), ("recovery", recovery), ("idle_cpu", idle_cpu)):
            try:
                out[name] = fn(base, schemas, cfg, log_dir)
            except Exception as exc:
                out["errors"][name] = f"{type(exc).__name__}: {exc}"
    finally:
        schemas.close()
    out["logs"] = log_dir
    report(out)
    print(json.dumps(out))
    return 0


def report(out: dict) -> None:
    rows = []
    for who, results in (("agentsaga", out["throughput"]), ("dbos", out["dbos"])):
        for k, r in results.items():
            rows.append([who, k, r["runs"], fmt_num(r["runs_per_s"]), fmt_num(r["steps_per_s"]), fmt_num(r["drain_s"]),
                         fmt_num(r["worker_cpu_s"]), fmt_num(r["postgres_cpu_s"])])
    print("Throughput: ten-step workflows on Postgres (drain of a pre-filled queue)")
    print(table(["ENGINE", "WORKERS", "RUNS", "RUNS/S", "STEPS/S", "DRAIN S", "WORKER CPU S", "PG CPU S"], rows))
    ratios = {}
    for k, r in out["throughput"].items():
        best_dbos = max((d["runs_per_s"] for d in out["dbos"].values()), default=None)
        if best_dbos:
            ratios[k] = round(r["runs_per_s"] / best_dbos, 1)
    out["ratio_vs_best_dbos"] = ratios
    lat, rec, idle = out.get("claim_latency"), out.get("recovery"), out.get("idle_cpu")
    print()
    print(table(["MEASURE", "VALUE", "TARGET"], [
        ["agentsaga / best DBOS (runs/s, by agentsaga workers)", json.dumps(ratios), ">= 5x"],
        ["claim latency p50 / p90 / max (ms)",
         f"{lat['p50_ms']} / {lat['p90_ms']} / {lat['max_ms']}" if lat else "-", "-"],
        ["recovery after SIGKILL, max over runs (s)", f"{rec['max_s']} (lease {rec['lease_s']})" if rec else "-",
         f"<= {rec['target_s']}" if rec else "-"],
        ["idle worker CPU per 10 s (s)", f"{idle['cpu_s_per_10s']}" if idle else "-", "~0"],
    ]))
    out["targets"] = {
        "throughput_5x_dbos": bool(ratios) and max(ratios.values()) >= 5.0,
        "recovery_within_lease_plus_1s": bool(rec and rec["met"]),
    }
    if out["errors"]:
        print("\nerrors: " + json.dumps(out["errors"]))


if __name__ == "__main__":
    sys.exit(main())
