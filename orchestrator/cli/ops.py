"""The CLI's operations verbs: ``worker``, ``enqueue``, ``stats`` and ``retry``.

    agentsaga worker mypkg.agents --concurrency 8 --queue default --queue urgent
    agentsaga enqueue research --input '{"question": "..."}' --queue urgent --dedup-key q-42
    agentsaga stats [--json]
    agentsaga runs --status dead        # (the runs verb) then:  agentsaga retry RUN

``worker`` drives runs of the workflows of the app it is given: positional modules or files
(``mypkg.agents``, ``flows.py``, either with ``:attr``), ``--app``, else ``AGENTSAGA_APP``, else
the project config (``config.py``); the ``Compensations`` registries at the top level of the app's
modules undo their effects. A run of any other workflow is left for a worker that has it;
a worker is never told by the database what to import (invariant 11). It runs until SIGTERM or
SIGINT, then stops claiming, lets in-flight runs finish for ``--drain`` seconds, hands the rest back
and exits 0; either signal while it is still starting (importing, opening the database) ends
start-up and exits 0 too (``cli/stopping.py``). Bad settings (a limit of 0, a malformed rate, an
unknown option, no app anywhere) are exit 2 before anything starts.

``stats`` only reads: it imports nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from orchestrator.cli.stopping import hand_to
from orchestrator.cli.common import (
    UsageError,
    add_app_flag,
    app_compensations,
    app_workflows,
    open_orchestrator,
    open_reader,
    parse_object,
    project_config,
    resolve_target,
)
from orchestrator.scale.deadletter import DEFAULT_MAX_FAILURES
from orchestrator.scale.limits import Limits, QueueLimit, parse_count, parse_rate
from orchestrator.audit.stats import Stats
from orchestrator.cli.term import json_line, safe, table
from orchestrator.errors import ConfigurationError

__all__ = ["add_ops_verbs"]

Verb = Callable[..., argparse.ArgumentParser]


def _limits(args: argparse.Namespace) -> Limits:
    try:
        per_queue: dict[str, dict[str, Any]] = {}
        for text in args.queue_concurrency or ():
            name, n = parse_count(text, "--queue-concurrency")
            per_queue.setdefault(name, {})["concurrency"] = n
        for text in args.worker_concurrency or ():
            name, n = parse_count(text, "--worker-concurrency")
            per_queue.setdefault(name, {})["worker_concurrency"] = n
        for text in args.rate or ():
            name, rate = parse_rate(text, "--rate")
            per_queue.setdefault(name, {})["rate"] = rate
        tools = dict(parse_count(text, "--tool-limit") for text in args.tool_limit or ())
        return Limits(queues={q: QueueLimit(**kw) for q, kw in per_queue.items()}, tools=tools)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None


def cmd_worker(args: argparse.Namespace) -> int:
    from orchestrator.scale.worker import Worker

    limits = _limits(args)
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per tool call drowns what matters
    args.app = [*(args.targets or ()), *(args.app or ())]
    workflows = app_workflows(args)
    if not workflows:
        raise UsageError("a worker needs the workflows it may drive: name their module (agentsaga worker "
                         "mypkg.agents), or set AGENTSAGA_APP, or app = \"...\" in agentsaga.toml")
    config = project_config(args)
    compensations = app_compensations(args)
    try:
        worker = Worker(args.db, workflows, compensations=compensations, concurrency=args.concurrency,
                        queues=args.queue or None, lease_ttl=args.lease_ttl, heartbeat=args.heartbeat,
                        poll=args.poll, limits=limits, max_failures=args.max_failures, drain=args.drain,
                        hand_back_grace=args.hand_back_grace,
                        tracing=args.otel, redact=config.redact_patterns, redact_fields=config.redact_fields)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    # From here SIGTERM / SIGINT stop the worker in order rather than end start-up (cli/stopping.py),
    # with no moment between the two where a signal would kill the process
    worker.run(install_signals=not hand_to(worker.stop))
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    wf = resolve_target(args).workflow  # only queued here: the worker that drives the run brings its code
    payload = parse_object(args.input, "--input") if args.input else {}
    with open_orchestrator(args, [wf]) as orc:
        try:
            run_id = orc.enqueue(wf, payload, queue=args.queue, priority=args.priority, dedup_key=args.dedup_key,
                                 run_id=args.run_id)
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
        rec = orc.get_run(run_id)
    if args.json:
        print(json_line({"run_id": run_id, "status": rec.status, "queue": rec.queue, "priority": rec.priority,
                         "dedup_key": rec.dedup_key}))
    else:
        print(run_id)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with open_reader(args) as orc:
        stats = orc.stats(runs=args.runs)
    print(json_line(stats.to_json()) if args.json else format_stats(stats))
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    with open_orchestrator(args, existing=True) as orc:
        status = orc.retry_dead(args.run_id)
    if args.json:
        print(json_line({"run_id": args.run_id, "status": status}))
    else:
        print(f"run {safe(args.run_id)} is {status} again; a worker will pick it up")
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def add_ops_verbs(sub: Any, verb: Verb) -> None:
    """Register the verbs with ``build_parser``'s ``verb`` helper (``sub`` is its subparsers object)."""
    p = verb("worker", cmd_worker, "claim runs and drive them until SIGTERM (scale out: run several)",
             json_flag=False)
    p.add_argument("targets", nargs="*", metavar="APP",
                   help="the app: modules or files whose workflows this worker drives (module, file.py, or either "
                        "with :attr); default: --app, $AGENTSAGA_APP, else app in agentsaga.toml")
    add_app_flag(p)
    p.add_argument("--concurrency", type=_positive_int, default=4, help="runs driven at once (default 4)")
    p.add_argument("--queue", action="append", metavar="Q", help="serve only this queue (repeat; default: all)")
    p.add_argument("--lease-ttl", type=_seconds, default=None, metavar="S", help="lease length (default 30)")
    p.add_argument("--heartbeat", type=_seconds, default=None, metavar="S",
                   help="lease renewal interval (default lease-ttl/3)")
    p.add_argument("--poll", type=_seconds, default=2.0, metavar="S",
                   help="longest idle wait between looks without NOTIFY (default 2)")
    p.add_argument("--drain", type=float, default=20.0, metavar="S",
                   help="on SIGTERM, seconds in-flight runs may take before being handed back (default 20)")
    p.add_argument("--hand-back-grace", type=float, default=5.0, metavar="S",
                   help="then, seconds a sync step still running may take to end before its run is abandoned "
                        "with its lease kept until it expires (default 5)")
    p.add_argument("--max-failures", type=int, default=DEFAULT_MAX_FAILURES, metavar="N",
                   help=f"failed recoveries before a run goes dead (default {DEFAULT_MAX_FAILURES})")
    p.add_argument("--queue-concurrency", action="append", metavar="Q=N",
                   help="at most N runs of queue Q in flight across all workers")
    p.add_argument("--worker-concurrency", action="append", metavar="Q=N",
                   help="at most N runs of queue Q in flight in this worker")
    p.add_argument("--rate", action="append", metavar="Q=N/PERIOD",
                   help="at most N runs of queue Q started per period (e.g. emails=100/60s)")
    p.add_argument("--tool-limit", action="append", metavar="NAME=N",
                   help="at most N calls in flight to tool NAME (a breaker name: host, host:port) across workers")
    p.add_argument("--otel", action="store_true", help="OpenTelemetry spans per run and step (agentsaga[otel])")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    p = verb("enqueue", cmd_enqueue, "put a run on a queue for workers (prints its run id)")
    p.add_argument("target", help="the workflow: module:attr, path/to/file.py:attr, or a workflow name of the app")
    add_app_flag(p)
    p.add_argument("--input", metavar="JSON", help="the run's input as a JSON object")
    p.add_argument("--queue", default="default", help="queue name (default: default)")
    p.add_argument("--priority", type=int, default=0, help="higher runs first (default 0)")
    p.add_argument("--dedup-key", metavar="KEY", help="start at most once per key: a repeat prints the first run's id")
    p.add_argument("--run-id", metavar="ID", help="choose the run id (a repeat prints it and starts nothing)")

    p = verb("stats", cmd_stats, "runs by status, queue depths, recoveries, step latency percentiles")
    p.add_argument("--runs", type=_positive_int, default=500, metavar="N",
                   help="step latency over the newest N runs (default 500)")

    p = verb("retry", cmd_retry, "put a dead run back for workers (its failure count starts over)")
    p.add_argument("run_id", metavar="RUN")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def format_stats(s: Stats) -> str:
    out = ["RUNS BY STATUS"]
    out.append(table(["STATUS", "RUNS"], [[k, v] for k, v in s.by_status.items()]) if s.by_status else "no runs")
    out += ["", "QUEUES (active runs)"]
    if s.queues:
        out.append(table(["QUEUE", "READY", "IN FLIGHT", "PARKED", "STALE LEASES"],
                         [[safe(q["queue"]) if q["queue"] is not None else "-", q["ready"], q["in_flight"],
                           q["parked"], q["stale"]] for q in s.queues]))
    else:
        out.append("no active runs")
    f = s.failures
    out += ["", f"RECOVERIES  runs recovered {s.recovered_runs}  lease takeovers {s.recoveries}  "
                f"failed recoveries {f.get('error', 0)}  moved to dead {f.get('dead', 0)}  retried {f.get('retried', 0)}"]
    st = s.steps
    out += ["", f"STEP LATENCY (ms, last {s.latency_runs} runs, {st['count']} steps)  p50 {_ms(st['p50'])}  "
                f"p90 {_ms(st['p90'])}  p99 {_ms(st['p99'])}  max {_ms(st['max'])}"]
    if s.by_step:
        out.append(table(["STEP", "COUNT", "P50", "P90", "P99", "MAX"],
                         [[safe(name), v["count"], _ms(v["p50"]), _ms(v["p90"]), _ms(v["p99"]), _ms(v["max"])]
                          for name, v in s.by_step.items()]))
    out += ["", f"CHECKPOINTS (snapshots held; recoveries of the last {s.latency_runs} runs)"]
    if s.checkpoints:
        rows = []
        for name, c in s.checkpoints.items():
            held = ", ".join(f"{t} {v['count']}" for t, v in sorted(c["snapshots"].items())) or "-"
            rate = "-" if c["recovery_success_rate"] is None else f"{c['recovery_success_rate']:.0%}"
            rep = c["replayed"]
            rows.append([safe(name), held, f"{c['snapshot_bytes']:,}", c["verification_failures"], c["recoveries"],
                         rate, "-" if rep["mean"] is None else f"{rep['mean']} / {rep['max']}"])
        out.append(table(["WORKFLOW", "SNAPSHOTS BY TRIGGER", "BYTES", "BAD", "RECOVERIES", "SUCCESS",
                          "REPLAYED MEAN / MAX"], rows))
    else:
        out.append("no snapshots or recoveries")
    return "\n".join(out)
