"""The HTML report of one run: a single self-contained file to hand to a colleague.

Rendered by jinja2 from ``templates/report.html.j2`` with autoescaping on for every value: run
data is untrusted (an LLM's output can contain ``<script>``, an ``onerror=`` attribute or a
``javascript:`` link) and must arrive in the page as text. The page itself has no script at all
and says so in a Content-Security-Policy, so even markup that slipped through could neither run
nor fetch anything. No network: the CSS is inline and the graph is inline SVG. Expandable parts
are ``<details>`` elements, which need no script; printing opens them.

The file is written next to its destination and renamed into place, so a failed write never
leaves half a report.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import jinja2

from orchestrator.payload import codec
from orchestrator.audit.graph import END, graph_view
from orchestrator.audit.summary import Execution, RunSummary

__all__ = ["render_report", "write_report"]

_PAYLOAD_CHARS = 8_000  # per expandable value; the full value is in `agentsaga history --json`
_env: jinja2.Environment | None = None


def _environment() -> jinja2.Environment:
    global _env
    if _env is None:
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("orchestrator.audit", "templates"),
            autoescape=True,  # every template, whatever its name: run data is never markup
            # Run data is arbitrary JSON: a field an event does not carry renders empty.
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters.update(when=_when, ms=_ms, pretty=_pretty, short=_short, pct=_pct)
        _env = env
    return _env


def render_report(summary: RunSummary, *, generated_at: float | None = None) -> str:
    """The report's HTML text (summary from ``summarise(..., keep_states=True)``)."""
    s = summary
    executions = s.executions
    taken = Counter({(a, b): n for a, b, n in s.edges_taken})
    for x in executions:
        if x.outcome == "completed" and not x.next and not x.joins:
            taken[(x.step, END)] += 1  # the branch ended: END is not journaled as a routing target
    visits = Counter(x.step for x in executions)
    graph = graph_view(s.graph, [(a, b, n) for (a, b), n in taken.items()], dict(visits), s.start)
    origin = s.first_at if s.first_at is not None else s.created_at
    span = max((x.ended_at or origin) for x in executions) - origin if executions else 0.0
    timeline: list[tuple[int, str, Any]] = [(x.first_seq, "step", _row(x, s, origin, span)) for x in executions]
    for resume in s.resumes:
        timeline.append((resume["seq"], "mark", {"seq": resume["seq"], "at": resume["at"], "kind": "Resumed",
                                                 "text": f"taken over by {resume.get('owner')} from snapshot seq "
                                                         f"{resume.get('snapshot_seq')}, {resume.get('replayed')} "
                                                         "events replayed"}))
    for saga in s.sagas:
        timeline.append((saga["seq"], "mark", {"seq": saga["seq"], "at": saga["at"], "kind": saga["kind"],
                                               "text": _saga_text(saga)}))
    for breaker in s.breakers:
        timeline.append((breaker["seq"], "mark", {"seq": breaker["seq"], "at": breaker["at"],
                                                  "kind": "Breaker", "text": f"{breaker.get('step') or ''}: "
                                                                            f"{breaker.get('message') or ''}"}))
    timeline.sort(key=lambda item: (item[0], item[1] != "mark"))
    retries = [dict(f, step=x.step, execution=x.index) for x in executions for f in x.failures]
    failure = dict(s.failure) if s.failure else None
    if failure and failure.get("execution"):
        x = executions[failure["execution"] - 1]
        failure["traceback"] = (x.error or {}).get("traceback") or (failure.get("error") or {}).get("traceback")
    context = {
        "s": s, "graph": graph, "timeline": timeline, "retries": retries, "failure": failure,
        "path": _path(s), "steps_count": len(executions), "span_ms": span * 1000,
        "sagas": [{"seq": g["seq"], "at": g["at"], "kind": g["kind"],
                   "detail": {k: v for k, v in g.items() if k not in ("seq", "at", "kind")}} for g in s.sagas],
        "generated": _when(generated_at if generated_at is not None else _dt.datetime.now().timestamp()),
    }
    return _environment().get_template("report.html.j2").render(context)


