"""Group commit: appends from many runs that arrive together share one transaction and one flush.

A process driving hundreds of runs on one event loop would otherwise stop every run for every
commit (the store is synchronous: append, COMMIT, fsync), one run after another. Instead a run's
async commit is folded in memory, handed to a *lane* (a thread with its own store connection),
and awaited: the loop goes on with the other runs meanwhile. A lane takes everything queued when
it gets to it and writes it as one ``store.append_many`` transaction, each run fenced by its own
token and given its own verdict. The run continues only once its own events are durable; an
append that fails breaks its run (as a failed synchronous commit does) before any later append of
that run is written, so no sequence number is ever skipped. New runs go the same way: the
creations queued together are one ``store.create_runs`` transaction (on SQLite the lane is the one
writer, so a creation never waits for the database's lock behind a commit).

The hand-back costs the event loop one wake-up per batch, not one per append: the lane settles
every entry of the batch, then schedules one callback on each waiting loop that resolves all of
that loop's futures. A thread that waits synchronously (a sync commit behind grouped ones, or a
cancelled task letting its write land) waits on the lane's condition, which the lane signals
before it hands anything to a loop, so it never needs the loop to run.

A run always goes to the same lane (by its id), so its appends are written in the order they were
made. SQLite has one writer: one lane. Postgres commits overlap: four lanes (four connections; a
batch there mostly waits on the server, so more lanes in flight shorten each run's wait, and past
four the measured gain is lost in the threads' contention for the interpreter).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import zlib
from typing import Any

from store import Store

__all__ = ["Entry", "GroupCommitter"]

_log = logging.getLogger("agentsaga.engine")
_MAX_BATCH = 512  # entries per transaction
_UNDECIDED = object()


class Entry:
    """One queued write: an append of ``run`` (``create`` False) or a new run (``create`` True);
    once ``settled``, ``error`` is None (durable; ``value`` is what the store answered) or why not."""

    __slots__ = ("create", "error", "future", "item", "run", "settled", "value")

    def __init__(self, run: Any, item: dict[str, Any], create: bool, future: asyncio.Future | None) -> None:
        self.run = run
        self.item = item
        self.create = create
        #: the awaiting task's future (resolved on its loop), or None for a synchronous waiter
        self.future = future
        self.settled = False
        self.error: BaseException | None = None
        self.value: Any = _UNDECIDED


class _Lane:
    def __init__(self, committer: GroupCommitter, store: Store, index: int) -> None:
        self.committer = committer
        self.store = store
        self.index = index
        self.queue: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        #: signalled after each batch is settled (synchronous waiters wait on it)
        self.done = threading.Condition(threading.Lock())

    def submit(self, entry: Entry) -> None:
        if self.thread is None:
            with self.lock:
                if self.thread is None:
                    self.thread = threading.Thread(target=self._loop, name=f"agentsaga-commit-{self.index}",
                                                   daemon=True)
                    self.thread.start()
        self.queue.put(entry)

    def wait(self, entry: Entry) -> None:
        with self.done:
            while not entry.settled:
                self.done.wait()

    def stop(self) -> None:
        with self.lock:
            thread, self.thread = self.thread, None
        if thread is not None:
            self.queue.put(None)
            thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < _MAX_BATCH:
                try:
                    entry = self.queue.get_nowait()
                except queue.Empty:
                    break
                if entry is None:
                    stop = True
                    break
                batch.append(entry)
            try:
                self._write(batch)
            except BaseException:  # noqa: BLE001 (logged, and each waiting run gets an error: a dead lane would hang them)
                _log.exception("group commit: writing a batch of %d entries failed", len(batch))
                failure = RuntimeError("group commit failed; see the log")
                for entry in batch:
                    if entry.value is _UNDECIDED:
                        self._verdict(entry, failure, None)
            self._hand_back(batch)
            if stop:
                return

    def _write(self, batch: list[Entry]) -> None:
        creates = [e for e in batch if e.create]
        if creates:
            try:
                answers: list[Any] = self.store.create_runs([e.item for e in creates])
            except BaseException as exc:  # noqa: BLE001 (the database is away: every new run gets it)
                answers = [exc] * len(creates)
            for entry, answer in zip(creates, answers, strict=True):
                if isinstance(answer, BaseException):
                    self._verdict(entry, answer, None)
                else:
                    self._verdict(entry, None, answer)
        todo = []
        for entry in batch:
            if entry.create:
                continue
            broken = entry.run.broken
            if broken is not None:  # an earlier append of this run failed: nothing after it is written
                self._verdict(entry, broken, None)
            else:
                todo.append(entry)
        if not todo:
            return
        try:
            results: list[BaseException | None] = self.store.append_many([e.item for e in todo])
        except BaseException as exc:  # noqa: BLE001 (the database is away, or a bug: every waiting run gets it)
            results = [exc] * len(todo)
        for entry, outcome in zip(todo, results, strict=True):
            self._verdict(entry, outcome, None)

    def _verdict(self, entry: Entry, error: BaseException | None, value: Any) -> None:
        # Never the run's own lock: a thread may hold it while it waits for this lane (a sync commit
        # behind grouped ones, from inside the run's lock), and the lane must still get through.
        entry.error, entry.value = error, value
        run = entry.run
        if run is not None:
            if error is not None and run.broken is None:
                run.broken = error  # before the lane writes anything else of this run
            self.committer.settled(run)

    def _hand_back(self, batch: list[Entry]) -> None:
        """Mark the batch settled, wake synchronous waiters, then one callback per waiting loop."""
        with self.done:
            for entry in batch:
                entry.settled = True
            self.done.notify_all()
        loops: dict[asyncio.AbstractEventLoop, list[Entry]] = {}
        for entry in batch:
            future = entry.future
            if future is not None:
                loops.setdefault(future.get_loop(), []).append(entry)
        for loop, entries in loops.items():
            try:
                loop.call_soon_threadsafe(_resolve, entries)
            except RuntimeError:  # the loop was closed: nobody awaits these any more
                pass


def _resolve(entries: list[Entry]) -> None:
    """On the waiting loop: every future of the batch gets its entry's verdict."""
    for entry in entries:
        future = entry.future
        if future is None or future.done():  # its task was cancelled meanwhile
            continue
        if entry.error is None:
            future.set_result(entry.value)
        else:
            future.set_exception(entry.error)


