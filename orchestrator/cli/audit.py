"""The CLI's audit verbs: ``show``, ``history``, ``verify``, ``snapshots``, ``savepoint``, ``restore``,
``fork``, ``report`` and ``gc``.

Every string that comes from a journal goes through ``safe`` (or ``json_line`` for ``--json``)
before it reaches the terminal: an LLM's output can hold escape sequences that would rewrite it.
Exit codes: 0 done, 1 the operation failed (unknown run, unwritable file, ...), 2 bad usage, and 3
for ``verify`` when the run does not verify (so a script can tell "it lies" from "I could not
look").

``show``, ``history``, ``verify``, ``report`` and ``gc`` import no code, not even a configured
app (invariant 11): a run's state is read from its newest verified snapshot and the events after
it, and ``show`` says how it was read. Only ``fork`` loads the app (it starts a run, and may
drive it with ``--run``).

The verbs that read a database (all but ``restore``, ``retention`` and ``fork``) open it with
``common.open_reader``: the store's ``create=False``, so a database that is not an agentsaga database,
or needs a migration, is refused naming it and left exactly as it was (invariant 10).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from orchestrator._orchestrator import Orchestrator
from orchestrator.payload import codec
from orchestrator.cli.common import (
    CommandError,
    UsageError,
    add_app_flag,
    add_progress_flag,
    app_workflows,
    follow_up,
    open_orchestrator,
    open_reader,
    parse_duration,
    parse_size,
    signing_key,
)
from orchestrator.audit.describe import details, headline
from orchestrator.audit.summary import RunSummary
from orchestrator.cli.term import clip, json_line, safe, table, when
from orchestrator.engine.context import position_parts
from orchestrator.errors import SavepointError

__all__ = ["add_audit_verbs", "VERIFY_FAILED", "whole_number"]

VERIFY_FAILED = 3
Verb = Callable[..., argparse.ArgumentParser]

#: The largest integer a database stores or binds (signed 64-bit): the top of every count and seq flag.
MAX_INT = 2**63 - 1


def whole_number(low: int) -> Callable[[str], int]:
    """An argparse ``type`` for a count or seq flag: an integer in ``low..2**63-1``. Outside it,
    argparse reports a usage error (exit 2) naming the flag and the range, instead of the database
    failing on a number it cannot bind, or reading -1 as "no limit"."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {low}..2**63-1, got {text!r}") from None
        if not low <= value <= MAX_INT:
            raise argparse.ArgumentTypeError(f"must be in {low}..2**63-1 ({low}..{MAX_INT}), got {text}")
        return value

    return parse


