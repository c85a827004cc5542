"""Snapshots: the fold of a run's journal up to a seq, stored with its sha256, and restoring a run.

A snapshot is only an optimisation and is always verifiable (invariant 2): ``restore_run`` takes
the newest snapshot that verifies and folds the events after it, so
``fold(snapshot_n + events after n) == fold(all events)``; a snapshot whose hash, layout, seq or
signature does not check out is skipped (and reported), never trusted.

Full and incremental. A *full* snapshot is the whole fold as canonical JSON. An *incremental* one
(``SnapshotChain``, for large states that change little per step: a conversation under an append
reducer) holds only what changed since its base, the previous snapshot of the chain: the run's
scheduler fields whole, and per top-level field of the user state nothing when it was not
touched, the appended tail when a list only grew under the ``append``/``extend`` reducers, else
the whole field. Each link records its base's seq and sha256 (in its row and inside its hashed
text); after ``full_every`` incrementals the next snapshot is full again, which bounds a chain.
Restoring an incremental reads its chain back to the full snapshot and verifies every link (hash,
base hash, signature); a chain with a bad link is not used: the restore falls back to an older
snapshot (or none) plus the events, and reports every snapshot it skipped and why.

Signed. With a signing key (the Orchestrator's ``signing_key``, the one savepoints use), every
snapshot is written with an HMAC-SHA256 over its run, seq, kind, base and sha256, and a snapshot
that is unsigned or wrongly signed is refused: a snapshot edited in the database with its sha256
recomputed is then not trusted (without a key, such an edit is caught only by ``verify``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from orchestrator.engine.fold import Reduce, RunState, fold
from orchestrator.engine.views import copy_json
from orchestrator.payload import codec
from orchestrator.errors import JournalDamagedError
from store import NewSnapshot, SnapshotRecord, Store
from workflows import reducers
from workflows.errors import WorkflowError

__all__ = ["AGENTSAGA_VERSION", "SNAPSHOT_SCHEMA", "SnapshotChain", "SnapshotMeta", "make_snapshot", "resolve_chains",
           "restore_run", "retained", "sign_snapshot", "snapshot_problem"]

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


def sign_snapshot(key: bytes, run_id: str, seq: int, kind: str, base_seq: int | None, sha256: str) -> str:
    """The HMAC-SHA256 of a snapshot: over its run, seq, kind, base and the sha256 of its text, so a
    signed snapshot cannot be edited, nor moved to another run or seq, without the key."""
    message = f"agentsaga-snapshot\n{run_id}\n{seq}\n{kind}\n{'' if base_seq is None else base_seq}\n{sha256}"
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def _new_snapshot(run_id: str, seq: int, text: str, trigger: str, now: float, meta: SnapshotMeta | None,
                  key: bytes | None, *, kind: str = "full", base_seq: int | None = None,
                  base_sha256: str | None = None, root_seq: int | None = None) -> NewSnapshot:
    data = text.encode()
    digest = hashlib.sha256(data).hexdigest()
    meta = meta or SnapshotMeta()
    return NewSnapshot(
        seq=seq,
        state=text,
        sha256=digest,
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
        kind=kind,
        base_seq=base_seq,
        base_sha256=base_sha256,
        root_seq=seq if root_seq is None else root_seq,
        signature=None if key is None else sign_snapshot(key, run_id, seq, kind, base_seq, digest),
    )


def make_snapshot(folded: RunState, trigger: str, now: float, meta: SnapshotMeta | None = None, *,
                  run_id: str = "", key: bytes | None = None) -> NewSnapshot:
    """A full snapshot: the run state as canonical JSON text with its sha256, its catalog metadata
    and, with a signing ``key``, its signature (``run_id`` is part of what is signed)."""
    text = codec.canonical_dumps(folded.to_json(), what="snapshot")
    return _new_snapshot(run_id, folded.seq, text, trigger, now, meta, key)


#: Reducers that build a new list from the current one plus the update, leaving the current one
#: (and its elements) as they were: a field under one of them that only grew is stored as its tail.
_GROWING = (reducers.append, reducers.extend)
_RUN_FIELDS = tuple(k for k in RunState().to_json() if k not in ("state", "seq"))


class _Base:
    """What the writer remembers of the last snapshot of a chain, to write the next link."""

    __slots__ = ("links", "lists", "root", "seq", "sha256", "state", "values")

    def __init__(self, seq: int, sha256: str, root: int, links: int, state: dict[str, Any],
                 growing: Callable[[str], bool]) -> None:
        self.seq, self.sha256, self.root, self.links = seq, sha256, root, links
        self.state = state  # the very dict: a new one (a rollback, a migration) means "write a full one"
        self.values = dict(state)  # the field values as they were (references; the fold never edits them in place)
        # The elements of growing lists as they were (a pointer copy), to check that the new list starts with them.
        self.lists = {k: list(v) for k, v in state.items() if isinstance(v, list) and growing(k)}


class SnapshotChain:
    """Writes a run's snapshots as chains of incremental links closed by full snapshots.

    One per run being driven. The writer folds events with ``reduce`` (the workflow's reducers,
    recording which fields they touched), and asks ``make`` for each snapshot. ``full_every`` is
    the bound of a chain: after that many incrementals the next snapshot is full (None or 0: every
    snapshot is full). The first snapshot this process writes for a run is full.
    """

    __slots__ = ("_reduce", "_reducers", "base", "full_every", "touched")

    def __init__(self, workflow_reduce: Callable[[dict[str, Any], Mapping[str, Any]], None],
                 field_reducers: Mapping[str, Any], full_every: int | None) -> None:
        self._reduce = workflow_reduce
        self._reducers = field_reducers
        self.full_every = full_every or 0
        #: fields a reducer touched since the last snapshot
        self.touched: set[str] = set()
        self.base: _Base | None = None

    def reduce(self, state: dict[str, Any], update: Mapping[str, Any]) -> None:
        """The workflow's reduce, noting the fields it touches (the fold's only way to change one)."""
        self.touched.update(update)
        self._reduce(state, update)

    def _growing(self, key: str) -> bool:
        return self._reducers.get(key) in _GROWING

    def make(self, folded: RunState, trigger: str, now: float, meta: SnapshotMeta | None, *,
             run_id: str, key: bytes | None) -> NewSnapshot:
        """The snapshot of ``folded`` (an incremental link when the chain allows, else a full one);
        the chain moves on to it at once (a failed write breaks the run: nothing follows it)."""
        base = self.base
        state = folded.state
        if base is None or not self.full_every or base.links >= self.full_every or base.state is not state:
            snap = make_snapshot(folded, trigger, now, meta, run_id=run_id, key=key)
            self.base = _Base(snap.seq, snap.sha256, snap.seq, 0, state, self._growing)
            self.touched = set()
            return snap
        changed: dict[str, Any] = {}
        grown: dict[str, Any] = {}
        for name in self.touched:
            if name not in state:
                continue
            value = state[name]
            old = base.lists.get(name)
            if (old is not None and isinstance(value, list) and len(value) >= len(old)
                    and all(a is b for a, b in zip(old, value))):
                if len(value) > len(old):
                    grown[name] = value[len(old):]
            elif name not in base.values or value is not base.values[name] or not isinstance(
                    value, (str, int, float, bool, type(None))):
                changed[name] = value
        dropped = sorted(k for k in base.values if k not in state)
        doc = {"incremental": 1, "seq": folded.seq, "base_seq": base.seq, "base_sha256": base.sha256,
               "run": {k: v for k, v in folded.to_json().items() if k != "state"},
               "set": changed, "append": grown, "drop": dropped}
        text = codec.canonical_dumps(doc, what="snapshot")
        snap = _new_snapshot(run_id, folded.seq, text, trigger, now, meta, key, kind="incremental",
                             base_seq=base.seq, base_sha256=base.sha256, root_seq=base.root)
        self.base = _Base(snap.seq, snap.sha256, base.root, base.links + 1, state, self._growing)
        self.touched = set()
        return snap


def retained(catalog: Sequence[Any], keep: int) -> tuple[list[int], list[int]]:
    """(kept, dropped) seqs when a run's snapshots (catalog entries, any order) are pruned to the
    newest ``keep`` and the chains they need: everything older than the oldest chain start among the
    newest ``keep`` goes (the rule of ``Store.prune_snapshots``, for reports and dry runs)."""
    newest = sorted(catalog, key=lambda i: i.seq, reverse=True)[:keep]
    cutoff = min((i.root_seq if i.root_seq is not None else i.seq for i in newest), default=None)
    seqs = sorted(i.seq for i in catalog)
    if cutoff is None:
        return [], seqs
    return [q for q in seqs if q >= cutoff], [q for q in seqs if q < cutoff]


def snapshot_problem(snap: SnapshotRecord, *, key: bytes | None = None, run_id: str = "") -> str | None:
    """Why a snapshot's own bytes cannot be trusted, or None when they verify (invariant 2). With a
    signing ``key``, an unsigned or wrongly signed snapshot of ``run_id`` does not verify either."""
    if snap.schema_version != SNAPSHOT_SCHEMA:
        return f"snapshot layout version {snap.schema_version} is not {SNAPSHOT_SCHEMA}"
    if snap.kind not in ("full", "incremental"):
        return f"unknown snapshot kind {snap.kind!r}"
    digest = hashlib.sha256(snap.state.encode()).hexdigest()
    if digest != snap.sha256:
        return f"sha256 mismatch (stored {snap.sha256[:12]}..., computed {digest[:12]}...)"
    if key is not None:
        if not snap.signature:
            return "not signed, and a signing key is configured"
        expected = sign_snapshot(key, run_id, snap.seq, snap.kind, snap.base_seq, snap.sha256)
        if not hmac.compare_digest(str(snap.signature), expected):
            return "its signature does not match the configured signing key"
    return None


class _ChainBroken(Exception):
    """A link of a snapshot's chain does not verify: (the link's seq, why)."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(reason)
        self.seq, self.reason = seq, reason


