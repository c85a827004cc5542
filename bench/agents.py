"""Many agents at once (issue 13): N concurrent runs x 8 steps, each step one call to a model server.

    python bench/agents.py            # full: N = 10, 100, 1,000; 3 repetitions; SQLite and Postgres
    python bench/agents.py --quick    # smoke: N = 10; one repetition; short conversation
    python bench/agents.py --n 1000 --reps 1 --ops floor,plain   # a slice

The model is a fake OpenAI-compatible server in a process of its own (``_model_server.py``): each
call waits 50 ms on 127.0.0.1 and answers about 1 KB. Every measurement runs in a fresh process
(``_agents_child.py``) that starts N runs at once in one event loop and times them to the last:

- ``floor``: the same N x 8 calls with no engine (an asyncio task per run, each with one keep-alive
  connection of its own: ``_agents_child.RawClient``);
- ``plain``: an agentsaga workflow of 8 async steps, each making its call with a client it holds;
- ``durable``: the same call made through ``ctx.adurable_call`` (the reply journaled before the step
  goes on, as a model call must be to be paid once): the engine's share of a journaled call, the
  floor for ``llm``;
- ``llm``: the same through the project's own ``AsyncLLM`` (each call a journaled durable call).

After each measurement the server's ledger is read: every (run, step) must have been called exactly
once. Also measured: the per-step cost of one run whose state grows by a ~2 KB message per step
(mean of the first and of the last 100 steps), the takeover of a SIGKILLed worker's runs, and the
start-up of ``agentsaga --help`` / ``--version`` / ``runs`` and ``import orchestrator`` next to
``python -c pass``. Ratios are to the floor measured in the same run. The last stdout line is one
JSON object; Postgres numbers are null with ``pg_reason`` when the server cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from _floor import (
    PgSchemas,
    mask,
    pg_unavailable,
    pg_url,
    remove_sqlite,
    summary,
    with_search_path,
)
from _report import HERE, child_env, fmt_num, fmt_summary, machine, table, tail

# lease: seconds, the takeover measurement's lease (short, so the measurement is short; shorter still
# in the smoke run, where the takeover is only shown to happen and be timed)
FULL = {"ns": [10, 100, 1000], "steps": 8, "reps": 3, "conversation": 1000, "startup_reps": 7, "lease": 2.0}
QUICK = {"ns": [10], "steps": 8, "reps": 1, "conversation": 40, "startup_reps": 1, "lease": 1.0}
TARGETS = {"plain_ratio_sqlite": 2.0, "plain_ratio_pg": 2.5, "llm_vs_plain": 1.3, "conversation_growth": 1.10,
           "takeover_over_lease": 0.5}
OPS = ("floor", "plain", "durable", "llm")
CHILD = os.path.join(HERE, "_agents_child.py")
SERVER = os.path.join(HERE, "_model_server.py")
HANG = 1800.0  # seconds one measurement may take before it counts as hung


class ModelServer:
    """The fake model server's process; ``url`` ends in /v1."""

    def __init__(self, delay_ms: float = 50.0) -> None:
        self.proc = subprocess.Popen([sys.executable, SERVER, str(delay_ms)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=child_env(), cwd=HERE)
        line = self.proc.stdout.readline()  # blocks until it listens (or dies)
        if not line.startswith("READY "):
            self.close()
            raise RuntimeError(f"model server did not start: {line!r} {self.proc.stderr.read()[-500:]}")
        self.base = f"http://127.0.0.1:{int(line.split()[1])}"
        self.url = self.base + "/v1"

    def _call(self, method: str, path: str) -> dict:
        req = urllib.request.Request(self.base + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        self._call("POST", "/reset")

    def ledger(self) -> dict:
        return self._call("GET", "/ledger")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def child(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, CHILD, json.dumps(spec)], check=False, capture_output=True, text=True,
                          timeout=HANG, env=child_env(), cwd=HERE)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['op']} exit {proc.returncode}: {tail(proc)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def exactly_once(op: str, ledger: dict, n: int, steps: int) -> str | None:
    """None when every (run, step) was called once and nothing else was; else what differs."""
    prefix = "floor" if op == "floor" else f"{op}-"
    expected = {f"run={prefix}{r} step=s{i}" for r in range(n) for i in range(steps)}
    calls = ledger["calls"]
    missing = sorted(expected - calls.keys())
    twice = sorted(t for t, c in calls.items() if c != 1)
    extra = sorted(calls.keys() - expected)
    if missing or twice or extra:
        return f"missing {len(missing)} {missing[:3]}, repeated {len(twice)} {twice[:3]}, unexpected {len(extra)}"
    return None


class Bench:
    def __init__(self, plan: dict, ops: list[str], backends: list[str], workdir: str) -> None:
        self.plan, self.ops, self.workdir = plan, ops, workdir
        self.pg = pg_url()
        self.pg_reason = pg_unavailable(self.pg) if "pg" in backends else "not requested"
        self.backends = [b for b in backends if b == "sqlite" or not self.pg_reason]
        self.schemas = PgSchemas(self.pg)
        self.errors: dict[str, str] = {}
        self._seq = 0

    def db(self, backend: str) -> str:
        self._seq += 1
        if backend == "sqlite":
            path = os.path.join(self.workdir, f"agents-{self._seq}.db")
            remove_sqlite(path)
            return f"sqlite:///{path}"
        return with_search_path(self.pg, self.schemas.new("agents"))

    # -- N runs at once --------------------------------------------------------------------------
    def concurrent(self, server: ModelServer) -> dict:
        steps = self.plan["steps"]
        out: dict = {}
        for backend in self.backends:
            for n in self.plan["ns"]:
                vals: dict[str, list[float]] = {op: [] for op in self.ops}
                for rep in range(self.plan["reps"]):
                    for op in self.ops:
                        key = f"{backend}/{n}/{op}"
                        if key in self.errors:
                            continue
                        server.reset()
                        spec = {"op": op, "n": n, "steps": steps, "model": server.url}
                        if op != "floor":
                            spec["db"] = self.db(backend)
                        try:
                            res = child(spec)
                        except Exception as exc:  # noqa: BLE001 (recorded and shown; the other numbers still count)
                            self.errors[key] = str(exc)[:400]
                            continue
                        wrong = exactly_once(op, server.ledger(), n, steps)
                        if wrong or res["ok"] != n:
                            self.errors[key] = f"exactly-once: {wrong or ''} completed {res['ok']}/{n}"
                            continue
                        vals[op].append(res["seconds"])
                        print(f"  {key} rep {rep + 1}: {res['seconds']:.3f} s", file=sys.stderr, flush=True)
                out[f"{backend}/{n}"] = {op: summary(v) for op, v in vals.items()}
        return out

    # -- a growing conversation ------------------------------------------------------------------
    def conversation(self) -> dict:
        out: dict = {}
        for backend in self.backends:
            try:
                res = child({"op": "conversation", "steps": self.plan["conversation"], "db": self.db(backend)})
            except Exception as exc:  # noqa: BLE001 (recorded and shown)
                self.errors[f"{backend}/conversation"] = str(exc)[:400]
                out[backend] = None
                continue
            res["growth"] = res["last_ms"] / res["first_ms"]
            out[backend] = res
        return out

    def close(self) -> None:
        self.schemas.close()


# -- start-up --------------------------------------------------------------------------------------
def startup(reps: int, workdir: str) -> dict:
    cli = shutil.which("agentsaga", path=os.path.dirname(sys.executable))
    base = [cli] if cli else [sys.executable, "-c", "import sys; from orchestrator.cli import main; sys.exit(main())"]
    db = f"sqlite:///{os.path.join(workdir, 'startup.db')}"
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import orchestrator": [sys.executable, "-c", "import orchestrator"],
        "agentsaga --help": base + ["--help"],
        "agentsaga --version": base + ["--version"],
        "agentsaga runs": [*base, "--db", db, "runs"],
    }
    made = subprocess.run([sys.executable, "-c", f"from store import open_store; open_store({db!r}).close()"],
                          check=False, capture_output=True, text=True, env=child_env(), cwd=workdir, timeout=120)
    if made.returncode != 0:
        return {"error": tail(made)}
    out: dict = {}
    for name, cmd in commands.items():
        times = []
        for _ in range(reps + 1):  # the first warms the page cache and the bytecode
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=child_env(), cwd=workdir, timeout=120)
            times.append((time.perf_counter() - t0) * 1000)
            if proc.returncode != 0:
                out[name] = {"error": tail(proc)}
                break
        else:
            out[name] = {"ms": statistics.median(times[1:])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: small counts, one repetition")
    ap.add_argument("--n", help="comma-separated run counts (default 10,100,1000)")
    ap.add_argument("--reps", type=int, help="repetitions (default 3)")
    ap.add_argument("--ops", default=",".join(OPS), help="which of floor,plain,durable,llm to measure")
    ap.add_argument("--backends", default="sqlite,pg", help="sqlite,pg")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: concurrent,conversation,takeover,startup")
    args = ap.parse_args()
    plan = dict(QUICK if args.quick else FULL)
    if args.n:
        plan["ns"] = [int(x) for x in args.n.split(",")]
    if args.reps:
        plan["reps"] = args.reps
    ops = [op for op in args.ops.split(",") if op]
    bad = [op for op in ops if op not in OPS]
    if bad:
        ap.error(f"unknown op(s) {bad}; choose from {OPS}")
    skip = set(filter(None, args.skip.split(",")))
    workdir = tempfile.mkdtemp(prefix="agents-bench-")
    bench = Bench(plan, ops, [b for b in args.backends.split(",") if b], workdir)
    server = ModelServer()
    try:
        runs = bench.concurrent(server) if "concurrent" not in skip else {}
        convo = bench.conversation() if "conversation" not in skip else {}
        takeover = measure_takeover(bench, workdir) if "takeover" not in skip else {}
        start = startup(plan["startup_reps"], workdir) if "startup" not in skip else {}
        if "error" in start:
            bench.errors["startup"] = start.pop("error")
    finally:
        server.close()
        bench.close()
        shutil.rmtree(workdir, ignore_errors=True)
    report(plan, bench, runs, convo, takeover, start)


def measure_takeover(bench: Bench, workdir: str) -> dict:
    """Seconds from SIGKILLing a worker process that holds 3 runs mid-step to an idle worker process
    holding all three (each lease expires the plan's ``lease`` seconds after its last renewal, renewed
    one by one), as many times as the plan's repetitions, each on a fresh database: the median, min
    and max (the target is judged on the slowest)."""
    out: dict = {}
    for backend in bench.backends:
        took: list[float] = []
        try:
            for rep in range(bench.plan["reps"]):
                took.append(_takeover_once(bench.db(backend), workdir, f"{backend}-{rep}", bench.plan["lease"]))
                print(f"  {backend}/takeover rep {rep + 1}: {took[-1]:.3f} s", file=sys.stderr, flush=True)
        except Exception as exc:  # noqa: BLE001 (recorded and shown)
            bench.errors[f"{backend}/takeover"] = str(exc)[:400]
        out[backend] = {"lease": bench.plan["lease"], "takeover": summary(took)} if took else None
    return out


def _takeover_once(db: str, workdir: str, tag: str, lease: float) -> float:
    sys.path.insert(0, HERE)
    from _agents_flows import held

    from orchestrator import Orchestrator

    gate = os.path.join(workdir, f"gate-{tag}")
    flows = os.path.join(HERE, "_agents_flows.py") + ":held"
    cmd = [sys.executable, "-m", "orchestrator.cli", "worker", flows, "--db", db, "--lease-ttl", str(lease),
           "--poll", "2"]
    procs: list[subprocess.Popen] = []

    def start(concurrency: int, log: str) -> subprocess.Popen:
        path = os.path.join(workdir, log)
        proc = subprocess.Popen([*cmd, "--concurrency", str(concurrency)], cwd=workdir, env=child_env(),
                                stdout=subprocess.DEVNULL, stderr=open(path, "w"))  # noqa: SIM115 (open as long as the process)
        procs.append(proc)
        wait(lambda: " ready: " in _read(path) or proc.poll() is not None, f"{log} to start")
        if proc.poll() is not None:
            raise RuntimeError(f"{log} exited: {_read(path)[-400:]}")
        return proc

    with Orchestrator(db, workflows=[held]) as orc:
        try:
            ids = [orc.enqueue(held, {"gate": gate}) for _ in range(3)]
            a = start(3, f"worker-a-{tag}.log")
            wait(lambda: all(os.path.exists(f"{gate}.inside.{r}") for r in ids), "runs inside their step")
            owner_a = orc.get_run(ids[0]).lease_owner
            start(4, f"worker-b-{tag}.log")
            t_kill = time.time()
            a.kill()
            a.wait()
            wait(lambda: all(orc.get_run(r).lease_owner not in (None, owner_a) for r in ids), "the takeover",
                 every=0.005)
            took = time.time() - t_kill
            open(gate, "w").close()
            wait(lambda: all(orc.get_run(r).status == "completed" for r in ids), "the runs to complete")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    return took


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def wait(predicate, what: str, every: float = 0.02) -> None:
    deadline = time.monotonic() + 300
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


def _med(s: dict | None) -> float | None:
    return s["median"] if s else None


def report(plan: dict, bench: Bench, runs: dict, convo: dict, takeover: dict, start: dict) -> None:
    rows, ratios = [], {}
    for key, per in runs.items():
        backend, n = key.split("/")
        floor_s = _med(per.get("floor"))
        plain_s, durable_s, llm_s = _med(per.get("plain")), _med(per.get("durable")), _med(per.get("llm"))
        pr = plain_s / floor_s if plain_s and floor_s else None
        lr = llm_s / floor_s if llm_s and floor_s else None
        lp = llm_s / plain_s if llm_s and plain_s else None
        dp = durable_s / plain_s if durable_s and plain_s else None
        ld = llm_s / durable_s if llm_s and durable_s else None
        ratios[key] = {"plain_ratio": pr, "llm_ratio": lr, "llm_vs_plain": lp, "durable_vs_plain": dp,
                       "llm_vs_durable": ld}
        rows.append([backend, n, fmt_summary(per.get("floor")), fmt_summary(per.get("plain")),
                     fmt_num(pr, 2), fmt_summary(per.get("durable")), fmt_num(dp, 2), fmt_summary(per.get("llm")),
                     fmt_num(lr, 2), fmt_num(lp, 2), fmt_num(ld, 2)])
    if rows:
        print(f"{plan['steps']} steps per run, one 50 ms model call each; seconds to finish all N runs, "
              f"median (min-max) of {plan['reps']}")
        print(table(["backend", "N", "floor s", "plain s", "plain/floor", "durable s", "durable/plain", "AsyncLLM s",
                     "llm/floor", "llm/plain", "llm/durable"], rows))
    crow = [[b, fmt_num(c["first_ms"]), fmt_num(c["last_ms"]), fmt_num(c["growth"], 2)]
            for b, c in convo.items() if c]
    if crow:
        print(f"\ngrowing conversation, one run of {plan['conversation']} steps (+~2 KB per step), ms per step")
        print(table(["backend", "first 100 ms", "last 100 ms", "last/first"], crow))
    if takeover:
        print("\ntakeover after a worker SIGKILL, seconds from the kill to another worker starting the run, "
              f"median (min-max) of {plan['reps']}")
        print(table(["backend", "lease s", "takeover s", "slowest over lease s"],
                    [[b, fmt_num(t["lease"]), fmt_summary(t["takeover"]), fmt_num(t["takeover"]["max"] - t["lease"])]
                     for b, t in takeover.items() if t]))
    if start:
        base = (start.get("python -c pass") or {}).get("ms")
        print("\nstart-up, ms (median)")
        print(table(["command", "ms", "over python -c pass"],
                    [[name, fmt_num(v.get("ms")), fmt_num(v["ms"] - base) if v.get("ms") and base else
                      v.get("error", "-")] for name, v in start.items()]))
    if bench.errors:
        print("\nerrors:")
        for key, err in bench.errors.items():
            print(f"  {key}: {err}")
    k1000 = {b: ratios.get(f"{b}/1000") or {} for b in ("sqlite", "pg")}
    targets = {
        "plain_ratio_sqlite_1000": [k1000["sqlite"].get("plain_ratio"), TARGETS["plain_ratio_sqlite"]],
        "plain_ratio_pg_1000": [k1000["pg"].get("plain_ratio"), TARGETS["plain_ratio_pg"]],
        "llm_vs_plain_sqlite_1000": [k1000["sqlite"].get("llm_vs_plain"), TARGETS["llm_vs_plain"]],
        "llm_vs_plain_pg_1000": [k1000["pg"].get("llm_vs_plain"), TARGETS["llm_vs_plain"]],
    }
    for b, c in convo.items():
        targets[f"conversation_growth_{b}"] = [c["growth"] if c else None, TARGETS["conversation_growth"]]
    for b, t in takeover.items():  # the slowest takeover, over the lease
        targets[f"takeover_over_lease_{b}"] = [t["takeover"]["max"] - t["lease"] if t else None,
                                               TARGETS["takeover_over_lease"]]
    out = {
        "runs": runs, "ratios": ratios, "conversation": convo, "takeover": takeover, "startup": start,
        "targets": targets,
        "targets_met": {k: (v is not None and v <= t) for k, (v, t) in targets.items()},
        "pg_reason": bench.pg_reason if bench.pg_reason != "not requested" else None,
        "pg": mask(bench.pg), "plan": plan, "errors": bench.errors,
        "machine": machine(bench.pg, bench.pg_reason),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
