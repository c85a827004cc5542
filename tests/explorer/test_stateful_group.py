"""Hypothesis interleaves drives of a whole group, recoveries, kills, crashes and failed writes.

The runs are the explorer's group (explorer_group.py): three runs of one workflow driven together
in one process, so their completions share ``append_many`` transactions. The moves are: drive every
run that is not finished (start it, or take it over at once), recover the runs whose leases lapsed
(as a worker does), and kill the process between moves. A drive or a recovery can be cut short by a
crash at its n-th crash point, or by its n-th store write failing (nothing written), committing
with its reply lost, refusing its first run's appends (the others written), or meeting a takeover of
its first run's lease. After every move: every run's journal verifies with seqs 1..n, no completed
step ran again, no booking took effect twice, no cancellation happened twice. At the end a fresh
process drives what is left: r1 and r3 completed, r2 compensated, each car booked once and only
r2's cancelled, once.

The profile is derandomized with no example database, as in test_stateful.py.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from explorer_calls import outgoing_calls_instrumented
from explorer_group import (
    RUNS,
    STATUS,
    Group,
    close_group,
    created_runs,
    drive_group,
    new_process,
    run_ids,
)
from explorer_harness import World, make_orchestrator
from explorer_process import CURRENT, LEASE_TTL, T0, Plan, ProcessDied
from explorer_store import run_tag
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from orchestrator.testing import BookingService, FakeClock
from store import StoreError

FAULTS = st.one_of(st.none(), st.tuples(st.sampled_from(["crash", "raise", "lost", "item", "fence"]),
                                        st.integers(1, 24)))
_groups = itertools.count(1)


class GroupInterleavings(RuleBasedStateMachine):
    url: str = ""

    @initialize()
    def start_world(self) -> None:
        self.service = BookingService()
        self.service.start()
        self.world = World(service=self.service, clock=FakeClock(T0))
        self.group = Group(self.world)
        self.ids = run_ids(f"hypgroup-{next(_groups)}")
        self.generation = 0
        self.orc = None
        self._new_process()

    def _new_process(self) -> None:
        if self.orc is not None:
            close_group(self.orc)  # the process is gone: so are its connections and threads
        self.process = new_process(f"gen{self.generation}")
        self.generation += 1
        self.orc = make_orchestrator(self.url, self.process, self.world, [self.group.workflow])

    def _move(self, fault, move) -> None:
        """One move of the current process, cut short by ``fault`` (kind, n-th point or write from now)."""
        if fault is not None:
            what, n = fault
            self.process.plan = Plan(at=(len(self.process.points) if what == "crash" else self.process.writes) + n,
                                     what=what)
            self.process.faulted = None
        token = CURRENT.set(self.process)
        try:
            move()
        except ProcessDied:
            pass
        except StoreError:
            assert self.process.faulted is not None, "a store error that the explorer did not inject"
        finally:
            CURRENT.reset(token)
            self.process.plan = Plan()
        if self.process.dead is not None:
            self._new_process()  # the dead process is left as it is; its writes are fenced off

    # -- the moves ----------------------------------------------------------------------------------
    @rule(fault=FAULTS)
    def drive_every_unfinished_run(self, fault) -> None:
        def move() -> None:
            results = drive_group(self.group, self.world, self.orc, self.process, self.ids)
            for rid, res in results.items():
                if isinstance(res, BaseException) and not isinstance(res, ProcessDied):
                    assert self.process.faulted is not None or self.process.dead is not None, (rid, res)
        self._move(fault, move)

    @rule(fault=FAULTS)
    def recover_once_the_leases_lapsed(self, fault) -> None:
        """A worker's sweep: time passes beyond any lease, and every run it may take is recovered."""
        self.world.clock.advance(LEASE_TTL + 1)
        self._move(fault, self.orc.recover)

    @rule()
    def kill_the_process(self) -> None:
        self.process.dead = "killed between two moves"
        self._new_process()

    # -- what must hold after every move --------------------------------------------------------------
    @invariant()
    def journals_and_world_agree(self) -> None:
        for rid in created_runs(self.orc, self.ids):
            report = self.orc.verify(rid)
            assert report.ok, "\n".join(report.lines())
            seqs = [e["seq"] for e in self.orc.history(rid)]
            assert seqs == list(range(1, len(seqs) + 1)), (rid, seqs)
        assert not self.world.violations, self.world.violations
        ledger = self.service.ledger()
        booked = Counter(json.dumps(e["body"], sort_keys=True) for e in ledger if e["action"] == "book")
        assert all(n == 1 for n in booked.values()), f"a booking took effect twice: {booked}"
        cancelled = Counter(e["id"] for e in ledger if e["action"] == "cancel")
        assert all(n == 1 for n in cancelled.values()), f"a cancellation happened twice: {cancelled}"

    def teardown(self) -> None:
        try:
            if getattr(self, "world", None) is None:
                return
            self._new_process()
            results = drive_group(self.group, self.world, self.orc, self.process, self.ids)
            self.journals_and_world_agree()
            for rid, res in results.items():
                assert not isinstance(res, BaseException), (rid, res)
                assert res.status == STATUS[run_tag(rid)], (rid, res.status, res.error)
            ledger = self.service.ledger()
            cars = {e["id"]: e["body"]["car"] for e in ledger if e["action"] == "book"}
            assert sorted(cars.values()) == list(RUNS), cars
            assert [cars[e["id"]] for e in ledger if e["action"] == "cancel"] == ["r2"], ledger
        finally:
            if getattr(self, "orc", None) is not None:
                close_group(self.orc)
            if getattr(self, "service", None) is not None:
                self.service.stop()


@pytest.mark.slow
def test_interleaved_group_drives_recoveries_kills_crashes_and_failed_group_writes_keep_the_invariants(db_url):
    GroupInterleavings.url = db_url
    with outgoing_calls_instrumented():
        run_state_machine_as_test(GroupInterleavings, settings=settings(
            max_examples=40, stateful_step_count=8, derandomize=True, database=None, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