def _apply_link(run: dict[str, Any], doc: Mapping[str, Any]) -> dict[str, Any]:
    """The full snapshot JSON ``run`` (owned, changed in place) moved on by one incremental link."""
    state = run["state"]
    for name in doc["drop"]:
        state.pop(name, None)
    for name, value in doc["set"].items():
        state[name] = value
    for name, tail in doc["append"].items():
        current = state.get(name)
        if not isinstance(current, list) or not isinstance(tail, list):
            raise TypeError(f"field {name!r} is not a list to append to")
        current.extend(tail)
    fields = dict(doc["run"])
    fields["state"] = state
    fields["seq"] = doc["seq"]
    return fields


def _materialise(read: Callable[[int], SnapshotRecord | None], snap: SnapshotRecord, *, key: bytes | None,
                 run_id: str, bad: Mapping[int, str], known: Mapping[int, dict[str, Any]] | None = None,
                 ) -> dict[str, Any]:
    """The full snapshot JSON of ``snap``: itself when full, else its chain's full snapshot moved on by
    each link, every link's bytes, base hash, signature and catalog flag checked (``_ChainBroken``).
    ``known`` holds snapshots already rebuilt and checked, by seq: a chain stops at one of them."""
    links: list[Mapping[str, Any]] = []
    current: SnapshotRecord | None = snap
    expected: tuple[int, str] | None = None  # (seq, sha256) the newer link says its base has
    while True:
        if current is None:
            assert expected is not None
            raise _ChainBroken(expected[0], f"the base at seq {expected[0]} is missing")
        if known is not None and expected is not None and current.seq in known and current.sha256 == expected[1]:
            doc = copy_json(known[current.seq])  # applying links changes it in place
            break
        if current.seq in bad:
            raise _ChainBroken(current.seq, bad[current.seq])
        problem = snapshot_problem(current, key=key, run_id=run_id)
        if problem is None and expected is not None and current.sha256 != expected[1]:
            problem = (f"its sha256 {current.sha256[:12]}... is not the one the next link records as its base "
                       f"({expected[1][:12]}...)")
        if problem is not None:
            raise _ChainBroken(current.seq, problem)
        try:
            doc = codec.loads(current.state)
        except (ValueError, TypeError) as exc:
            raise _ChainBroken(current.seq, f"cannot decode: {exc}") from None
        if current.kind == "full":
            if not isinstance(doc, dict) or doc.get("seq") != current.seq:
                raise _ChainBroken(current.seq, f"snapshot says seq {doc.get('seq') if isinstance(doc, dict) else '?'}, "
                                                f"stored at seq {current.seq}")
            break
        if (not isinstance(doc, dict) or doc.get("incremental") != 1 or doc.get("seq") != current.seq
                or doc.get("base_seq") != current.base_seq or doc.get("base_sha256") != current.base_sha256
                or current.base_seq is None or current.base_sha256 is None or not current.base_seq < current.seq):
            raise _ChainBroken(current.seq, "its link does not match its row (seq or base)")
        links.append(doc)
        expected = (current.base_seq, current.base_sha256)
        current = read(current.base_seq)
    for link in reversed(links):
        try:
            doc = _apply_link(doc, link)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _ChainBroken(link["seq"], f"does not apply to its base: {exc}") from None
    return doc


