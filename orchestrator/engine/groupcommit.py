"""Group commit: appends from many runs that arrive together share one transaction and one flush.

A process driving hundreds of runs on one event loop would otherwise stop every run for every
commit (the store is synchronous: append, COMMIT, fsync), one run after another. Instead a run's
async commit is folded in memory, handed to a *lane* (a thread with its own store connection),
and awaited: the loop goes on with the other runs meanwhile. A lane takes everything queued when
it gets to it and writes it as one ``store.append_many`` transaction, each run fenced by its own
token and given its own verdict. The run continues only once its own events are durable; an
append that fails breaks its run (as a failed synchronous commit does) before any later append of
that run is written, so no sequence number is ever skipped.

A run always goes to the same lane (by its id), so its appends are written in the order they were
made. SQLite has one writer: one lane. Postgres commits overlap: two lanes (two connections).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from typing import Any

from store import Store

__all__ = ["GroupCommitter"]

_log = logging.getLogger("agentsaga.engine")
_MAX_BATCH = 512  # appends per transaction


class _Lane:
    def __init__(self, committer: GroupCommitter, store: Store, index: int) -> None:
        self.committer = committer
        self.store = store
        self.index = index
        self.queue: queue.SimpleQueue[tuple[Any, dict[str, Any], concurrent.futures.Future] | None] = \
            queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def submit(self, run: Any, item: dict[str, Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        # Running from the start: an append on its way cannot be called off (cancelling an awaiting
        # task must not cancel the write, which lands or fails like any other).
        future.set_running_or_notify_cancel()
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name=f"agentsaga-commit-{self.index}", daemon=True)
                self.thread.start()
        self.queue.put((run, item, future))
        return future

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
                _log.exception("group commit: writing a batch of %d append(s) failed", len(batch))
                for run, _item, future in batch:
                    if not future.done():
                        self._settle(run, future, RuntimeError("group commit failed; see the log"))
            if stop:
                return

    def _write(self, batch: list[tuple[Any, dict[str, Any], concurrent.futures.Future]]) -> None:
        todo = []
        for run, item, future in batch:
            broken = run.broken
            if broken is not None:  # an earlier append of this run failed: nothing after it is written
                self._settle(run, future, broken)
            else:
                todo.append((run, item, future))
        if not todo:
            return
        try:
            results: list[BaseException | None] = self.store.append_many([item for _, item, _ in todo])
        except BaseException as exc:  # noqa: BLE001 (the database is away, or a bug: every waiting run gets it)
            results = [exc] * len(todo)
        for (run, _item, future), outcome in zip(todo, results, strict=True):
            self._settle(run, future, outcome)

    def _settle(self, run: Any, future: concurrent.futures.Future, outcome: BaseException | None) -> None:
        # Never the run's own lock: a thread may hold it while it waits for this lane (a sync commit
        # behind grouped ones, from inside the run's lock), and the lane must still get through.
        if outcome is not None and run.broken is None:
            run.broken = outcome  # before the lane writes anything else of this run
        self.committer.settled(run)
        if outcome is None:
            future.set_result(None)
        else:
            future.set_exception(outcome)


class GroupCommitter:
    """The lanes of one JournalWriter (see the module docstring)."""

    def __init__(self, store: Store, lanes: int) -> None:
        self._lanes = [_Lane(self, store, i) for i in range(max(1, lanes))]
        self._lock = threading.Lock()  # guards every run's ``pending`` count

    def submit(self, run: Any, item: dict[str, Any]) -> concurrent.futures.Future:
        """Queue ``item`` (``store.append_many``'s shape) for ``run``; the future says when it is durable.
        The caller holds ``run.lock`` (so the run's appends are queued in the order they were made)."""
        with self._lock:
            run.pending += 1
        lane = self._lanes[hash(run.run_id) % len(self._lanes)]
        return lane.submit(run, item)

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
