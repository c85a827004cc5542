"""The ``agentsaga`` command line: verbs over the same engine as the library.

``--db URL`` (default: ``AGENTSAGA_DB``, else a SQLite file in the working directory) and
``--debug`` go before or after the verb: ``agentsaga --db URL runs`` and ``agentsaga runs --db URL``
are the same. Errors are one line on stderr and a non-zero exit (1 for a failed operation, 2 for
bad usage); ``--debug`` shows the traceback too. Verbs that print data take ``--json``. A run that
ends failed, compensated, compensation_failed or cancelled is printed on stderr (run, step, error)
and exits 1; a run left waiting for a signal or timer exits 4 (``EXIT_CODES`` below, ``--help``).

Which code runs (invariant 11): verbs that drive runs (resume, recover, cancel, compensate,
rollback, fork, worker) drive only workflows of the app named with ``--app``, ``AGENTSAGA_APP`` or
the project config (``config.py``); ``run`` and ``enqueue`` take the workflow a person names
(``module:attr``, ``file.py:attr``, or a workflow name of the app). Compensations come the same
way: the ``Compensations`` registries at the top level of those modules. A database row never
names code to import. Reading verbs (runs, show, history, verify, report, stats, gc) import nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.cli import version
from orchestrator.payload import codec
from orchestrator.cli.audit import add_audit_verbs
from orchestrator.cli.common import CommandError, UsageError, add_app_flag, add_progress_flag, follow_up, resolve_target
from orchestrator.cli.common import held_message
from orchestrator.cli.common import open_orchestrator as _orchestrator
from orchestrator.cli.common import open_reader
from orchestrator.cli.common import parse_json as _parse_json
from orchestrator.cli.common import parse_object
from orchestrator.cli.common import parse_time as _parse_time
from orchestrator.cli.config import ConfigError
from orchestrator.engine.events import ACTIVE_STATUSES, TERMINAL_STATUSES
from orchestrator.engine.result import FAILED_STATUSES, RunResult
from orchestrator.cli.term import json_line, safe, table, when
from orchestrator.errors import OrchestratorError
from store import LeaseHeldError, RunRecord, StoreError
from workflows import WorkflowError

__all__ = ["main", "build_parser"]


def _result_json(res: RunResult) -> dict[str, Any]:
    state = res.state.model_dump() if hasattr(res.state, "model_dump") else res.state
    out = {"run_id": res.run_id, "workflow": res.workflow, "status": res.status, "seq": res.seq,
           "error": res.error, "failed_step": res.failed_step, "state": json.loads(codec.dumps(state))}
    if res.note:
        out["note"] = res.note
    if res.in_doubt:
        out["in_doubt"] = [dict(d) for d in res.in_doubt]
    return out


def _print_result(res: RunResult, args: argparse.Namespace, *, awaited: Sequence[str] = (),
                  target: str | None = None) -> None:
    """The run's outcome on stdout; a failure, or what a waiting run waits for and the command that
    continues it, on stderr. ``awaited``: the signals it waits for (``_awaited``); ``target``: the
    workflow ``run`` was given as code, which the command to continue it must name (``follow_up``)."""
    as_json = args.json
    if res.status in FAILED_STATUSES:  # on stderr too, so a failure is never lost in the output
        print(f"agentsaga: {safe(res.failure_line())}", file=sys.stderr)
    elif res.status == "waiting" and awaited:
        also = f" (it also waits for {', '.join(map(repr, awaited[1:]))})" if awaited[1:] else ""
        command = follow_up(args, "signal", res.run_id, awaited[0], "--resume", target=target)
        print(f"agentsaga: run {safe(res.run_id)} is waiting for signal {safe(repr(awaited[0]))}{safe(also)}; "
              f"send it with: {safe(command)} (add --data JSON to send a value)", file=sys.stderr)
    elif res.status == "waiting":
        command = follow_up(args, "recover", target=target)
        print(f"agentsaga: run {safe(res.run_id)} is waiting for a timer; a worker continues it when it is due, "
              f"or: {safe(command)}", file=sys.stderr)
    if as_json:
        print(json_line(_result_json(res)))
        return
    print(f"run {safe(res.run_id)}  workflow {safe(res.workflow)}  status {res.status}  events {res.seq}")
    if res.error:
        print(f"error: {safe(res.error)}")
    state = res.state.model_dump() if hasattr(res.state, "model_dump") else res.state
    print("state: " + safe(codec.dumps(state)))
    if res.note:  # read without the workflow's code: say how
        print(f"note: {safe(res.note)}")


EXIT_WAITING = 4
_RUNS_A_RUN = frozenset({"run", "resume", "recover", "rollback", "signal"})
EXIT_CODES = """exit codes:
  0  done (run, resume, rollback, signal --resume: the run completed)
  1  the operation failed, or the run ended failed, compensated, compensation_failed or cancelled
     (run, resume and recover print the run, the failed step and its error on stderr);
     cancel: an effect of the run was left in doubt (stderr names each step and key), or a
     compensation failed (the run is compensation_failed); 0 otherwise
  2  bad usage (unknown option, bad or non-object JSON, unknown --status, a duration without a unit)
  3  verify: the run does not verify
  4  run, resume, rollback, signal --resume: the run is waiting for a signal or a timer"""


def _awaited(orc: Any, res: RunResult) -> list[str]:
    """The signals a waiting run waits for (none when it waits for a timer), as its journal says:
    the waits of the steps still waiting that no signal has answered yet."""
    if res.status != "waiting":
        return []
    names: list[str] = []
    for x in orc.summary(res.run_id).executions:
        if x.outcome != "waiting":
            continue
        # a wait is the n-th for its name in the step execution (``index``, absent for the first); one
        # that timed out is answered too (the step was told)
        answered = {(e["data"].get("name"), e["data"].get("index") or 0) for e in x.extra
                    if e["kind"] in ("SignalReceived", "WaitTimedOut")}
        names += [e["data"]["name"] for e in x.extra if e["kind"] == "WaitStarted"
                  and (e["data"].get("name"), e["data"].get("index") or 0) not in answered]
    return list(dict.fromkeys(names))


def _exit_code(res: RunResult) -> int:
    if res.status == "completed":
        return 0
    return EXIT_WAITING if res.status == "waiting" else 1


# -- verbs ---------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    wf, others, registries = resolve_target(args)
    if args.input_file:
        try:
            with open(args.input_file, encoding="utf-8") as fh:
                payload = parse_object(fh.read(), f"--input-file {args.input_file!r}")
        except OSError as exc:
            raise UsageError(f"cannot read --input-file {args.input_file!r}: {exc.strerror}") from None
    else:
        payload = parse_object(args.input, "--input") if args.input else {}
    # A workflow given as code is no app the next command finds by itself: its hints name it.
    code = None if any(wf is o for o in others) else args.target
    with _orchestrator(args, [wf, *[o for o in others if o is not wf]], compensations=registries) as orc:
        try:
            res = orc.run(wf, payload, run_id=args.run_id)
        except LeaseHeldError as held:  # the run id exists, and a live process drives that run
            raise CommandError(held_message(args, held, target=code)) from None
        awaited = _awaited(orc, res)
    _print_result(res, args, awaited=awaited, target=code)
    return _exit_code(res)


def cmd_resume(args: argparse.Namespace) -> int:
    with _orchestrator(args, app=True, existing=True) as orc:
        res = orc.resume(args.run_id, allow_graph_change=args.allow_graph_change or None)
        awaited = _awaited(orc, res)
    _print_result(res, args, awaited=awaited)
    return _exit_code(res)


def cmd_recover(args: argparse.Namespace) -> int:
    with _orchestrator(args, app=True) as orc:
        if not orc.workflows.names():  # it could only take leases it must give back
            raise UsageError("recover needs the workflows it may drive: name their module with --app MODULE, "
                             "AGENTSAGA_APP or app = \"...\" in agentsaga.toml")
        results = orc.recover(limit=args.limit)
        # Nothing recovered: say which unfinished runs are still leased (a process killed a moment
        # ago keeps its lease until it expires), or `runs` would list them running, unexplained.
        nothing = None if results or args.json else _nothing_to_recover(args, orc)
    if args.json:
        for res in results:
            print(json_line(_result_json(res)))
    elif nothing is not None:
        print(nothing)
    else:
        print(table(["RUN", "WORKFLOW", "STATUS", "EVENTS", "ERROR"],
                    [[r.run_id, r.workflow, r.status, r.seq, r.error or ""] for r in results]))
    failed = [r for r in results if r.status in FAILED_STATUSES or (r.error and r.status != "completed")]
    for r in failed:  # on stderr too, like `run`: a failure is never lost in the table
        line = r.failure_line() if r.status in FAILED_STATUSES else f"run {r.run_id!r} not recovered: {r.error}"
        print(f"agentsaga: {safe(line)}", file=sys.stderr)
    return 1 if failed else 0  # runs that recovered and now wait for a signal or timer are fine


def _nothing_to_recover(args: argparse.Namespace, orc: Any) -> str:
    """What ``recover`` says when it recovered nothing: that there is nothing to recover, or how many
    unfinished runs are still leased, until when the first lease runs, and what to do about them: a
    live owner keeps its run, so wait for the lease (then ``recover``) or take the run over now
    (``resume``); an owner known to be gone (a process of this machine that no longer exists, as
    after a SIGKILL) is said to be gone."""
    from orchestrator.engine.core import owner_is_dead  # the rule ``resume`` takes a run over by

    now = orc.engine.config.clock()  # the clock recover claims by
    leased = sorted((rec for rec in orc.store.list_runs(status=ACTIVE_STATUSES, limit=None)
                     if rec.lease_owner and rec.lease_expires_at is not None and rec.lease_expires_at > now),
                    key=lambda rec: (rec.lease_expires_at, rec.run_id))
    if not leased:
        return "no interrupted runs to recover"
    one = len(leased) == 1
    first = leased[0]
    named = ", ".join(rec.run_id for rec in leased[:3]) + (", ..." if len(leased) > 3 else "")
    # " until <UTC time> (in Ns)", worded as the engine words a held lease
    until = LeaseHeldError("", owner=first.lease_owner, expires_at=first.lease_expires_at).until(now)
    out = (f"no interrupted runs to recover now; 1 run ({named}) is still leased{until}" if one else
           f"no interrupted runs to recover now; {len(leased)} runs ({named}) are still leased, the first{until}")
    resume = follow_up(args, "resume", first.run_id if one else "RUN")
    gone = [rec.run_id for rec in leased if owner_is_dead(rec.lease_owner)]
    if one and gone:
        out += (f": its owner {first.lease_owner!r} is no longer running on this machine; take the run over now "
                f"with `{resume}`")
    else:
        out += (f": {'its owner' if one else 'their owners'} may be alive; run `{follow_up(args, 'recover')}` "
                f"after that, or `{resume}` to take {'it' if one else 'one'} over now")
        if gone:
            out += (f" ({', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''}: owner no longer running on this "
                    "machine)")
    return safe(out)


def cmd_cancel(args: argparse.Namespace) -> int:
    with _orchestrator(args, app=True, existing=True) as orc:
        res = orc.cancel(args.run_id, reason=args.reason, compensate=args.compensate)
    _print_result(res, args)  # the stderr line names each effect left in doubt, and its key
    # Something of the run stands that was meant to be undone: an effect in doubt, or a compensation
    # that failed (the run is compensation_failed, as `compensate` reports it).
    return 1 if res.in_doubt or res.status == "compensation_failed" else 0


def cmd_signal(args: argparse.Namespace) -> int:
    payload = _parse_json(args.data, "--data") if args.data is not None else None
    if args.resume:
        with _orchestrator(args, app=True, existing=True) as orc:
            res = orc.signal(args.run_id, args.name, payload, resume=True)
            assert res is not None
            awaited = _awaited(orc, res) if not res.note else []
        if res.note:  # a live process drives the run: the signal was only delivered
            print(f"{safe(res.note)}; run {safe(res.run_id)} is {res.status}")
            return 0
        _print_result(res, args, awaited=awaited)
        return _exit_code(res)
    with _orchestrator(args, existing=True) as orc:
        orc.signal(args.run_id, args.name, payload)
    if args.json:
        print(json_line({"run_id": args.run_id, "signal": args.name, "delivered": True, "resumed": False}))
        return 0
    print(f"signal {safe(args.name)!s} delivered to run {safe(args.run_id)}; a worker continues it, or: "
          f"{safe(follow_up(args, 'recover'))} (or send the signal with --resume to continue the run here)")
    return 0


def cmd_compensate(args: argparse.Namespace) -> int:
    with _orchestrator(args, app=True, existing=True) as orc:
        res = orc.compensate(args.run_id)
    _print_result(res, args)
    return 0 if res.status == "compensated" else 1


def cmd_rollback(args: argparse.Namespace) -> int:
    to: int | str = int(args.to) if args.to.isdigit() else args.to
    payload = parse_object(args.input, "--input") if args.input else None  # merged into the checkpoint's state
    with _orchestrator(args, app=True, existing=True) as orc:
        res = orc.rollback(args.run_id, to=to, input=payload, next_step=args.next)
        awaited = _awaited(orc, res)
    _print_result(res, args, awaited=awaited)
    return _exit_code(res)


def _run_json(rec: RunRecord) -> dict[str, Any]:
    return {
        "run_id": rec.run_id, "workflow": rec.workflow, "version": rec.version, "status": rec.status,
        "created_at": rec.created_at, "updated_at": rec.updated_at, "finished_at": rec.finished_at,
        "error": rec.error, "parent_run_id": rec.parent_run_id, "lease_owner": rec.lease_owner,
        "lease_expires_at": rec.lease_expires_at,
    }


#: Every status a run can have (``dead``: moved aside after too many failed recoveries).
RUN_STATUSES = (*ACTIVE_STATUSES, *sorted(TERMINAL_STATUSES), "dead")


def cmd_runs(args: argparse.Namespace) -> int:
    status = [s.strip() for part in args.status for s in part.split(",") if s.strip()] if args.status else None
    unknown = [s for s in status or () if s not in RUN_STATUSES]
    if unknown:
        raise UsageError(f"--status {', '.join(map(repr, unknown))} is not a run status; valid statuses: "
                         + ", ".join(RUN_STATUSES))
    since, until = _parse_time(args.since), _parse_time(args.until)
    with open_reader(args) as orc:
        runs = orc.list_runs(status=status, workflow=args.workflow, since=since, until=until, limit=args.limit,
                             offset=args.offset)
    if args.json:
        for rec in runs:
            print(json_line(_run_json(rec)))
        return 0
    if not runs:
        print("no runs")
        return 0
    rows = []
    for rec in runs:
        took = "-"
        if rec.finished_at is not None:
            took = f"{rec.finished_at - rec.created_at:.2f}s"
        rows.append([rec.run_id, rec.workflow, rec.version, rec.status, when(rec.created_at), took, rec.error or ""])
    print(table(["RUN", "WORKFLOW", "VER", "STATUS", "CREATED (UTC)", "TOOK", "ERROR"], rows))
    return 0


# -- parser --------------------------------------------------------------------------------------
def _db_url(text: str) -> str:
    """``--db``'s value: an empty one is a mistake (an unset variable in a script), not the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a database URL (sqlite:///agentsaga.db, postgresql://...), "
                                         "or leave --db out for $AGENTSAGA_DB, else sqlite:///agentsaga.db")
    return text


