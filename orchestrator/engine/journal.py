"""Writing a run's journal: the one door through which the engine appends events.

The driver, the saga runner and durable calls inside steps all journal through one
``JournalWriter`` and nothing else: it is the narrow object they share instead of the whole engine.
A commit encodes each event (invariant 8), redacts it (invariant 9), folds it into the run's live
state with the same ``apply`` that a recovery uses, and appends it in one transaction fenced by
the run's lease token (invariant 6). When the batch empties the frontier, ``RunCompleted`` joins
the same transaction; a terminal event sets the run's status and releases the lease in it too; a
snapshot is written in the same transaction when the workflow's snapshot policy asks for one
(``workflows.Snapshots``: every N events, every T seconds, after effects, at gates, adaptive) and
at the end.

Because events are applied from their journal text (encoded, redacted, decoded), the state in
memory is exactly what a recovery would rebuild. When a write fails (the database went away, the
lease was taken over), the run in memory is rebuilt from the journal as it stands and the
``ActiveRun`` is *broken*: every later commit on it raises the same error, so a parallel sibling
cannot append after the gap and no sequence number is skipped. The caller stops driving it; a
resume (or recovery) continues from the journal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.engine.events import TERMINAL_STATUSES
from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, apply
from orchestrator.engine.snapshots import SnapshotMeta, make_snapshot, restore_run
from orchestrator.payload import codec
from orchestrator.payload.redact import JournalRedactor
from store import NewEvent, Store
from workflows import Snapshots, Workflow

__all__ = ["ActiveRun", "JournalWriter", "Observer"]

_log = logging.getLogger("agentsaga.engine")

#: Called after each commit with the run and the events it made durable (progress lines, tracing).
Observer = Callable[["ActiveRun", list[NewEvent]], None]


class ActiveRun:
    """A run this process is driving: its workflow, its lease token and what its journal folds to."""

    __slots__ = ("run_id", "workflow", "token", "folded", "last_snapshot_seq", "snapshot_at", "every", "lock",
                 "broken", "snapshot_bytes", "journal_bytes", "last_snapshot")

    def __init__(self, run_id: str, workflow: Workflow, token: int, folded: RunState, last_snapshot_seq: int, *,
                 snapshot_at: float | None = None, every: int | None = None) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.token = token
        #: the fold of every event journaled so far (the scheduler's position and the user state)
        self.folded = folded
        self.last_snapshot_seq = last_snapshot_seq
        #: when this process last snapshotted the run, or took it (the clock of ``Snapshots(seconds=)``)
        self.snapshot_at = snapshot_at
        #: the interval an adaptive policy chose for this run (None: the policy's ``every``)
        self.every = every
        #: the size of the last snapshot this process wrote (0: unknown), and the bytes journaled
        #: since (``Snapshots(replay_ratio=)``)
        self.snapshot_bytes = 0
        self.journal_bytes = 0
        #: the snapshot the latest commit wrote, for observers (telemetry): {"seq", "trigger",
        #: "bytes", "write_ms"} (making it, and the commit that carried it), else None
        self.last_snapshot: dict[str, Any] | None = None
        # Parallel sync steps run on threads and may journal durable calls from there: one writer
        # at a time per run keeps seq numbers and the folded state consistent. Per run, not per
        # process, so a worker driving several runs on threads commits them concurrently.
        self.lock = threading.RLock()
        #: the error of a failed write; once set, this process no longer appends to the run
        self.broken: BaseException | None = None

    def __repr__(self) -> str:
        return f"<ActiveRun {self.run_id!r} {self.workflow.name!r} seq={self.folded.seq} {self.folded.status}>"


Batch = list[tuple[str, dict[str, Any]]]


class JournalWriter:
    """Appends events to active runs' journals (see the module docstring)."""

    def __init__(self, store: Store, *, clock: Callable[[], float], redact: JournalRedactor, snapshot_every: int,
                 keep_snapshots: int, observers: Iterable[Observer] = ()) -> None:
        self.store = store
        self.clock = clock
        self.redact = redact
        self.snapshot_every = snapshot_every
        self.keep_snapshots = keep_snapshots
        self.observers = tuple(observers)
        self._meta: dict[tuple[str, str, str], SnapshotMeta] = {}
        #: the policy of workflows that declare none
        self.default_policy = Snapshots(every=snapshot_every, keep=keep_snapshots)

    def policy(self, workflow: Workflow) -> Snapshots:
        """When ``workflow``'s runs are snapshotted: its own policy, else the default."""
        return workflow.snapshots or self.default_policy

    def snapshot_meta(self, workflow: Workflow) -> SnapshotMeta:
        """The catalog metadata of ``workflow``'s snapshots written by this writer."""
        key = (workflow.name, workflow.version, workflow.fingerprint)
        meta = self._meta.get(key)
        if meta is None:
            meta = self._meta[key] = SnapshotMeta.of(workflow, self.policy(workflow).to_json())
        return meta

    def commit(self, run: ActiveRun, batch: Batch, *, trigger: str | None = None,
               consume_signals: list[int] | None = None, workflow_version: tuple[str, str] | None = None) -> None:
        """Append ``batch`` (``[(kind, data), ...]``) in one transaction and fold it into ``run``
        (with ``workflow_version``, the run row's version and fingerprint are set in it too)."""
        # Encoded first: a value that cannot be journaled is the caller's error and changes nothing.
        texts = [(kind, self.redact(codec.dumps(data, what=f"{kind} event"))) for kind, data in batch]
        with run.lock:
            if run.broken is not None:
                raise run.broken
            try:
                events = self._append(run, texts, trigger, consume_signals, workflow_version)
            except BaseException as exc:
                run.broken = exc
                self._rebuild(run)
                raise
        for observer in self.observers:
            observer(run, events)

    def _rebuild(self, run: ActiveRun) -> None:
        """After a failed write: the run in memory becomes what its journal holds (best effort: if the
        database cannot be read either, the broken run is left as it is and never written again)."""
        try:
            run.folded, run.last_snapshot_seq, _ = restore_run(self.store, run.run_id, run.workflow.reduce)
        except Exception as exc:  # the database is still away: the run stays broken
            _log.warning("run %s: could not re-read the journal after a failed write: %s", run.run_id, exc)

    def _append(self, run: ActiveRun, texts: list[tuple[str, str]], trigger: str | None,
                consume_signals: list[int] | None, workflow_version: tuple[str, str] | None = None) -> list[NewEvent]:
        now = self.clock()
        folded = run.folded
        reduce = run.workflow.reduce
        before = folded.status
        policy = self.policy(run.workflow)
        events: list[NewEvent] = []
        gate: str | None = None
        effect = False
        for kind, text in texts:
            seq = folded.seq + 1
            data = codec.loads(text)
            apply(folded, seq, kind, data, reduce)
            events.append(NewEvent(seq=seq, kind=kind, data=text, at=now))
            run.journal_bytes += len(text)
            if kind == EventKind.STEP_COMPLETED:
                effect = effect or bool(data.get("effect"))
                if data["step"] in policy.gates:
                    gate = data["step"]
            elif kind == EventKind.CALL_COMPLETED and data.get("effect"):
                effect = True
        if folded.status == "running" and not folded.frontier:
            seq = folded.seq + 1
            apply(folded, seq, EventKind.RUN_COMPLETED, {}, reduce)
            events.append(NewEvent(seq=seq, kind=EventKind.RUN_COMPLETED, data="{}", at=now))
        status: str | None = folded.status if folded.status != before else None
        error: str | None = None
        finished = folded.status in TERMINAL_STATUSES
        if finished:
            status = folded.status  # the run row follows the journal's status in the same transaction
            trigger = trigger or "final"
            if folded.error:
                error = f"{folded.error.get('type')}: {folded.error.get('message')}"
        if trigger is None:
            trigger = _due(policy, run, folded.seq, now, gate, effect)
        snapshot = None
        run.last_snapshot = None
        started = time.perf_counter()
        if trigger is not None:
            snapshot = make_snapshot(folded, trigger, now, self.snapshot_meta(run.workflow))
        self.store.append(
            run.run_id,
            events,
            token=run.token,
            now=now,
            status=status,
            error=error,
            finished=finished,
            snapshot=snapshot,
            keep_snapshots=policy.keep if snapshot is not None else None,
            release_lease=finished,
            consume_signals=consume_signals or (),
            workflow_version=workflow_version,
        )
        if snapshot is not None:
            run.last_snapshot = {"seq": snapshot.seq, "trigger": snapshot.trigger, "bytes": snapshot.size_bytes,
                                 "write_ms": (time.perf_counter() - started) * 1000}
            run.last_snapshot_seq = snapshot.seq
            run.snapshot_at = now
            run.snapshot_bytes = snapshot.size_bytes or 0
            run.journal_bytes = 0
        return events


def _due(policy: Snapshots, run: ActiveRun, seq: int, now: float, gate: str | None, effect: bool) -> str | None:
    """Which condition of ``policy`` asks for a snapshot after this commit (the trigger), if any."""
    if gate is not None:
        return f"gate:{gate}"
    if effect and policy.after_effects:
        return "effect"
    every = run.every if run.every is not None else policy.every
    if every is not None and seq - run.last_snapshot_seq >= every and (
            policy.replay_ratio is None or run.journal_bytes >= policy.replay_ratio * run.snapshot_bytes):
        return "adaptive" if run.every is not None else "periodic"
    if policy.seconds is not None and run.snapshot_at is not None and now - run.snapshot_at >= policy.seconds:
        return "timed"
    return None
