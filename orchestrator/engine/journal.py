"""The journal's side of the engine: error records, snapshots, restoring a run, redaction.

These turn a run's state into journal text and back, and never drive a run: ``restore_run`` is
``fold(newest verified snapshot + the events after it)`` (invariant 2), ``make_snapshot`` writes the
canonical text that ``snapshot_problem`` verifies, and ``JournalRedactor`` scrubs every event before
it is written (invariant 9).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import traceback
from typing import Any

from orchestrator.payload import codec
from orchestrator.engine.fold import Reduce, RunState, fold
from orchestrator.payload.redact import Redactor
from store import NewSnapshot, SnapshotRecord, Store

__all__ = ["SNAPSHOT_SCHEMA", "JournalRedactor", "error_info", "make_snapshot", "restore_run", "snapshot_problem"]

_log = logging.getLogger("agentsaga.engine")

#: Layout version of a snapshot's JSON; a snapshot of another version is skipped, never trusted.
SNAPSHOT_SCHEMA = 1
_TRACEBACK_LIMIT = 8000
_SECRET_HINT = re.compile(r"password|passwd|secret|token|api_?key|authori[sz]ation|bearer|cookie|sk-")


def error_info(exc: BaseException, *, with_traceback: bool = True) -> dict[str, Any]:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    info: dict[str, Any] = {"type": name, "message": str(exc)}
    if with_traceback and exc.__traceback__ is not None:
        text = "".join(traceback.format_exception(exc))
        info["traceback"] = text if len(text) <= _TRACEBACK_LIMIT else "...\n" + text[-_TRACEBACK_LIMIT:]
    return info


def snapshot_problem(snap: SnapshotRecord) -> str | None:
    """Why a snapshot cannot be trusted, or None when it verifies (invariant 2)."""
    if snap.schema_version != SNAPSHOT_SCHEMA:
        return f"snapshot layout version {snap.schema_version} is not {SNAPSHOT_SCHEMA}"
    digest = hashlib.sha256(snap.state.encode()).hexdigest()
    if digest != snap.sha256:
        return f"sha256 mismatch (stored {snap.sha256[:12]}..., computed {digest[:12]}...)"
    return None


def make_snapshot(rs: RunState, trigger: str, now: float) -> NewSnapshot:
    """The run state as canonical JSON text with its sha256."""
    text = codec.canonical_dumps(rs.to_json(), what="snapshot")
    return NewSnapshot(
        seq=rs.seq,
        state=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        trigger=trigger,
        created_at=now,
        schema_version=SNAPSHOT_SCHEMA,
    )


def restore_run(store: Store, run_id: str, reduce: Reduce) -> tuple[RunState, int, list[tuple[int, str]]]:
    """Newest snapshot that verifies + the events after it. Returns (state, snapshot seq, rejected)."""
    rejected: list[tuple[int, str]] = []
    rs: RunState | None = None
    snap_seq = 0
    for snap in store.snapshots(run_id):
        problem = snapshot_problem(snap)
        if problem is None:
            try:
                candidate = RunState.from_json(codec.loads(snap.state))
            except (ValueError, TypeError, KeyError) as exc:
                problem = f"cannot decode: {exc}"
            else:
                if candidate.seq != snap.seq:
                    problem = f"snapshot says seq {candidate.seq}, stored at seq {snap.seq}"
                else:
                    rs, snap_seq = candidate, snap.seq
                    break
        _log.warning("run %s: snapshot at seq %d skipped: %s", run_id, snap.seq, problem)
        rejected.append((snap.seq, problem))
    events = store.events(run_id, after_seq=rs.seq if rs else 0)
    rs = fold(((e.seq, e.kind, codec.loads(e.data)) for e in events), reduce, start=rs)
    return rs, snap_seq, rejected


class JournalRedactor:
    """Invariant 9: secrets never reach the journal (sensitive fields, configured patterns).

    A cheap pre-filter (under a microsecond for a small event) lets only texts that could hold a
    secret pay for a full redaction; configured patterns, if any, are searched as given.
    """

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        defaults = {p.pattern for p in Redactor()._each}
        custom = [p for p in redactor._each if p.pattern not in defaults]
        self._custom = re.compile("|".join(f"(?:{p.pattern})" for p in custom)) if custom else None

    def redact(self, text: str, *, force: bool = False) -> str:
        """Redaction is idempotent; ``force`` skips the pre-filter (to compare with a journal text
        that went through it)."""
        if not force and _SECRET_HINT.search(text.lower()) is None and (
                self._custom is None or self._custom.search(text) is None):
            return text
        # Plain json, not the codec: tagged values stay tagged and only strings are touched.
        cleaned = json.dumps(self.redactor.json(json.loads(text)), ensure_ascii=False, separators=(",", ":"))
        return self.redactor.text(cleaned)
