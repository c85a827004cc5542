"""Snapshots: the fold of a run's journal up to a seq, stored with its sha256, and restoring a run.

A snapshot is only an optimisation and is always verifiable (invariant 2): ``restore_run`` takes
the newest snapshot that verifies and folds the events after it, so
``fold(snapshot_n + events after n) == fold(all events)``; a snapshot whose hash, layout or seq
does not check out is skipped (and reported), never trusted.
"""

from __future__ import annotations

import hashlib
import logging
import platform
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from orchestrator.engine.fold import Reduce, RunState, fold
from orchestrator.payload import codec
from store import NewSnapshot, SnapshotRecord, Store

__all__ = ["AGENTSAGA_VERSION", "SNAPSHOT_SCHEMA", "SnapshotMeta", "make_snapshot", "snapshot_problem", "restore_run"]

_log = logging.getLogger("agentsaga.engine")

#: Layout version of a snapshot's JSON; a snapshot of another version is skipped, never trusted.
SNAPSHOT_SCHEMA = 1


def _agentsaga_version() -> str:
    try:
        return metadata.version("agentsaga")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


#: The installed agentsaga's version, recorded with every snapshot and savepoint.
AGENTSAGA_VERSION = _agentsaga_version()
_PYTHON_VERSION = platform.python_version()


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """What the checkpoint catalog records about the code and configuration that wrote a snapshot."""

    workflow: str = ""
    version: str = ""
    fingerprint: str = ""
    config_hash: str = ""

    @classmethod
    def of(cls, workflow: Any, config: dict[str, Any]) -> SnapshotMeta:
        """The metadata of snapshots of ``workflow`` (a ``Workflow``) written under ``config`` (JSON data:
        the settings that decide when snapshots are taken and kept)."""
        text = codec.canonical_dumps(config, what="snapshot configuration")
        return cls(workflow=workflow.name, version=workflow.version, fingerprint=workflow.fingerprint,
                   config_hash=hashlib.sha256(text.encode()).hexdigest()[:16])


def make_snapshot(folded: RunState, trigger: str, now: float, meta: SnapshotMeta | None = None) -> NewSnapshot:
    """The run state as canonical JSON text with its sha256 and its catalog metadata."""
    text = codec.canonical_dumps(folded.to_json(), what="snapshot")
    data = text.encode()
    meta = meta or SnapshotMeta()
    return NewSnapshot(
        seq=folded.seq,
        state=text,
        sha256=hashlib.sha256(data).hexdigest(),
        trigger=trigger,
        created_at=now,
        schema_version=SNAPSHOT_SCHEMA,
        workflow=meta.workflow,
        version=meta.version,
        fingerprint=meta.fingerprint,
        agentsaga_version=AGENTSAGA_VERSION,
        python_version=_PYTHON_VERSION,
        config_hash=meta.config_hash,
        size_bytes=len(data),
    )


def snapshot_problem(snap: SnapshotRecord) -> str | None:
    """Why a snapshot cannot be trusted, or None when it verifies (invariant 2)."""
    if snap.schema_version != SNAPSHOT_SCHEMA:
        return f"snapshot layout version {snap.schema_version} is not {SNAPSHOT_SCHEMA}"
    digest = hashlib.sha256(snap.state.encode()).hexdigest()
    if digest != snap.sha256:
        return f"sha256 mismatch (stored {snap.sha256[:12]}..., computed {digest[:12]}...)"
    return None


def restore_run(store: Store, run_id: str, reduce: Reduce) -> tuple[RunState, int, list[tuple[int, str]]]:
    """Newest snapshot that verifies + the events after it. Returns (state, snapshot seq, rejected).

    Only the catalog (no states) is read first; then the states are read one at a time, newest
    first, so a recovery reads exactly one snapshot unless the newest does not verify. A snapshot
    the catalog marks ``failed`` or ``quarantined`` is skipped unread, and said so in ``rejected``.
    """
    rejected: list[tuple[int, str]] = []
    folded: RunState | None = None
    snap_seq = 0
    catalog = store.snapshot_catalog(run_id)
    last = store.last_seq(run_id) if catalog else 0
    for info in catalog:
        problem: str | None = None
        if info.validity in ("failed", "quarantined"):
            problem = f"marked {info.validity} in the catalog: {info.validity_reason or 'no reason given'}"
        elif info.seq > last:
            # A snapshot is only valid inside its journal: one past the end (events lost or deleted)
            # would claim history the journal does not hold.
            problem = f"snapshot at seq {info.seq} lies beyond the end of the journal (last event at seq {last})"
        else:
            snap = store.snapshot(run_id, info.seq)
            if snap is None:  # pruned between the two reads: an older one will do
                continue
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
                        folded, snap_seq = candidate, snap.seq
                        break
        _log.warning("run %s: snapshot at seq %d skipped: %s", run_id, info.seq, problem)
        rejected.append((info.seq, problem))
    events = store.events(run_id, after_seq=folded.seq if folded else 0)
    folded = fold(((e.seq, e.kind, codec.loads(e.data)) for e in events), reduce, start=folded)
    return folded, snap_seq, rejected