def resolve_chains(snapshots: Sequence[SnapshotRecord], *, key: bytes | None = None, run_id: str = "",
                   ) -> tuple[list[SnapshotRecord], dict[int, str]]:
    """Every snapshot as a full one (an incremental materialised from its chain, its sha256 that of
    the materialised text), and why each one that cannot be rebuilt was not: for readers that compare
    or copy whole states (``verify``, savepoints, summaries)."""
    by_seq = {s.seq: s for s in snapshots}
    resolved: dict[int, SnapshotRecord] = {}
    problems: dict[int, str] = {}
    # Oldest first, so that each link is applied to its base rebuilt once, not to its whole chain again.
    known: dict[int, dict[str, Any]] = {}
    for snap in sorted(snapshots, key=lambda s: s.seq):
        if snap.kind == "full":
            problem = snapshot_problem(snap, key=key, run_id=run_id)
            if problem is not None:
                problems[snap.seq] = problem
            resolved[snap.seq] = snap
            continue
        try:
            doc = _materialise(by_seq.get, snap, key=key, run_id=run_id, bad={}, known=known)
        except _ChainBroken as broken:
            problems[snap.seq] = (broken.reason if broken.seq == snap.seq
                                  else f"its chain is broken at seq {broken.seq}: {broken.reason}")
            resolved[snap.seq] = snap
            continue
        known.clear()  # only the newest rebuilt link is kept: the next one in a chain builds on it
        known[snap.seq] = doc
        text = codec.canonical_dumps(doc, what="snapshot")
        resolved[snap.seq] = SnapshotRecord(snap.seq, text, hashlib.sha256(text.encode()).hexdigest(),
                                            snap.schema_version, snap.trigger, snap.created_at, "full", None, None,
                                            snap.seq, None)
    return [resolved[s.seq] for s in snapshots], problems


