"""The store contract: `store.wakeups`, parking a run until a time. Runs on SQLite and on Postgres.

Claims skipping parked runs are in test_queues.py; `next_due`, `wake` and the Postgres listener are
tested with the worker, in tests/scale/test_wakeups.py.
"""

from __future__ import annotations

import pytest
from store_helpers import T0, new_run

from store import FencedError


def test_park_records_wake_at_and_status_and_can_clear_it(store):
    # Given a leased run
    token = new_run(store, "r1", owner="w1")
    # When it is parked until T0 + 100 while suspended
    store.wakeups.park("r1", token=token, wake_at=T0 + 100, now=T0 + 1, status="suspended")
    # Then wake_at and status are recorded; clearing wake_at works too
    run = store.get_run("r1")
    assert (run.wake_at, run.status, run.updated_at) == (T0 + 100, "suspended", T0 + 1)
    store.wakeups.park("r1", token=token, wake_at=None, now=T0 + 2)
    assert store.get_run("r1").wake_at is None


def test_park_with_a_stale_token_is_fenced(store):
    # Given a run taken over by a second owner
    old = new_run(store, "r1", owner="w1")
    store.leases.acquire("r1", owner="w2", ttl=30, now=T0 + 1, force=True)
    # When the first owner tries to park it
    with pytest.raises(FencedError):
        store.wakeups.park("r1", token=old, wake_at=T0 + 99, now=T0 + 2)
    # Then nothing changed
    assert store.get_run("r1").wake_at is None


def test_wake_moves_only_a_run_in_the_given_statuses(store):
    # Given a parked waiting run and a parked suspended one
    for run_id, status in (("waiting", "waiting"), ("suspended", "suspended")):
        token = new_run(store, run_id, owner="w1")
        store.wakeups.park(run_id, token=token, wake_at=T0 + 100, now=T0, status=status)
    # When both are woken at T0 + 5 (default statuses: waiting only)
    woke = [store.wakeups.wake(run_id, now=T0 + 5) for run_id in ("waiting", "suspended")]
    # Then only the waiting one is claimable from now on
    assert woke == [True, False]
    assert (store.get_run("waiting").wake_at, store.get_run("suspended").wake_at) == (T0 + 5, T0 + 100)
    assert store.wakeups.wake("suspended", now=T0 + 6, statuses=("suspended",)) is True
    assert store.wakeups.wake("ghost", now=T0 + 6) is False


def test_park_releases_the_lease_and_is_due_now_when_an_awaited_signal_is_already_pending(store):
    # Given two leased runs, one with a pending "approval" signal and one with an unrelated signal
    for run_id, name in (("signalled", "approval"), ("other", "newsletter")):
        token = new_run(store, run_id, owner="w1")
        store.signals.send(run_id, name, '{"ok": true}', now=T0)
        # When each parks forever, waiting for "approval", releasing its lease
        due = store.wakeups.park(run_id, token=token, wake_at=1e18, now=T0 + 1, status="waiting", release=True,
                                 unless_signalled=["approval"])
        # Then the lease is gone in the same transaction
        run = store.get_run(run_id)
        assert run.lease_owner is None and run.status == "waiting"
        assert run.wake_at == due
    # And the run whose awaited signal was already there is due at once; the other stays parked
    assert store.get_run("signalled").wake_at == T0 + 1
    assert store.get_run("other").wake_at == 1e18
