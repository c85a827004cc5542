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

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.engine.events import TERMINAL_STATUSES, EventKind
from orchestrator.engine.fold import RunState, apply
from orchestrator.engine.groupcommit import Entry, GroupCommitter
from orchestrator.engine.snapshots import SnapshotChain, SnapshotMeta, restore_run
from orchestrator.engine.views import copy_json
from orchestrator.payload import codec
from orchestrator.payload.redact import JournalRedactor
from store import FencedError, NewEvent, Store, StoreError
from workflows import Snapshots, Workflow, reducers
from workflows.errors import ReducerError

__all__ = ["ActiveRun", "Encoded", "JournalWriter", "Observer", "StepThreads", "UpdateRefused"]

_log = logging.getLogger("agentsaga.engine")

#: Called after each commit with the run and the events it made durable (progress lines, tracing).
Observer = Callable[["ActiveRun", list[NewEvent]], None]


class UpdateRefused(Exception):
    """A step's update cannot be merged into its run's state: a field's reducer raised
    (``error``, a ``workflows.ReducerError``). Found before anything was folded or written, so the
    run is as it was and the step can be failed like any other."""

    def __init__(self, error: ReducerError) -> None:
        self.error = error
        super().__init__(str(error))


class StepThreads:
    """The threads running sync steps of one run (a thread cannot be stopped): how many, and what to
    do once none is left (``when_idle``). A cancelled drive gives the run's lease back through it,
    only once no thread of the run can act any more."""

    __slots__ = ("_lock", "_count", "_idle")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._idle: list[Callable[[], None]] = []

    def enter(self) -> None:
        with self._lock:
            self._count += 1

    def leave(self) -> None:
        with self._lock:
            self._count -= 1
            if self._count:
                return
            idle, self._idle = self._idle, []
        for callback in idle:
            callback()

    def running(self) -> int:
        with self._lock:
            return self._count

    def when_idle(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` now (True) if no thread runs, else when the last one leaves (False)."""
        with self._lock:
            if self._count:
                self._idle.append(callback)
                return False
        callback()
        return True


class ActiveRun:
    """A run this process is driving: its workflow, its lease token and what its journal folds to."""

    __slots__ = ("run_id", "workflow", "token", "folded", "last_snapshot_seq", "snapshot_at", "every", "lock",
                 "broken", "snapshot_bytes", "journal_total", "snapshot_total", "last_snapshot", "pending", "chain",
                 "row_status", "threads", "cancels")

    def __init__(self, run_id: str, workflow: Workflow, token: int, folded: RunState, last_snapshot_seq: int, *,
                 snapshot_at: float | None = None, every: int | None = None) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.token = token
        #: the fold of every event journaled so far (the scheduler's position and the user state)
        self.folded = folded
        #: the run row's status when it may differ from the journal's (a claimed run still 'pending' in
        #: its queue): the next commit writes the journal's status to the row
        self.row_status: str | None = None
        self.last_snapshot_seq = last_snapshot_seq
        #: when this process last snapshotted the run, or took it (the clock of ``Snapshots(seconds=)``)
        self.snapshot_at = snapshot_at
        #: the interval an adaptive policy chose for this run (None: the policy's ``every``)
        self.every = every
        #: the size of the last snapshot this process wrote (0: unknown), and the bytes journaled
        #: since (``Snapshots(replay_ratio=)``)
        self.snapshot_bytes = 0
        #: bytes of event text this process has journaled for the run, and how many of them the
        #: last durable snapshot covers (``journal_bytes`` is the difference)
        self.journal_total = 0
        self.snapshot_total = 0
        #: the snapshot the commit being observed wrote, for observers (telemetry): {"seq", "trigger",
        #: "bytes", "write_ms"} (making it, and the commit that carried it until durable), else None
        self.last_snapshot: dict[str, Any] | None = None
        # Parallel sync steps run on threads and may journal durable calls from there: one writer
        # at a time per run keeps seq numbers and the folded state consistent. Per run, not per
        # process, so a worker driving several runs on threads commits them concurrently.
        self.lock = threading.RLock()
        #: the error of a failed write; once set, this process no longer appends to the run
        self.broken: BaseException | None = None
        #: appends handed to the group committer and not yet settled (while any, every append goes there)
        self.pending = 0
        #: how this process writes the run's snapshots (full, or incremental links of a chain)
        self.chain: SnapshotChain | None = None
        #: the threads running its sync steps (made when the first one starts)
        self.threads: StepThreads | None = None
        #: cancellations of the driving task already pending when its drive began (engine/steps.py)
        self.cancels = 0

    @property
    def journal_bytes(self) -> int:
        """Bytes of event text journaled since the last durable snapshot (``Snapshots(replay_ratio=)``)."""
        return self.journal_total - self.snapshot_total

    def __repr__(self) -> str:
        return f"<ActiveRun {self.run_id!r} {self.workflow.name!r} seq={self.folded.seq} {self.folded.status}>"


class Encoded:
    """An event's data already encoded and redacted for the journal (``JournalWriter.with_parts``):
    a commit takes its text as it is."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


Batch = list[tuple[str, "dict[str, Any] | Encoded"]]


class JournalWriter:
    """Appends events to active runs' journals (see the module docstring)."""

    def __init__(self, store: Store, *, clock: Callable[[], float], redact: JournalRedactor, snapshot_every: int,
                 keep_snapshots: int, observers: Iterable[Observer] = (), signing_key: bytes | None = None,
                 incremental: int | None = 10) -> None:
        self.store = store
        #: the HMAC key snapshots are signed with (and must be signed with to be restored), or None
        self.signing_key = signing_key
        self.clock = clock
        self.redact = redact
        self.snapshot_every = snapshot_every
        self.keep_snapshots = keep_snapshots
        self.observers = tuple(observers)
        self._meta: dict[tuple[str, str, str], SnapshotMeta] = {}
        #: the policy of workflows that declare none
        self.default_policy = Snapshots(every=snapshot_every, keep=keep_snapshots, incremental=incremental)
        #: runs being driven by this process now; with more than one, async commits are grouped
        self.driving = 0
        self._driving_lock = threading.Lock()
        self.committer = GroupCommitter(store, lanes=1 if store.dialect == "sqlite" else 4)
        #: (run_id, lease token) of runs this process gave up while code of them may still run here
        self._revoked: set[tuple[str, int]] = set()

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

    def close(self) -> None:
        self.committer.close()

    def driving_started(self) -> None:
        with self._driving_lock:
            self.driving += 1

    def driving_ended(self) -> None:
        with self._driving_lock:
            self.driving -= 1

    def commit(self, run: ActiveRun, batch: Batch, *, trigger: str | None = None,
               consume_signals: list[int] | None = None, workflow_version: tuple[str, str] | None = None) -> None:
        """Append ``batch`` (``[(kind, data), ...]``) in one transaction and fold it into ``run``
        (with ``workflow_version``, the run row's version and fingerprint are set in it too)."""
        texts = self._encode(batch)
        events, snap, entry = self._start(run, texts, trigger, consume_signals, workflow_version, None)
        if entry is not None:  # earlier appends of this run are still in the group committer: after them
            self._wait_behind(run, entry)
            self._durable(run, snap)
        self._observe(run, events, snap)

    def _encode(self, batch: Batch) -> list[tuple[str, str]]:
        """Encoded and redacted first: a value that cannot be journaled is the caller's error and
        changes nothing."""
        return [(kind, data.text if type(data) is Encoded else self.redact(codec.dumps(data, what=f"{kind} event")))
                for kind, data in batch]

    def with_parts(self, kind: str, data: dict[str, Any], parts: dict[str, str]) -> dict[str, Any] | Encoded:
        """The event ``data`` with, after its keys, the keys of ``parts`` whose values are texts
        already encoded and redacted for the journal (a durable call's request, redacted when the
        call was numbered). The rest is encoded and redacted here and the texts are put after it as
        they are, instead of being decoded, encoded and redacted a second time: a conversation of
        20 KB cost a model call about a millisecond of CPU for that alone.

        The text is what encoding the whole event gives (its keys aside: the parts come last),
        because redaction judges each JSON string by itself and a sensitive key by its own name. Not
        when the user's own patterns are in force (they may match across strings) or a part's key is
        itself a sensitive name: then the whole event is handed back (the parts decoded), to be
        encoded whole."""
        redactor = self.redact.redactor
        if redactor.patterns or any(redactor.is_sensitive(key) for key in parts):
            return {**data, **{key: codec.loads(part) for key, part in parts.items()}}
        text = self.redact(codec.dumps(data, what=f"{kind} event"))
        placed = ",".join(f"{json.dumps(key)}:{part}" for key, part in parts.items())
        return Encoded(f"{text[:-1]},{placed}}}" if data else f"{{{placed}}}")

    def _wait_behind(self, run: ActiveRun, entry: Entry) -> None:
        """Block until ``entry``, queued behind grouped appends of its run, is written; its error breaks the run."""
        self.committer.wait(entry)
        if entry.error is not None:
            self._broke(run)
            raise entry.error

    async def acommit(self, run: ActiveRun, batch: Batch, *, trigger: str | None = None,
                      consume_signals: list[int] | None = None) -> None:
        """``commit`` for async callers: while this process drives several runs, the write joins the
        group committer and the event loop goes on with the other runs until it is durable."""
        texts = self._encode(batch)
        future = asyncio.get_running_loop().create_future() if self.driving > 1 else None
        events, snap, entry = self._start(run, texts, trigger, consume_signals, None, future)
        if entry is not None:
            if entry.future is not None:
                try:
                    await entry.future
                except asyncio.CancelledError:
                    # The append is on its way: let it land or fail before the cancellation goes on,
                    # as a synchronous commit would have (the run in memory must match what is written).
                    self.committer.wait(entry)
                    if entry.error is not None:
                        self._broke(run)
                    else:
                        self._durable(run, snap)
                    raise
                except BaseException:
                    self._broke(run)
                    raise
            else:  # not grouped itself, but behind grouped appends of its run
                self._wait_behind(run, entry)
            self._durable(run, snap)
        self._observe(run, events, snap)

    async def acreate(self, item: dict[str, Any]) -> int:
        """``store.create_run(**item)`` through the group committer: the new run's first transaction
        is shared with the others created (or committed) meanwhile; returns its lease token."""
        future = asyncio.get_running_loop().create_future()
        entry = self.committer.submit_create(item, future)
        try:
            return await future
        except asyncio.CancelledError:
            self.committer.wait(entry)  # the run is created or not; only then does the cancellation go on
            if entry.error is None and item.get("lease_owner") is not None:
                # Created, leased to this process, and now nobody drives it: give the lease back at once,
                # so that recover, a worker or another process continues it without waiting for expiry.
                try:
                    self.store.leases.release(item["run_id"], token=entry.value, now=self.clock())
                except StoreError as exc:
                    _log.warning("run %s: created, then cancelled; its lease could not be given back (it expires "
                                 "on its own): %s", item["run_id"], exc)
            raise

    def _observe(self, run: ActiveRun, events: list[NewEvent], snap: dict[str, Any] | None) -> None:
        run.last_snapshot = None if snap is None else {k: snap[k] for k in ("seq", "trigger", "bytes", "write_ms")}
        for observer in self.observers:
            observer(run, events)

    def revoke(self, run_id: str, token: int) -> None:
        """This process gives run ``run_id`` up under lease ``token`` while code of it may still run
        here (a worker stopping while a step is stuck inline or runs on a thread): from now on every
        commit of it made here raises ``FencedError``, as one after a takeover would, so a step that
        returns late journals nothing. Appends already handed to the group committer still land."""
        self._revoked.add((run_id, token))

    def _start(self, run: ActiveRun, texts: list[tuple[str, str]], trigger: str | None,
               consume_signals: list[int] | None, workflow_version: tuple[str, str] | None,
               future: asyncio.Future | None) -> tuple[list[NewEvent], dict[str, Any] | None, Entry | None]:
        """Fold the events into ``run`` and write them now, or hand them to the group committer (with
        ``future``, which the committer resolves; or when earlier appends of the run are still there:
        then the caller waits for the entry returned). Appends of one run are written in the order
        made. Returns the events, what the snapshot bookkeeping becomes once durable, and the entry."""
        with run.lock:
            if run.broken is not None:
                raise run.broken
            if (run.run_id, run.token) in self._revoked:
                raise FencedError(f"run {run.run_id!r}: this process gave the run up under lease token {run.token} "
                                  "(its worker stopped while this step still ran); nothing more of it is "
                                  "journaled here", run_id=run.run_id, token=run.token)
            try:
                events, item, snap = self._prepare(run, texts, trigger, consume_signals, workflow_version)
            except UpdateRefused:
                raise  # refused before anything was folded: the run is as it was
            except BaseException as exc:
                run.broken = exc
                self._rebuild(run)
                raise
            try:
                if future is not None or self.committer.has_pending(run):
                    return events, snap, self.committer.submit(run, item, future)
                self.store.append(item.pop("run_id"), item.pop("events"), **item)
                self._durable(run, snap)
            except BaseException as exc:
                run.broken = exc
                self._rebuild(run)
                raise
        return events, snap, None

    def _durable(self, run: ActiveRun, snap: dict[str, Any] | None) -> None:
        """The commit that carried ``snap`` is durable: the run's snapshot bookkeeping follows it (never
        before: a grouped write may still fail). A later snapshot already settled wins."""
        if snap is None:
            return
        with run.lock:
            snap["write_ms"] = (time.perf_counter() - snap.pop("started")) * 1000
            if snap["seq"] < run.last_snapshot_seq:
                return
            run.last_snapshot_seq = snap["seq"]
            run.snapshot_at = snap["now"]
            run.snapshot_bytes = snap["bytes"] or 0
            run.snapshot_total = max(run.snapshot_total, snap["total"])

    def _broke(self, run: ActiveRun) -> None:
        """A grouped append failed (the committer marked the run broken): the run in memory becomes
        what its journal holds."""
        with run.lock:
            self._rebuild(run)

    def _rebuild(self, run: ActiveRun) -> None:
        """After a failed write: the run in memory becomes what its journal holds (best effort: if the
        database cannot be read either, the broken run is left as it is and never written again)."""
        try:
            run.folded, run.last_snapshot_seq, _ = restore_run(self.store, run.run_id, run.workflow.reduce,
                                                               key=self.signing_key)
            run.chain = None  # the next snapshot starts a chain from what the journal holds
        except Exception as exc:  # the database is still away: the run stays broken
            _log.warning("run %s: could not re-read the journal after a failed write: %s", run.run_id, exc)

    def _prepare(self, run: ActiveRun, texts: list[tuple[str, str]], trigger: str | None,
                 consume_signals: list[int] | None, workflow_version: tuple[str, str] | None,
                 ) -> tuple[list[NewEvent], dict[str, Any], dict[str, Any] | None]:
        """Fold the events into ``run`` and build the append (``store.append_many``'s item shape) with
        its snapshot, as the workflow's policy asks; the run's snapshot bookkeeping is left to
        ``_durable`` once the append is written."""
        now = self.clock()
        folded = run.folded
        before = folded.status
        policy = self.policy(run.workflow)
        chain = run.chain
        if chain is None or chain.full_every != (policy.incremental or 0):
            chain = run.chain = SnapshotChain(run.workflow.reduce, run.workflow.reducers, policy.incremental)
        reduce = chain.reduce  # the workflow's reducers, noting the fields they touch
        events: list[NewEvent] = []
        gate: str | None = None
        effect = False
        decoded = [codec.loads(text) for _, text in texts]
        for (kind, _), data in zip(texts, decoded):
            if kind == EventKind.STEP_COMPLETED:
                _check_merge(run.workflow, folded, data)
        for (kind, text), data in zip(texts, decoded):
            seq = folded.seq + 1
            apply(folded, seq, kind, data, reduce)
            events.append(NewEvent(seq=seq, kind=kind, data=text, at=now))
            run.journal_total += len(text)
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
        if run.row_status is not None:
            if status is None and run.row_status != folded.status:
                status = folded.status  # the row follows the journal (a queued run a worker now drives)
            run.row_status = None
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
        snap: dict[str, Any] | None = None
        if trigger is not None:
            started = time.perf_counter()
            snapshot = chain.make(folded, trigger, now, self.snapshot_meta(run.workflow), run_id=run.run_id,
                                  key=self.signing_key)
            snap = {"seq": snapshot.seq, "trigger": snapshot.trigger, "bytes": snapshot.size_bytes, "now": now,
                    "total": run.journal_total, "started": started}
        item = {"run_id": run.run_id, "events": events, "token": run.token, "now": now, "status": status,
                "error": error, "finished": finished, "snapshot": snapshot,
                "keep_snapshots": policy.keep if snapshot is not None else None,
                "release_lease": finished, "consume_signals": consume_signals or (),
                "workflow_version": workflow_version}
        return events, item, snap


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


#: Reducers known to build a new value without changing the values they are given (workflows.reducers).
PURE_REDUCERS = (reducers.replace, reducers.append, reducers.extend, reducers.add, reducers.merge)


def _check_merge(wf: Workflow, folded: RunState, data: dict[str, Any]) -> None:
    """Raise ``UpdateRefused`` when the ``StepCompleted`` ``data`` would end its tick with a merge that
    fails, without changing anything: the updates of the tick's steps are merged, in frontier order as
    the fold does, into copies of the fields that have a reducer (a replaced field cannot fail). A
    tick that other steps have still to complete is checked when its last step completes."""
    reducers_of = wf.reducers
    if not reducers_of:
        return
    step, frontier = data["step"], folded.frontier
    if step not in frontier:
        return
    updates: list[dict[str, Any]] = []
    for name in frontier:
        if name == step:
            update = data["update"]
        else:
            entry = folded.done.get(name)
            if entry is None:
                return
            update = entry["update"]
        if update:
            updates.append(update)
    keys = {key for update in updates for key in update if key in reducers_of}
    if not keys:
        return
    state = {key: folded.state[key] if reducers_of[key] in PURE_REDUCERS else copy_json(folded.state[key])
             for key in keys if key in folded.state}
    for update in updates:
        part = {key: value if reducers_of[key] in PURE_REDUCERS else copy_json(value)
                for key, value in update.items() if key in keys}
        try:
            wf.reduce(state, part)
        except ReducerError as exc:
            raise UpdateRefused(exc) from exc