def _global_options(*, at_verb: bool) -> argparse.ArgumentParser:
    """``--db`` and ``--debug``, accepted before the verb and after it. After it their defaults are
    SUPPRESS: a sub-parser writes its defaults over the namespace the main parser filled, so a
    default there would erase ``agentsaga --db URL VERB``'s URL."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--db", metavar="URL", type=_db_url, default=argparse.SUPPRESS if at_verb else None,
                         help="database URL (default: $AGENTSAGA_DB, else sqlite:///agentsaga.db)")
    options.add_argument("--debug", action="store_true", default=argparse.SUPPRESS if at_verb else False,
                         help="show tracebacks on errors")
    return options


def build_parser() -> argparse.ArgumentParser:
    at_verb = _global_options(at_verb=True)
    parser = argparse.ArgumentParser(prog="agentsaga", description="Durable, auditable agent runs.",
                                     parents=[_global_options(at_verb=False)], epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"agentsaga {version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True

    def verb(name: str, func: Callable[[argparse.Namespace], int], help: str, json_flag: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[at_verb],
                           epilog=EXIT_CODES if name in _RUNS_A_RUN else None,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if json_flag:
            p.add_argument("--json", action="store_true", help="print data as JSON")
        p.set_defaults(func=func)
        return p

    p = verb("run", cmd_run, "start a workflow run and drive it to the end")
    p.add_argument("target", help="the workflow: module:attr, path/to/file.py:attr, or a workflow name of the app")
    add_app_flag(p)
    p.add_argument("--input", metavar="JSON", help="the run's input as a JSON object")
    p.add_argument("--input-file", metavar="FILE", help="read the input JSON from a file")
    p.add_argument("--run-id", metavar="ID", help="choose the run id (a second run with it continues the first)")
    add_progress_flag(p)

    p = verb("resume", cmd_resume, "continue an interrupted run now (takes its lease over)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--allow-graph-change", action="store_true", help="continue even if the workflow graph changed")
    add_app_flag(p)
    add_progress_flag(p)

    p = verb("recover", cmd_recover, "resume every interrupted run whose lease has expired")
    p.add_argument("--limit", type=int, default=None, help="recover at most N runs")
    add_app_flag(p)
    add_progress_flag(p)

    p = verb("cancel", cmd_cancel, "cancel a run that has not finished")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--reason", default=None)
    p.add_argument("--compensate", action="store_true",
                   help="undo the run's completed effects first (an effect in flight is listed in doubt, "
                        "never re-sent)")
    add_app_flag(p)
    add_progress_flag(p)

    p = verb("signal", cmd_signal, "send a signal (e.g. a human's approval) to a run; with --resume also "
             "continue the run here when no worker is driving it")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--data", metavar="JSON", help="the signal's data as JSON")
    p.add_argument("--resume", action="store_true",
                   help="also drive the run in this process until it ends or waits again (needs --app); if a "
                        "worker holds the run, the signal is only delivered and the worker continues it. "
                        "Without --resume a worker (or `agentsaga recover`) continues the run")
    add_app_flag(p)
    add_progress_flag(p)

    p = verb("compensate", cmd_compensate, "retry the remaining compensations of a compensation_failed run")
    p.add_argument("run_id", metavar="RUN")
    add_app_flag(p)
    add_progress_flag(p)

    p = verb("rollback", cmd_rollback, "undo the effects after a checkpoint and continue the run from it")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--to", required=True, help="a journal seq at a tick boundary, or a step name")
    p.add_argument("--input", metavar="JSON", help="merged into the checkpoint's state")
    p.add_argument("--next", metavar="STEP", help="force the step the run continues with")
    add_app_flag(p)
    add_progress_flag(p)

    p = verb("runs", cmd_runs, "list runs, newest first")
    p.add_argument("--status", action="append",
                   help="filter by status (repeat or comma-separate): " + ", ".join(RUN_STATUSES))
    p.add_argument("--workflow", help="filter by workflow name")
    p.add_argument("--since", metavar="TIME", help="created at or after (ISO 8601, UTC if no zone)")
    p.add_argument("--until", metavar="TIME", help="created before (ISO 8601)")
    from orchestrator.cli.audit import whole_number  # counts a database can bind: a usage error else
    p.add_argument("--limit", type=whole_number(1), default=50, metavar="N", help="at most N runs (default 50)")
    p.add_argument("--offset", type=whole_number(0), default=0, metavar="N",
                   help="skip the N newest matching runs (paging)")

    add_audit_verbs(verb)
    from orchestrator.cli.ops import add_ops_verbs; add_ops_verbs(sub, verb)  # noqa: E702 worker, enqueue, stats, retry
    from orchestrator.cli.demo import add_demo_verb; add_demo_verb(sub, verb)  # noqa: E702 the offline demo
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (UsageError, ConfigError) as exc:
        print(f"agentsaga: error: {safe(exc)}", file=sys.stderr)
        return 2
    except (OrchestratorError, StoreError, WorkflowError, CommandError) as exc:
        if args.debug:
            traceback.print_exc()
        # A live process holds the run: its hints name this invocation's --app and --db (the
        # engine's message names the library call and a bare command that would find neither).
        text = held_message(args, exc) if isinstance(exc, LeaseHeldError) and exc.owner else exc
        print(f"agentsaga: error: {safe(text)}", file=sys.stderr)
        return 1
    except UnicodeEncodeError as exc:
        # An argument holding bytes that are not UTF-8 (the shell passes them as lone surrogates):
        # no database can store or look up such text.
        if args.debug:
            traceback.print_exc()
        bad = exc.object[exc.start:exc.end] if isinstance(exc.object, str) else ""
        print(f"agentsaga: error: an argument is not valid UTF-8 text (it holds {bad!a}); "
              "run ids, names and data must be text", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentsaga: interrupted; the run can be resumed", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`agentsaga history RUN | head`): stop quietly. stdout is pointed
        # at /dev/null so the interpreter's final flush does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