def restore_run(store: Store, run_id: str, reduce: Reduce, *, key: bytes | None = None,
                ) -> tuple[RunState, int, list[tuple[int, str]]]:
    """Newest snapshot that verifies + the events after it. Returns (state, snapshot seq, rejected).

    Only the catalog (no states) is read first; then the states are read one at a time, newest
    first, so a recovery reads exactly one snapshot (one chain, for an incremental) unless the newest
    does not verify. A snapshot the catalog marks ``failed`` or ``quarantined`` is skipped unread,
    and said so in ``rejected``; so is every snapshot whose chain holds a bad link (the bad link
    itself with its own reason). With a signing ``key`` an unsigned or wrongly signed one is bad.
    """
    rejected: list[tuple[int, str]] = []
    folded: RunState | None = None
    snap_seq = 0
    catalog = store.snapshot_catalog(run_id)
    last = store.last_seq(run_id) if catalog else 0
    bad: dict[int, str] = {}
    for info in catalog:
        if info.validity in ("failed", "quarantined"):
            bad[info.seq] = f"marked {info.validity} in the catalog: {info.validity_reason or 'no reason given'}"
    cache: dict[int, SnapshotRecord | None] = {}

    def read(seq: int) -> SnapshotRecord | None:
        if seq not in cache:
            cache[seq] = store.snapshot(run_id, seq)
        return cache[seq]

    def reject(seq: int, problem: str) -> None:
        if all(seq != s for s, _ in rejected):
            _log.warning("run %s: snapshot at seq %d skipped: %s", run_id, seq, problem)
            rejected.append((seq, problem))

    for info in catalog:
        problem: str | None = None
        if info.seq in bad:
            problem = bad[info.seq]
        elif info.seq > last:
            # A snapshot is only valid inside its journal: one past the end (events lost or deleted)
            # would claim history the journal does not hold.
            problem = f"snapshot at seq {info.seq} lies beyond the end of the journal (last event at seq {last})"
        else:
            snap = read(info.seq)
            if snap is None:  # pruned between the two reads: an older one will do
                continue
            try:
                doc = _materialise(read, snap, key=key, run_id=run_id, bad=bad)
                candidate = RunState.from_json(doc)
            except _ChainBroken as broken:
                if broken.seq != info.seq:
                    bad.setdefault(broken.seq, broken.reason)
                    reject(broken.seq, broken.reason)
                    problem = f"its chain is broken at seq {broken.seq}: {broken.reason}"
                else:
                    problem = broken.reason
            except (ValueError, TypeError, KeyError) as exc:
                problem = f"cannot decode: {exc}"
            else:
                folded, snap_seq = candidate, snap.seq
                break
        bad.setdefault(info.seq, problem)
        reject(info.seq, problem)
    events = store.events(run_id, after_seq=folded.seq if folded else 0)
    at: list[Any] = [None, None]  # the event being folded: (seq, kind)

    def decoded() -> Iterator[tuple[int, str, Any]]:
        for event in events:
            at[:] = event.seq, event.kind
            yield event.seq, event.kind, codec.loads(event.data)

    try:
        folded = fold(decoded(), reduce, start=folded)
    except WorkflowError:
        raise  # the code's (a reducer that changed), not the journal's
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        seq, kind = at
        what = f"{type(exc).__name__}: {exc}" if not isinstance(exc, KeyError) else f"a field is missing ({exc})"
        raise JournalDamagedError(
            f"run {run_id!r}: the journal cannot be folded at seq {seq} ({kind}): {what}; it was changed or "
            f"damaged outside agentsaga. `agentsaga verify {run_id}` lists every problem; a savepoint or a fork "
            "from an earlier step recovers the work done before it", run_id=run_id, seq=seq) from exc
    return folded, snap_seq, rejected
