"""Hypothesis interleaves signals, timers, retries, rollbacks, crashes and failed writes on one run.

The run is the explorer's approval flow (a draft whose writer fails once and is retried, a hold at
a hotel, a wait for a signal, a durable timer, a publication). The rules are what the outside world
and the processes can do, in any order: resume the run, send the approval signal (even before the
run waits for it, or twice), let time pass, roll back to the draft with new feedback, recover every
run once the leases lapsed (as a worker does), cancel the run with compensation, and kill the
process between two moves. Any move but the clock may also be cut short by a crash at its n-th
crash point or by a store write that fails once or loses its reply. After every move the journal
verifies, no completed step ran again, no booking took effect twice and no cancellation happened
twice; at the end a fresh process drives the run to its end: cancelled, every hold undone once; or
completed, every draft that was rolled back had its hold cancelled exactly once, the last draft's
hold stands and was published once.

The profile is derandomized with a fixed seed (``settings(derandomize=True)``, no example
database), so CI explores the same interleavings on every run; a failure prints the steps.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from explorer_calls import outgoing_calls_instrumented
from explorer_flows import Approval
from explorer_harness import World, abandon, make_orchestrator
from explorer_process import CURRENT, LEASE_TTL, T0, Plan, Process, ProcessDied
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from orchestrator import RunStateError
from orchestrator.engine import TERMINAL_STATUSES
from orchestrator.testing import BookingService, FakeClock
from store import RunNotFoundError, StoreUnavailableError

FAULTS = st.one_of(st.none(), st.tuples(st.sampled_from(["crash", "raise", "lost"]), st.integers(1, 14)))
_runs = itertools.count(1)


class Interleavings(RuleBasedStateMachine):
    url: str = ""

    @initialize()
    def start_world(self) -> None:
        self.service = BookingService()
        self.service.start()
        self.world = World(service=self.service, clock=FakeClock(T0))
        self.flow = Approval(self.world)
        self.run_id = f"hyp-{next(_runs)}"
        self.rollbacks = 0
        self.generation = 0
        self.orcs = []
        self.signals_sent = 0
        self.cancel_tried = False
        self._new_process()

    def _new_process(self) -> None:
        if self.orcs:
            # The process is gone: so are its connections (the server sees them drop, as on a real death).
            abandon(self.orcs.pop())
        self.process = Process(f"gen{self.generation}")
        self.generation += 1
        self.orc = make_orchestrator(self.url, self.process, self.world, [self.flow.workflow])
        self.orcs.append(self.orc)

    def _move(self, fault, move) -> None:
        """One move of the current process, cut short by ``fault`` (kind, n-th crash point from now)."""
        if fault is not None:
            what, n = fault
            self.process.plan = Plan(at=len(self.process.points) + n, what=what)
            self.process.faulted = None
        token = CURRENT.set(self.process)
        try:
            move()
        except ProcessDied:
            self._new_process()  # the dead process is left as it is; its writes are fenced off
        except StoreUnavailableError:
            assert self.process.faulted is not None, "a store error that the explorer did not inject"
        except RunStateError:
            pass  # the move does not apply to the run as it is now (it ended, or is compensating)
        finally:
            CURRENT.reset(token)
            self.process.plan = Plan()

    def _status(self) -> str | None:
        try:
            return self.orc.store.get_run(self.run_id).status
        except RunNotFoundError:
            return None

    # -- the moves ----------------------------------------------------------------------------------
    @rule(fault=FAULTS)
    def resume(self, fault) -> None:
        def move() -> None:
            if self._status() is None:
                self.orc.run(self.flow.workflow, {}, run_id=self.run_id)
            else:
                self.orc.resume(self.run_id)
        self._move(fault, move)

    @rule(fault=FAULTS)
    def send_approval(self, fault) -> None:
        if self._status() is None:
            return

        def move() -> None:
            self.orc.signal(self.run_id, "approval", {"by": "ann"})
        self.signals_sent += 1  # counted as tried: a send cut short may or may not have been stored
        self._move(fault, move)

    @rule(seconds=st.sampled_from([1.0, 30.0, 61.0]))
    def time_passes(self, seconds: float) -> None:
        self.world.clock.advance(seconds)

    @rule(fault=FAULTS)
    def roll_back_to_the_draft(self, fault) -> None:
        if self._status() != "waiting":
            return
        feedback = self.rollbacks + 1

        def move() -> None:
            self.orc.rollback(self.run_id, to="draft", input={"feedback": feedback})
        self.rollbacks = feedback  # a rollback cut short may or may not have been journaled
        self._move(fault, move)

    @rule(fault=FAULTS)
    def recover_once_the_lease_lapsed(self, fault) -> None:
        """A worker's sweep: time passes beyond any lease, and every run it may take is recovered."""
        if self._status() is None:
            return
        self.world.clock.advance(LEASE_TTL + 1)
        generation = self.generation
        self._move(fault, self.orc.recover)
        if self.generation == generation and self.process.faulted is None:
            # A sweep that ran to its end left no run behind that it could take: every lease had
            # lapsed, so the run is finished, or parked waiting for what it waits for.
            status = self._status()
            assert status in TERMINAL_STATUSES or status == "waiting", f"recover left the run {status}"

    @rule(fault=FAULTS)
    def cancel_with_compensation(self, fault) -> None:
        status = self._status()
        if status is None or status in TERMINAL_STATUSES:
            return
        self.cancel_tried = True  # a cancel cut short may or may not have been journaled

        def move() -> None:
            self.orc.cancel(self.run_id, reason="the client left", compensate=True)
        self._move(fault, move)

    @rule()
    def kill_the_process(self) -> None:
        self.process.dead = "killed between two moves"
        self._new_process()

    # -- what must hold after every move --------------------------------------------------------------
    @invariant()
    def journal_and_world_agree(self) -> None:
        if self._status() is None:
            return
        report = self.orc.verify(self.run_id)
        assert report.ok, "\n".join(report.lines())
        assert not self.world.violations, self.world.violations
        ledger = self.service.ledger()
        booked = Counter(json.dumps(e["body"], sort_keys=True) for e in ledger if e["action"] == "book")
        assert all(n == 1 for n in booked.values()), f"a booking took effect twice: {booked}"
        cancelled = Counter(e["id"] for e in ledger if e["action"] == "cancel")
        assert all(n == 1 for n in cancelled.values()), f"a cancellation happened twice: {cancelled}"
        received = [e["data"]["signal"] for e in self.orc.history(self.run_id) if e["kind"] == "SignalReceived"]
        assert len(received) == len(set(received)), f"a signal was consumed twice: {received}"
        assert len(received) <= self.signals_sent, f"{len(received)} signals consumed, {self.signals_sent} sent"

    def teardown(self) -> None:
        try:
            if getattr(self, "world", None) is None:
                return
            if self._status() is not None:
                self._finish()
        finally:
            for orc in getattr(self, "orcs", []):
                abandon(orc)
            self.service.stop()

    def _finish(self) -> None:
        """A fresh process drives the run to its end, answering what it waits for."""
        self._new_process()
        token = CURRENT.set(self.process)
        try:
            result = self.orc.resume(self.run_id)
            for _ in range(10):
                if result.status != "waiting":
                    break
                last = [e for e in self.orc.history(self.run_id) if e["kind"] in ("WaitStarted", "TimerStarted")][-1]
                if last["kind"] == "TimerStarted":
                    self.world.clock.now = max(self.world.clock.now, last["data"]["wake_at"])
                elif not self.orc.store.signals.pending(self.run_id, "approval"):
                    self.orc.signal(self.run_id, "approval", {"by": "ann"})
                    self.signals_sent += 1
                result = self.orc.resume(self.run_id)
        finally:
            CURRENT.reset(token)
        self.journal_and_world_agree()
        ledger = self.service.ledger()
        holds = {e["body"]["hold"]: e["id"] for e in ledger if e["action"] == "book" and "hold" in e["body"]}
        cancelled = {e["id"] for e in ledger if e["action"] == "cancel"}
        if self.cancel_tried and result.status == "cancelled":
            # Cancelled with compensation: every hold ever made is undone, each once.
            assert set(holds.values()) <= cancelled, (holds, cancelled)
            return
        assert result.status == "completed", (result.status, result.error)
        draft = result.state["draft"]
        # Every hold of a draft that was rolled back was cancelled; the last draft's hold stands.
        assert {v for v, i in holds.items() if i in cancelled} == set(holds) - {draft}, (holds, cancelled, draft)
        published = [e["body"]["publish"] for e in ledger if e["action"] == "book" and "publish" in e["body"]]
        assert published == [draft]
        assert result.state["approved_by"] == "ann" and result.state["cooled"] is True


@pytest.mark.slow
def test_interleaved_signals_timers_retries_rollbacks_crashes_and_failed_writes_keep_the_invariants(db_url):
    Interleavings.url = db_url
    with outgoing_calls_instrumented():
        run_state_machine_as_test(Interleavings, settings=settings(
            max_examples=40, stateful_step_count=20, derandomize=True, database=None, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
