"""Driving one run tick by tick until it ends, parks, or its lease is lost.

A tick runs the frontier's steps (concurrently when there are several, each completion committed
as soon as that step finishes: a finished parallel branch is never lost because a sibling crashed
later). A step that gives up with no failure route fails the run, or starts its saga when
completed effects must be undone first; a step that waits parks the run (its lease goes, claims
skip it until its wake-up time or a signal).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from orchestrator.engine.collector import COLLECTOR
from orchestrator.engine.durable import Suspend
from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, awaited_names
from orchestrator.engine.journal import ActiveRun, JournalWriter
from orchestrator.engine.leases import Heartbeat
from orchestrator.engine.saga import SagaRunner, has_pending_effects, in_doubt_error
from orchestrator.engine.steps import GaveUp, StepRunner, cancelling
from store import FencedError, Store, StoreError

__all__ = ["Driver"]

_log = logging.getLogger("agentsaga.engine")


class Driver:
    """Drives active runs: the tick loop, failure handling and parking."""

    def __init__(self, journal: JournalWriter, steps: StepRunner, saga: SagaRunner, heartbeat: Heartbeat, *,
                 store: Store, clock: Callable[[], float], gc_young: int | None = None) -> None:
        self.journal = journal
        self.steps = steps
        self.saga = saga
        self.heartbeat = heartbeat
        self.store = store
        self.clock = clock
        #: the collector's young threshold while this drives (``engine/collector.py``)
        self.gc_young = gc_young

    async def drive(self, run: ActiveRun) -> RunState:
        """Run ticks until the run ends. Raises store errors (fenced, unavailable) to the caller.

        Cancelled (the task awaiting it was), the run is given back: each step running journals how
        far it got (``StepRunner.cancelled``), and the lease is released at once, or, while a sync
        step of the run still runs on a thread that cannot be stopped, as soon as the last such
        thread ends (the heartbeat keeps renewing it until then). The run stays resumable, as it is in
        its journal; the ``CancelledError`` goes on to the caller."""
        hb = self.heartbeat
        hb.hold(run.run_id, run.token)
        self.journal.driving_started()
        COLLECTOR.enter(self.gc_young)
        run.cancels = cancelling()
        keep_lease = False
        try:
            while run.folded.status in ("running", "compensating"):
                if hb.lost(run.run_id):
                    raise FencedError(f"lease on run {run.run_id!r} was taken over; abandoning it")
                if run.folded.status == "compensating":
                    await self.saga.run(run)
                    continue
                pending = run.folded.pending
                if not pending:  # a frontier that emptied without its RunCompleted being written
                    self.journal.commit(run, [])
                    continue
                outcomes = await self._tick(run, pending)
                failures = [o for o in outcomes if isinstance(o, GaveUp)]
                if failures:
                    self._fail(run, failures)
                    continue
                waits = [o for o in outcomes if isinstance(o, Suspend)]
                if waits:
                    self.park(run, min(w.wake_at for w in waits))
                    break
        except asyncio.CancelledError:
            keep_lease = self._give_back(run)
            raise
        finally:
            self.journal.driving_ended()
            COLLECTOR.leave(self.gc_young)
            if not keep_lease:
                hb.drop(run.run_id)
        return run.folded

    def _give_back(self, run: ActiveRun) -> bool:
        """The drive was cancelled: release the run's lease now, or once the last thread running a
        sync step of the run ends. True when the lease is kept for now (the heartbeat goes on)."""
        if run.folded.status not in ("running", "compensating"):
            return False  # ended or parked: its lease went with that
        # (A lease taken over meanwhile makes the release below a no-op: it is fenced.)
        threads = run.threads
        if threads is None:
            self._release(run)
            return False
        return not threads.when_idle(lambda: self._release(run))

    def _release(self, run: ActiveRun) -> None:
        """Stop renewing the lease (unless the run is driven here again, under a newer one) and give
        it back; called on the loop, or on the last step thread of the run as it ends."""
        self.heartbeat.drop(run.run_id, token=run.token)
        try:
            self.store.leases.release(run.run_id, token=run.token, now=self.clock())
        except StoreError as exc:  # fenced (taken over meanwhile) or the database is away: it expires on its own
            _log.info("run %s: cancelled; its lease was not given back: %s", run.run_id, exc)

    async def _tick(self, run: ActiveRun, pending: list[str]) -> list[BaseException | None]:
        """Run the pending steps of the tick; what each ended with (None, GaveUp or Suspend)."""
        if len(pending) == 1:
            try:
                await self.steps.run(run, pending[0], offload=False)
            except (GaveUp, Suspend) as stopped:
                return [stopped]
            return [None]
        return await self._parallel(run, pending)

    async def _parallel(self, run: ActiveRun, pending: list[str]) -> list[BaseException | None]:
        # (Apart from _tick: the generator below makes ``run`` a closure cell, held by every waiting step.)
        results = await asyncio.gather(*(self.steps.run(run, name, offload=True) for name in pending),
                                       return_exceptions=True)
        # Anything but a step giving up or waiting (fencing, the store, cancellation) stops the drive.
        for outcome in results:
            if isinstance(outcome, BaseException) and not isinstance(outcome, (GaveUp, Suspend)):
                raise outcome
        return list(results)

    def park(self, run: ActiveRun, wake_at: float) -> None:
        """The run waits: claims skip it until ``wake_at`` (or a signal wakes it); the lease goes.

        One transaction, which also looks for a signal the run waits for that is already pending (sent
        between the step's look and now): then the run is due at once, never parked forever."""
        awaited = awaited_names(run.folded)
        self.store.wakeups.park(run.run_id, token=run.token, wake_at=wake_at, now=self.clock(), release=True,
                                unless_signalled=awaited)

    def _fail(self, run: ActiveRun, failures: list[GaveUp]) -> None:
        """Steps gave up with no failure route: the run fails (its saga compensates first).

        The steps' final failures and the run's are one transaction: either all are journaled or
        none, so a resume never runs a step that had given up as one more attempt."""
        first = failures[0]
        error = _summary(first.error)
        batch: list[tuple[str, dict[str, Any]]] = [(EventKind.STEP_FAILED, f.event) for f in failures]
        doubts = [*run.folded.doubts, *({"step": f.step, **f.event["doubt"]} for f in failures if f.event.get("doubt"))]
        if has_pending_effects(run.folded):
            # The saga runs next in drive(), so a crash from here on resumes it; it lists the doubts.
            batch.append((EventKind.SAGA_STARTED, {"reason": "failure", "after_seq": 0, "step": first.step,
                                                   "error": error}))
        elif doubts:
            # Nothing to compensate, but an effect may stand: the run's outcome says so, loudly.
            batch.append((EventKind.RUN_FAILED, {"step": first.step, "error": in_doubt_error(first.step, error, doubts),
                                                 "in_doubt": [_doubt_entry(d) for d in doubts]}))
        else:
            batch.append((EventKind.RUN_FAILED, {"step": first.step, "error": error}))
        self.journal.commit(run, batch)


def _summary(error: dict[str, Any]) -> dict[str, Any]:
    return {"type": error.get("type"), "message": error.get("message")}


def _doubt_entry(doubt: dict[str, Any]) -> dict[str, Any]:
    return {"step": doubt.get("step"), "key": doubt.get("key"), "reason": doubt.get("reason")}