def _plain(value: Any) -> Any:
    """Decoded journal values (datetimes, sets...) back to JSON data, tagged as in the journal."""
    return json.loads(codec.dumps(value))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _by_position(calls: list[Any]) -> list[dict[str, Any]]:
    """An execution's journaled calls: its durable calls ordered by position (``1``, ``1.0``, ``1.1``,
    ``2``), then the HTTP requests that were no durable call, in journal order. A position the
    journal repeats (a replaced call, a call that failed and was made again) keeps its journal
    order, and one that is not a position at all (a damaged event) goes last rather than failing
    the read."""
    def order(call: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
        if "index" not in call:
            return 2, ()
        try:
            return 0, position_parts(call["index"])
        except (TypeError, ValueError):
            return 1, ()

    return sorted((c for c in calls if isinstance(c, dict) and "seq" in c), key=order)


def call_outcome(call: dict[str, Any], width: int = 90) -> str:
    """A call's outcome in a few words: ``ok`` (with an HTTP status), or ``failed`` and its error."""
    status = call.get("status")
    status_text = f" {status}" if isinstance(status, int) else ""
    if call.get("outcome") != "failed":
        return f"ok{status_text}"
    error = call.get("error") if isinstance(call.get("error"), dict) else {}
    kind = str(error.get("type") or "error").rsplit(".", 1)[-1]
    text = f"failed{status_text}: {kind}: {error.get('message') or ''}".rstrip(": ")
    return text if len(text) <= width else text[: width - 1] + "…"


# -- show ------------------------------------------------------------------------------------------
def cmd_show(args: argparse.Namespace) -> int:
    with open_reader(args) as orc:
        s = orc.summary(args.run_id)
    if args.json:
        print(json_line(_plain(s.to_json())))
        return 0
    recover = follow_up(args, "recover") if s.lease_owner else ""  # named only while a lease is held
    print("\n".join(_show_lines(s, limit=None if args.all else args.steps, recover=recover)))
    return 0


def _show_lines(s: RunSummary, *, limit: int | None, recover: str = "agentsaga recover") -> list[str]:
    took = "-" if s.duration is None else f"{s.duration:.3f}s"
    out = [
        f"run {safe(s.run_id)}  {s.status}",
        f"workflow {safe(s.workflow)}  version {safe(s.version)}  graph {s.fingerprint[:12]}",
        f"created {when(s.created_at)} UTC  finished {when(s.finished_at)}{' UTC' if s.finished_at else ''}"
        f"  took {took}{'' if s.finished_at else ' so far'}  in steps {s.step_ms / 1000:.3f}s",
        f"events {s.events}  step executions {len(s.executions)}  retries {s.retries}  effects {len(s.effects)}"
        f"  snapshots {len([n for n in s.snapshots if not n.get('rejected')])}",
    ]
    if s.parent:
        p = s.parent
        out.append(f"forked from {safe(p.get('run_id'))}" + (f" at step {safe(p.get('step'))} (seq {p.get('seq')})"
                                                             if p.get("step") else ""))
    if s.lease_owner:
        until = s.lease_expires_at
        lapsed = until is not None and until <= time.time()  # display only: the store decides
        out.append(f"lease held by {safe(s.lease_owner)} until {when(until)} UTC"
                   + (f" (expired: `{safe(recover)}` will take the run over)" if lapsed else ""))
    if s.error:
        out.append(f"error: {safe(s.error)}")
    if s.failure:
        out.append(f"cause: {_cause_line(s.failure)}")
    for e in s.effects:
        if e["status"] == "in doubt":
            out.append(f"in doubt: effect {safe(e['step'])} with key {safe(e['key'])} may have taken effect "
                       f"({safe(e.get('reason'))}); look it up at its service")
    for f in s.earlier_failures:  # history: the run went back past them (a rollback)
        out.append(f"before the rollback at seq {f['rolled_back_at']}: {_cause_line(f)}")
    executions = s.executions
    shown = executions if limit is None else executions[-limit:] if limit > 0 else []
    out += ["", f"STEPS ({len(executions)} executions)"]
    if len(shown) < len(executions):
        out.append(f"... {len(executions) - len(shown)} earlier executions (show --all lists them)")
    if shown:
        rows = [[x.index, x.first_seq if x.seq == x.first_seq else f"{x.first_seq}-{x.seq}", x.tick, x.step,
                 x.outcome, x.attempts, _ms(x.ms), _outcome_detail(x)] for x in shown]
        out.append(table(["#", "SEQ", "TICK", "STEP", "OUTCOME", "ATTEMPTS", "MS", "NEXT / ERROR"], rows))
    calls = [(x, c) for x in shown for c in _by_position(x.calls)]
    if calls:
        # The durable calls (model requests, tool calls, HTTP) journaled by the executions shown, each
        # execution's in the order of their positions: a call made inside another one ("1.0", a
        # model call of a tool) right under it, indented, although it was journaled before it.
        failed = sum(1 for _, c in calls if c.get("outcome") == "failed")
        out += ["", f"CALLS ({len(calls)} journaled{f', {failed} failed' if failed else ''})"]
        rows = [[c["seq"], x.step, "  " * int(c.get("depth") or 0) + str(c.get("index", "-")),
                 c.get("type") or "call", c.get("name") or c.get("url") or "", _ms(c.get("ms")), call_outcome(c),
                 ", ".join(_call_flags(c))] for x, c in calls]
        out.append(table(["SEQ", "STEP", "#", "KIND", "NAME", "MS", "OUTCOME", ""], rows))
    if s.effects:
        out += ["", "EFFECTS AND COMPENSATIONS"]
        rows = [[e["seq"], e["step"], e["key"], effect_status(e), e["attempts"], e["undone_seq"] or "-"]
                for e in s.effects]
        out.append(table(["SEQ", "STEP", "KEY", "COMPENSATION", "ATTEMPTS", "UNDONE AT"], rows))
    undo_calls = s.compensation_calls
    if undo_calls:
        # The requests compensations made: journaled with the compensation's attempt, not as any
        # step's calls, so listed apart, each under the step whose effect it undid.
        failed = sum(1 for c in undo_calls if c.get("outcome") == "failed")
        out += ["", f"CALLS BY COMPENSATIONS ({len(undo_calls)} journaled{f', {failed} failed' if failed else ''})"]
        rows = [[c["seq"], f"compensation of {c.get('compensation_of')}", c.get("attempt") or "-",
                 *request_line(c), c.get("idempotency_key") or "-",
                 _ms(c["ms"] if isinstance(c.get("ms"), (int, float)) else None),
                 call_outcome(c) if c.get("outcome") != "unknown" else "unknown",
                 ", ".join([*_call_flags(c, durable=False), *(["attempt failed"] if c.get("undo") == "failed" else [])])]
                for c in undo_calls]
        out.append(table(["SEQ", "MADE BY", "ATTEMPT", "METHOD", "URL", "IDEMPOTENCY KEY", "MS", "OUTCOME", ""], rows,
                         max_width=160))
    out += ["", "SNAPSHOTS"]
    snaps = [n for n in s.snapshots if not n.get("rejected")]
    if snaps:
        rows = [[n["seq"], n["trigger"], when(n["created_at"]), n["sha256"][:16], n["bytes"],
                 n["problem"] or "verifies"] for n in snaps]
        out.append(table(["SEQ", "TRIGGER", "WRITTEN (UTC)", "SHA256", "BYTES", "HASH"], rows))
    else:
        out.append("none kept")
    for n in s.snapshots:
        if n.get("rejected"):
            out.append(f"snapshot at seq {n.get('seq')} rejected by a recovery (event {n.get('event_seq')}): "
                       f"{safe(n.get('reason'))}")
    if s.resumes:
        out += ["", "RECOVERIES"]
        rows = [[r["seq"], when(r["at"]), r.get("owner"), r.get("snapshot_seq"), r.get("replayed")] for r in s.resumes]
        out.append(table(["SEQ", "WHEN (UTC)", "OWNER", "FROM SNAPSHOT", "REPLAYED"], rows))
    if s.state_source:
        out += ["", f"STATE ({safe(s.state_source)})", clip(codec.dumps(s.state), 2000)]
    out.extend(f"note: {safe(n)}" for n in s.notes)
    return out


def request_line(call: dict[str, Any]) -> tuple[str, str]:
    """An HTTP request's method and URL (as journaled: redacted) from its record, which has them at
    its top level, or (older records) in its ``request``; ``("-", "")`` when it has neither, and a
    record this code cannot read as its JSON, so that it is still seen."""
    if call.get("type") == "unknown" and "record" in call:
        return "-", json.dumps(call["record"], ensure_ascii=False, default=str)
    request = call.get("request") if isinstance(call.get("request"), dict) else {}
    return (str(call.get("method") or request.get("method") or "-"),
            str(call.get("url") or request.get("url") or call.get("name") or ""))


def _call_flags(call: dict[str, Any], *, durable: bool = True) -> list[str]:
    flags = [flag for flag in ("effect", "replaced", "replayed") if call.get(flag)]
    if durable and "index" not in call:
        flags.append("not durable")  # a request outside the step's durable calls: made again on a re-run
    if call.get("sent") is False:
        flags.append("not sent")
    return flags


def _cause_line(f: dict[str, Any]) -> str:
    err = f.get("error") or {}
    where = f" (execution #{f['execution']})" if f.get("execution") else ""
    return f"{safe(f['message'])} at seq {f['seq']}{where}: {safe(err.get('type'))}: {safe(err.get('message'))}"


def effect_status(e: dict[str, Any]) -> str:
    """An effect's line in the effects table: its compensation's status, or why it has none."""
    return e["status"] if e["compensable"] or e["status"] == "in doubt" else "no compensation"


def _outcome_detail(x: Any) -> str:
    if x.error:
        doubt = f" [effect in doubt, key {x.doubt.get('key')}]" if x.doubt else ""
        return f"{x.error.get('type')}: {x.error.get('message')}{doubt}" + (f" -> {x.route}" if x.route else "")
    if x.outcome == "cancelled":
        return "cancelled; runs again on resume"
    if x.outcome in ("in doubt", "in progress") and x.extra and x.extra[-1]["kind"] == "StepCancelled":
        left = x.extra[-1]["data"].get("key_left")
        return f"cancelled after its function ran{' and its key left' if left else ''}; settled on resume"
    if x.outcome == "completed":
        return ", ".join(x.next) or ("join " + ", ".join(x.joins) if x.joins else "END")
    if x.failures:
        last = x.failures[-1]["error"]
        return f"{last.get('type')}: {last.get('message')}"
    return ""


# -- history ---------------------------------------------------------------------------------------
def cmd_history(args: argparse.Namespace) -> int:
    with open_reader(args) as orc:
        events = orc.history(args.run_id, after=args.after, until=args.until)
    if args.json:
        for e in events:
            print(json_line({"run_id": args.run_id, "seq": e["seq"], "kind": e["kind"], "at": e["at"],
                             "data": _plain(e["data"])}))
        return 0
    # The date is printed when it changes, so each event line keeps its columns for the headline.
    day = None
    seq_width = len(str(events[-1]["seq"])) if events else 1
    kind_width = max((len(e["kind"]) for e in events), default=0)
    for e in events:
        stamp = when(e["at"])
        if stamp[:10] != day:
            day = stamp[:10]
            print(f"-- {day} (UTC)")
        head = f"{e['seq']:>{seq_width}}  {stamp[11:]}  {e['kind']:<{kind_width}}  {headline(e['kind'], e['data'])}"
        print(safe(head.rstrip()) if args.full else clip(head.rstrip(), 100))
        for label, text in details(e["kind"], e["data"], full=args.full):
            body = safe(text).replace("\n", "\n" + " " * 10)
            print(f"          {label}: {body}")
    if not events:
        print("no events in that range")
    return 0


# -- verify ----------------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    with open_reader(args) as orc:
        report = orc.verify(args.run_id, mark=not args.no_mark)
    if args.json:
        print(json_line(report.to_json()))
    else:
        print("\n".join(safe(line) for line in report.lines()))
        if report.verdicts:
            done = ("not recorded (--no-mark)" if args.no_mark else "recorded in the catalog" if report.recorded
                    else "not recorded: the database refused the write")
            print(f"catalog ({done}): " + ", ".join(f"seq {seq} {validity}" for seq, validity, _ in report.verdicts))
    return 0 if report.ok else VERIFY_FAILED


# -- snapshots -------------------------------------------------------------------------------------
def cmd_snapshots(args: argparse.Namespace) -> int:
    with open_reader(args) as orc:
        if args.quarantine is not None:
            if not args.reason:
                raise UsageError("--quarantine SEQ needs --reason TEXT")
            orc.quarantine(args.run_id, args.quarantine, reason=args.reason)
        catalog = orc.snapshots(args.run_id)
    if args.json:
        for info in catalog:
            print(json_line({f: getattr(info, f) for f in info.__slots__}))
        return 0
    # KIND: "full", or "incr<BASE" for an incremental link applied to the snapshot at seq BASE.
    rows = [[info.seq, info.trigger, "full" if info.kind == "full" else f"incr<{info.base_seq}",
             "yes" if info.signature else "no", when(info.created_at),
             "-" if info.size_bytes is None else f"{info.size_bytes:,}", info.validity, safe(f"{info.workflow}@{info.version}"), info.fingerprint[:12] or "-",
             info.config_hash[:8] or "-", info.python_version or "-", info.agentsaga_version or "-"]
            for info in catalog]
    if not rows:
        print(f"run {safe(args.run_id)} has no snapshots")
        return 0
    print(table(["SEQ", "TRIGGER", "KIND", "SIGNED", "CREATED (UTC)", "BYTES", "VALIDITY", "WORKFLOW", "FINGERPRINT", "CONFIG",
                 "PYTHON", "AGENTSAGA"], rows, max_width=140))
    for info in catalog:
        if info.validity_reason:
            print(f"seq {info.seq} {info.validity} at {when(info.checked_at)}: {safe(info.validity_reason)}")
    return 0


# -- savepoint / restore ---------------------------------------------------------------------------
def cmd_savepoint(args: argparse.Namespace) -> int:
    # The run id and name quoted, as archive does: "../x" or "a/b" must not pick another directory.
    out = args.out or f"{quote(args.run_id, safe='')}.{quote(args.name, safe='')}.savepoint.json.gz"
    with open_reader(args) as orc:
        path = orc.savepoint(args.run_id, name=args.name, path=out)
        signed = orc.engine.config.signing_key is not None
    size = path.stat().st_size
    if args.json:
        print(json_line({"run_id": args.run_id, "name": args.name, "path": str(path), "bytes": size, "signed": signed}))
    else:
        print(f"wrote savepoint {safe(args.name)} of run {safe(args.run_id)} to {safe(path)} ({size:,} bytes"
              f"{', signed' if signed else ''})")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    # Everything that can refuse the file is checked before the target is opened: opening a SQLite
    # URL creates its file, and a refused restore must leave nothing behind, not an empty database.
    from orchestrator.engine.savepoints import read_savepoint  # here: --help must stay light

    key = signing_key()
    max_bytes = parse_size(args.max_size, "--max-size") if args.max_size is not None else None
    point = read_savepoint(Path(args.file), key=key.encode() if key is not None else None, max_bytes=max_bytes)
    workflows = app_workflows(args)
    if not any(wf.name == point.run["workflow"] for wf in workflows):
        known = ", ".join(sorted({wf.name for wf in workflows})) or "none"
        raise SavepointError(f"savepoint {args.file!r} holds a run of workflow {point.run['workflow']!r}, which is "
                             f"not registered here (registered: {known}); register it (--app) to restore the run")
    with open_orchestrator(args, app=True) as orc:  # the app is imported once: the same workflows
        run_id = orc.restore(args.file, max_bytes=max_bytes)  # read again: the engine checks what it writes
        rec = orc.get_run(run_id)
    if args.json:
        print(json_line({"run_id": run_id, "status": rec.status, "workflow": rec.workflow}))
    else:
        print(f"restored run {safe(run_id)} ({safe(rec.workflow)}, {rec.status}) into {safe(orc.store.url)}")
        if rec.status == "pending":
            print(f"continue it with: {safe(follow_up(args, 'resume', run_id))}")
    return 0


def cmd_archive(args: argparse.Namespace) -> int:
    older = parse_duration(args.older_than, "--older-than")
    if older is None:
        raise UsageError("archive needs --older-than DURATION (e.g. 30d)")
    with open_reader(args) as orc:
        created = _archive_folder(args.to)
        report = orc.archive(older_than=older, to=args.to)
    if args.json:
        print(json_line({**report, "created": created}))
        return 0
    if created:
        print(f"created directory {safe(args.to)}")
    for row in report["archived"]:
        print(f"archived run {safe(row['run_id'])} ({safe(row['workflow'])}, {row['status']}) to "
              f"{safe(row['path'])} ({row['bytes']:,} bytes)")
    for run_id in report["spared"]:
        print(f"spared run {safe(run_id)}: it was resumed while being archived")
    done = f"{len(report['archived'])} run(s) archived to {safe(report['to'])}"
    if report["archived"]:  # the first file as the example: the command works as printed
        done += f"; restore one with: {safe(follow_up(args, 'restore', report['archived'][0]['path']))}"
    print(done)
    return 0


def _archive_folder(to: str) -> bool:
    """Make ``--to DIR`` when nothing is there yet, its last part only (as ``mkdir DIR`` would): a
    new directory under an existing one is what a person asks for, a mistyped parent is not. True
    when it was made. A file there, or a parent that does not exist, is a one-line error."""
    folder = Path(to)
    if folder.is_dir():
        return False
    if folder.exists() or folder.is_symlink():
        raise CommandError(f"archive: {to!r} is not a directory")
    parent = folder.parent
    if not parent.exists():
        raise CommandError(f"archive: {to!r} does not exist, and neither does its parent {str(parent)!r} "
                           "(archive makes only the last directory of --to)")
    try:
        folder.mkdir()
    except FileExistsError:
        return False  # made meanwhile: archive checks it is a directory
    except OSError as exc:
        raise CommandError(f"archive: {to!r} does not exist and cannot be made: {exc.strerror or exc}") from None
    return True


def cmd_retention(args: argparse.Namespace) -> int:
    with open_orchestrator(args, app=True) as orc:
        dropped = orc.retention(dry_run=args.dry_run)
    if args.json:
        print(json_line({"dry_run": args.dry_run, "dropped": dropped}))
        return 0
    for d in dropped:
        print(f"{'would drop' if args.dry_run else 'dropped'} snapshots {', '.join(map(str, d['seqs']))} of run "
              f"{safe(d['run_id'])} ({safe(d['workflow'])}, {d['status']})")
    print(f"{len(dropped)} finished run(s) past their workflow's finished_ttl")
    return 0


# -- fork ------------------------------------------------------------------------------------------
def cmd_fork(args: argparse.Namespace) -> int:
    with open_orchestrator(args, app=True, existing=True) as orc:
        new_id = orc.fork(args.run_id, from_step=args.from_step, run_id=args.new_run_id)
        first = orc.history(new_id)[0]["data"]
        result = orc.resume(new_id) if args.run else None
    parent = first.get("parent") or {}
    if args.json:
        out: dict[str, Any] = {"run_id": new_id, "parent": parent, "status": result.status if result else "pending"}
        if result is not None:
            out["state"] = _plain(result.state.model_dump() if hasattr(result.state, "model_dump") else result.state)
        print(json_line(out))
    else:
        print(f"forked run {safe(new_id)} from {safe(args.run_id)} at step {safe(args.from_step)} "
              f"(its state at seq {parent.get('seq')})")
        if result is None:
            print(f"drive it with: {safe(follow_up(args, 'resume', new_id))}")
        else:
            print(f"run {safe(new_id)}  status {result.status}  events {result.seq}"
                  + (f"\nerror: {safe(result.error)}" if result.error else ""))
    return 0 if result is None or result.status == "completed" else 1


# -- report ----------------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    with open_reader(args) as orc:
        html = orc.report_html(args.run_id)
    from orchestrator.audit.report import write_report

    try:
        path = write_report(args.html, html)
    except OSError as exc:
        raise CommandError(f"cannot write the report to {args.html!r}: {exc.strerror or exc}") from None
    size = len(html.encode("utf-8"))
    if args.json:
        print(json_line({"run_id": args.run_id, "path": str(path), "bytes": size}))
    else:
        print(f"wrote {safe(path)} ({size:,} bytes)")
    return 0


# -- gc --------------------------------------------------------------------------------------------
def cmd_gc(args: argparse.Namespace) -> int:
    older = parse_duration(args.older_than, "--older-than")
    if args.keep_snapshots is None and older is None:
        raise UsageError("gc needs --keep-snapshots K and/or --older-than DURATION")
    if args.keep_snapshots is not None and args.keep_snapshots < 0:
        raise UsageError("--keep-snapshots must be >= 0")
    with open_reader(args) as orc:
        report = orc.gc(keep_snapshots=args.keep_snapshots, older_than=older, dry_run=args.dry_run)
    if args.json:
        print(json_line(report.to_json()))
        return 0
    rows = [["delete run", d["run_id"], d["status"], when(d["finished_at"]), d["workflow"]] for d in report.deleted]
    rows += [["prune snapshots", p["run_id"], p["status"], "-",
              f"seq {', '.join(map(str, p['deleted']))}; keep {', '.join(map(str, p['kept'])) or 'none'}"]
             for p in report.pruned]
    if rows:
        print(table(["ACTION" + (" (DRY RUN)" if report.dry_run else ""), "RUN", "STATUS", "FINISHED (UTC)",
                     "DETAIL"], rows))
    print(report.headline())
    return 0


# -- parser ----------------------------------------------------------------------------------------
def add_audit_verbs(verb: Verb) -> None:
    """Register the audit verbs with ``cli.build_parser``'s ``verb(name, func, help)`` helper."""
    p = verb("show", cmd_show, "summarise a run: status, timings, steps, effects, snapshots")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--steps", type=whole_number(0), default=50, metavar="N",
                   help="list the last N step executions (default 50)")
    p.add_argument("--all", action="store_true", help="list every step execution")

    p = verb("history", cmd_history, "every event of a run in order (--json: JSON lines for an audit pipeline)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--after", type=whole_number(0), default=0, metavar="SEQ", help="only events after this seq")
    p.add_argument("--until", type=whole_number(0), default=None, metavar="SEQ", help="only events up to this seq")
    p.add_argument("--full", action="store_true", help="do not cut long values; show tracebacks")

    p = verb("verify", cmd_verify, "re-fold the journal and check every snapshot against it (exit 3 if not)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--no-mark", action="store_true", help="do not record the verdicts in the snapshot catalog")

    p = verb("snapshots", cmd_snapshots, "a run's checkpoint catalog: trigger, seq, time, code, size, validity")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--quarantine", type=whole_number(1), metavar="SEQ",
                   help="set the snapshot at SEQ aside (recovery skips it)")
    p.add_argument("--reason", metavar="TEXT", help="why (with --quarantine)")

    p = verb("savepoint", cmd_savepoint, "write a run as a named, portable savepoint file (signed with "
                                         "$AGENTSAGA_SIGNING_KEY when set)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--name", required=True, metavar="NAME", help="the savepoint's name")
    p.add_argument("--out", metavar="FILE", help="where to write it (default: RUN.NAME.savepoint.json.gz in the working directory, "
                        "RUN and NAME URL-quoted)")

    p = verb("restore", cmd_restore, "bring a savepoint file's run into the database (all or nothing)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--max-size", metavar="SIZE",
                   help="refuse a file that decompresses to more than this (e.g. 512M, 2G; default 256M)")
    add_app_flag(p)

    p = verb("archive", cmd_archive, "move finished runs older than a duration into savepoint files")
    p.add_argument("--older-than", required=True, metavar="DURATION", help="e.g. 30d, 12h (finished that long ago)")
    p.add_argument("--to", required=True, metavar="DIR",
                   help="the directory the files are written to (made if missing; its parent must exist)")

    p = verb("retention", cmd_retention, "drop snapshots of finished runs past their workflow's finished_ttl")
    p.add_argument("--dry-run", action="store_true", help="only report what would be dropped")
    add_app_flag(p)

    p = verb("fork", cmd_fork, "start a new run from the state a run had before one of its steps")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--from", dest="from_step", required=True, metavar="STEP",
                   help="the step to start from (its latest execution in RUN)")
    p.add_argument("--run-id", dest="new_run_id", metavar="ID", help="the new run's id (default: generated)")
    p.add_argument("--run", action="store_true", help="drive the new run to its end now")
    add_app_flag(p)
    add_progress_flag(p)

    p = verb("report", cmd_report, "write a self-contained HTML report of a run")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--html", required=True, metavar="FILE", help="where to write the report")

    p = verb("gc", cmd_gc, "retention: prune snapshots and delete old finished runs (never unfinished ones)")
    p.add_argument("--keep-snapshots", type=whole_number(0), default=None, metavar="K",
                   help="keep only the newest K snapshots of each finished run")
    p.add_argument("--older-than", default=None, metavar="DURATION",
                   help="delete finished runs that ended longer ago than this; the unit is required: "
                        "45s, 90m, 12h, 30d or 2w (a bare number is refused)")
    p.add_argument("--dry-run", action="store_true", help="list what would be done, change nothing")
