"""Events in words: one headline per event and its details, for ``history`` and progress lines.

Only wording lives here; what the events mean is ``_fold``'s and ``_summary``'s business. Kinds
this module does not know (a newer journal) are described by their data, never dropped. The
callers pass every string through ``_term.safe`` before it reaches a terminal.
"""

from __future__ import annotations

from datetime import datetime, timezone

from typing import Any

from orchestrator.payload import codec

__all__ = ["headline", "details", "compact"]


def compact(value: Any, width: int | None = 300) -> str:
    """One-line JSON of ``value``, cut at ``width`` characters (None: never cut)."""
    try:
        text = codec.dumps(value)
    except Exception:  # describing must never fail on the value it describes
        text = repr(value)
    if width is not None and len(text) > width:
        return text[: width - 1] + "…"
    return text


def _error(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    return f"{error.get('type')}: {error.get('message')}"


def _call_name(request: Any) -> str:
    """What a durable call was to: its model, tool or URL (the report's call table says the same)."""
    if not isinstance(request, dict):
        return ""
    return next((str(request[k]) for k in ("model", "tool", "name", "url") if request.get(k)), "")


def _ms(value: Any) -> str:
    return f", {value:.1f} ms" if isinstance(value, (int, float)) else ""


def _seconds(value: Any) -> str:
    return f"{value:.3g}s" if isinstance(value, (int, float)) else f"{value}s"


def headline(kind: str, data: dict[str, Any]) -> str:
    """What happened, in one line."""
    step = data.get("step")
    where = f"{step} (tick {data.get('tick')}, attempt {data.get('attempt')}" if step is not None else ""
    if kind == "RunStarted":
        text = f"workflow {data.get('workflow')} v{data.get('version')}, starts at {', '.join(data.get('start') or [])}"
        parent = data.get("parent")
        if isinstance(parent, dict):
            text += f"; forked from {parent.get('run_id')} at step {parent.get('step')} (seq {parent.get('seq')})"
        return text
    if kind == "StepStarted":
        key = f", key {data['key']}" if data.get("key") else ""
        return f"{where}{key})"
    if kind == "StepCompleted":
        nxt = ", ".join(data.get("next") or []) or ("join " + ", ".join(data["join"]) if data.get("join") else "END")
        extra = f", reconciled by {data['reconciled']}" if data.get("reconciled") else ""
        return f"{where}{_ms(data.get('ms'))}{extra}) -> {nxt}"
    if kind == "StepFailed":
        if data.get("final"):
            then = f"gave up, routed to {data['route']}" if data.get("route") else "gave up"
        else:
            then = f"retry in {_seconds(data.get('retry_in'))}"
        doubt = data.get("doubt")
        if isinstance(doubt, dict):  # first, before a long headline is cut: its effect may stand
            then = f"IN DOUBT (key {doubt.get('key')}); {then}"
        return f"{where}) failed; {then}"
    if kind == "KeyIssued":
        return f"{where}) its idempotency key left the process (read, or sent with a request)"
    if kind == "StepCancelled":
        if not data.get("called"):
            how = "before its function ran: nothing left the process"
        elif "key_left" in data:
            how = "its key had left: re-sent with it on resume" if data.get("key_left") else \
                "before its key left: in doubt until resume settles it"
        else:
            how = "runs again on resume"
        still = "; still running on a thread (the lease is kept until it ends)" if data.get("still_running") else ""
        return f"{where}) cancelled, {how}{still}"
    if kind == "Resumed":
        return (f"by {data.get('owner')} (lease {data.get('lease')}) from snapshot seq {data.get('snapshot_seq')}, "
                f"{data.get('replayed')} events replayed")
    if kind == "SnapshotRejected":
        return f"snapshot at seq {data.get('seq')}: {data.get('reason')}"
    if kind == "SnapshotPolicy":
        inputs = data.get("inputs") or {}
        return (f"snapshot every {data.get('every')} events ({data.get('policy')}: {inputs.get('troubled')} of "
                f"{inputs.get('runs')} recent runs crashed or recovered)")
    if kind in ("RunCompleted",):
        return ""
    if kind == "RunFailed":
        return f"step {step} failed"
    if kind == "RunCancelled":
        return _in_doubt_first(data, f"{data.get('reason')} (by {data.get('by')})")
    if kind == "SagaStarted":
        return f"compensating ({data.get('reason')})" + (f" after step {step} failed" if step else "")
    if kind in ("CompensationStarted", "CompensationCompleted"):
        return f"effect at seq {data.get('effect')} of step {step}, attempt {data.get('attempt')}"
    if kind == "CompensationFailed":
        then = "gave up" if data.get("final") else f"retry in {_seconds(data.get('retry_in'))}"
        return f"effect at seq {data.get('effect')} of step {step}, attempt {data.get('attempt')} failed; {then}"
    if kind == "SagaCompleted":
        return _in_doubt_first(data, f"run {data.get('outcome')}")
    if kind == "SagaFailed":
        return f"compensating step {step} failed after {data.get('attempts')} attempts"
    if kind == "RolledBack":
        return f"to seq {data.get('to_seq')}" + (f", next {', '.join(data['next'])}" if data.get("next") else "")
    if kind == "WaitTimedOut":
        index = data.get("index")
        which = f" (wait {index} for that name)" if index else ""
        deadline = data.get("timeout_at")
        try:
            at = datetime.fromtimestamp(deadline, timezone.utc).isoformat(timespec="seconds")
        except (TypeError, OverflowError, ValueError, OSError):
            at = str(deadline)
        return f"{step}: the wait for signal {data.get('name')!r}{which} timed out ({at}); the step was told"
    if kind in ("CallCompleted", "CallFailed"):
        what = " ".join(part for part in (str(data.get("kind")), _call_name(data.get("request"))) if part)
        flags = "".join(f", {flag}" for flag in ("replaced", "replayed") if data.get(flag))
        position = str(data.get("index"))
        if "." in position:  # made while another call was performed (a tool asking a model)
            flags += f", inside call {position.rsplit('.', 1)[0]}"
        failed = f" failed: {_error(data.get('error'))}" if kind == "CallFailed" else ""
        return f"{step} call {position} ({what}{_ms(data.get('ms'))}{flags}){failed}"
    if step is not None:
        return f"{step}: " + compact({k: v for k, v in data.items() if k != "step"}, 200)
    return compact(data, 200)


def _in_doubt_first(data: dict[str, Any], then: str) -> str:
    """A run's end that lists effects in doubt says so first, before a long headline is cut."""
    doubts = [d for d in data.get("in_doubt") or () if isinstance(d, dict)]
    if not doubts:
        return then
    keys = ", ".join(f"{d.get('step')} (key {d.get('key')})" for d in doubts)
    return f"IN DOUBT: {keys}; {then}"


_DETAIL_FIELDS: dict[str, tuple[str, ...]] = {
    "RunStarted": ("input",),
    "StepStarted": ("input",),
    "StepCompleted": ("input", "update", "trace", "calls", "http"),
    "StepFailed": ("error", "doubt", "traceback"),
    "CompensationCompleted": ("result", "trace"),
    "CompensationFailed": ("error", "traceback"),
    "SagaStarted": ("error",),
    "SagaFailed": ("error",),
    "RunFailed": ("error", "uncompensable", "in_doubt"),
    "RunCancelled": ("in_doubt",),
    "SagaCompleted": ("uncompensable", "in_doubt"),
    "CallCompleted": ("request", "response"),
    "CallFailed": ("request", "error"),
}


def details(kind: str, data: dict[str, Any], *, full: bool = False) -> list[tuple[str, str]]:
    """``(label, text)`` lines under the headline: payloads (input, output, trace, calls...).
    Tracebacks only with ``full``; every value is cut at 300 characters unless ``full``."""
    width = None if full else 300
    out: list[tuple[str, str]] = []
    for name in _DETAIL_FIELDS.get(kind, ()):
        if name == "traceback":
            tb = (data.get("error") or {}).get("traceback") if isinstance(data.get("error"), dict) else None
            if tb and full:
                out.append(("traceback", tb.rstrip()))
            continue
        value = data.get(name)
        if value is None or value == [] or value == {}:
            continue
        if name == "error":  # words, not JSON: the message is read, and safe() shows any escapes
            text = _error(value)
            out.append(("error", text if width is None or len(text) <= width else text[: width - 1] + "…"))
            continue
        if name == "trace" and isinstance(value, list):
            for entry in value:
                if isinstance(entry, dict) and "msg" in entry:
                    more = f" {compact(entry['data'], width)}" if entry.get("data") is not None else ""
                    out.append(("trace", f"{entry['msg']}{more}"))
                else:
                    out.append(("trace", compact(entry, width)))
            continue
        out.append((name, compact(value, width)))
    return out