class GroupCommitter:
    """The lanes of one JournalWriter (see the module docstring)."""

    def __init__(self, store: Store, lanes: int) -> None:
        self._lanes = [_Lane(self, store, i) for i in range(max(1, lanes))]
        self._lock = threading.Lock()  # guards every run's ``pending`` count

    def _lane(self, run_id: str) -> _Lane:
        lanes = self._lanes
        # A stable hash (``hash`` of a str differs per process): a run's lane is the same in every
        # process and every run of a test, so what is grouped with what can be reproduced.
        return lanes[0] if len(lanes) == 1 else lanes[zlib.crc32(run_id.encode()) % len(lanes)]

    def submit(self, run: Any, item: dict[str, Any], future: asyncio.Future | None = None) -> Entry:
        """Queue ``item`` (``store.append_many``'s shape) for ``run``. With ``future`` (of the
        calling loop) it is resolved once the append is durable or failed; else wait with ``wait``.
        The caller holds ``run.lock`` (so the run's appends are queued in the order they were made)."""
        with self._lock:
            run.pending += 1
        entry = Entry(run, item, False, future)
        self._lane(run.run_id).submit(entry)
        return entry

    def submit_create(self, item: dict[str, Any], future: asyncio.Future) -> Entry:
        """Queue a new run (``store.create_runs``'s item shape); ``future`` gets its lease token or
        its error (``DuplicateRunError``, the database being away)."""
        entry = Entry(None, item, True, future)
        self._lane(item["run_id"]).submit(entry)
        return entry

    def wait(self, entry: Entry) -> None:
        """Block this thread until ``entry`` is settled (never needs an event loop to run)."""
        self._lane(entry.item["run_id"]).wait(entry)

    def has_pending(self, run: Any) -> bool:
        """Whether appends of ``run`` are queued or being written (then the next one must follow them)."""
        with self._lock:
            return run.pending > 0

    def settled(self, run: Any) -> None:
        with self._lock:
            run.pending -= 1

    def close(self) -> None:
        for lane in self._lanes:
            lane.stop()