def write_report(path: str | os.PathLike[str], html: str) -> Path:
    """Write atomically (temp file in the same directory, then rename). Raises ``OSError``."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(21, "is a directory", str(target))
    fd, tmp = tempfile.mkstemp(prefix=".agentsaga-report-", suffix=".tmp", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(html)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _row(x: Execution, s: RunSummary, origin: float, span: float) -> dict[str, Any]:
    """One timeline row: the execution plus where its bar sits on the run's time axis."""
    start = (x.started_at or origin) - origin
    length = ((x.ended_at or x.started_at or origin) - (x.started_at or origin))
    state_at = x.input.get("state_at") if isinstance(x.input, dict) else None
    return {
        "x": x,
        # A bar that starts at the very end (a failure, whose duration is not journaled) stays visible.
        "left": min(start / span * 100, 99.5) if span > 0 else 0.0,
        "width": length / span * 100 if span > 0 else 0.0,
        "input_text": s.states.get(state_at) if state_at is not None else None,
        "state_at": state_at,
        "headline": _headline(x),
    }


def _headline(x: Execution) -> str:
    if x.error:
        return f"{x.error.get('type')}: {x.error.get('message')}"
    for entry in x.trace:
        if isinstance(entry, dict) and entry.get("msg"):
            return str(entry["msg"])
    return ""


def _path(s: RunSummary, longest_loop: int = 8) -> list[dict[str, Any]]:
    """The ticks in order, with a loop's body written once and its repeat count: an agent loop of
    three steps run 300 times reads as one line, not 900."""
    labels = [(" ∥ ".join(t["steps"]), t["epoch"]) for t in s.ticks]
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(labels):
        best_len, best_repeat = 1, 1
        for length in range(1, min(longest_loop, len(labels) - i) + 1):
            block = labels[i:i + length]
            repeat = 1
            while labels[i + repeat * length:i + (repeat + 1) * length] == block:
                repeat += 1
            if repeat > 1 and repeat * length > best_len * best_repeat:
                best_len, best_repeat = length, repeat
        block = labels[i:i + best_len]
        out.append({"label": " → ".join(label for label, _ in block), "repeat": best_repeat,
                    "tick": s.ticks[i]["tick"], "epoch": block[0][1]})
        i += best_len * best_repeat
    return out


def _saga_text(saga: dict[str, Any]) -> str:
    kind = saga["kind"]
    if kind == "SagaStarted":
        err = saga.get("error") or {}
        return f"compensating ({saga.get('reason')}): {err.get('type', '')} {err.get('message', '')}".strip()
    if kind == "SagaCompleted":
        return f"compensation finished: run {saga.get('outcome')}"
    if kind == "SagaFailed":
        return f"compensating {saga.get('step')!r} failed for good"
    if kind == "RolledBack":
        return f"rolled back to seq {saga.get('to_seq')}"
    return kind


# -- filters ---------------------------------------------------------------------------------------
def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 60_000:
        return f"{value / 60_000:.1f} min"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.1f} ms" if value >= 1 else f"{value:.2f} ms"


def _pretty(value: Any, limit: int = _PAYLOAD_CHARS) -> str:
    """JSON for a ``<pre>``: indented when small, compact and cut when large."""
    try:
        text = codec.dumps(value)
    except Exception:  # an event the codec cannot re-encode is still shown
        text = json.dumps(value, default=repr, ensure_ascii=False)
    if len(text) > limit:
        return text[:limit] + f"… [{len(text):,} characters; `agentsaga history --json` has all]"
    return json.dumps(json.loads(text), indent=2, ensure_ascii=False)


def _short(text: Any, width: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _pct(value: float) -> str:
    """A CSS percentage: always a plain number (the style attribute is ours, never run data)."""
    return f"{max(0.0, min(100.0, float(value))):.3f}%"
