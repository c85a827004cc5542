"""What wakes an idle worker: the store's next due time, and NOTIFY from the runs table's trigger."""

from __future__ import annotations

import time

import pytest

from orchestrator.engine.events import ACTIVE_STATUSES
from store import NewEvent

from .conftest import HANG

T0 = 1_800_000_000.0


def run(store, run_id: str, queue: str | None = "q") -> None:
    store.create_run(run_id=run_id, workflow="w", version="1", fingerprint="f", target="", created_at=T0,
                     events=[NewEvent(1, "RunStarted", "{}", T0)], queue=queue)


def test_next_due_is_the_earliest_lease_expiry_or_timer(store):
    assert store.wakeups.next_due(now=T0, statuses=ACTIVE_STATUSES) is None
    run(store, "a")
    run(store, "b")
    run(store, "c", queue="other")
    # A pending run is claimable now: nothing is "due later"
    assert store.wakeups.next_due(now=T0, statuses=ACTIVE_STATUSES) is None
    # A live lease comes due when it expires; a parked run when its timer does
    [(_, token)] = store.queues.claim(owner="w", ttl=30, now=T0, statuses=ACTIVE_STATUSES, limit=1)
    store.wakeups.park("b", token=0, wake_at=T0 + 12, now=T0, status="waiting")
    assert store.wakeups.next_due(now=T0 + 1, statuses=ACTIVE_STATUSES) == T0 + 12
    assert store.wakeups.next_due(now=T0 + 13, statuses=ACTIVE_STATUSES) == T0 + 30
    # And only the queues asked about count
    assert store.wakeups.next_due(now=T0 + 1, statuses=ACTIVE_STATUSES, queues=["other"]) is None


def heard(store, listener, *, then: str) -> list[str]:
    """What the listener hears from now on, up to the NOTIFY of a new run in queue ``then`` (created
    here as a marker). Postgres delivers notifications in commit order, so this is exactly what
    the actions before the call sent: "nothing" is proved by hearing only the marker, not by a
    quiet wait that a slow machine could outlast."""
    run(store, f"marker-{then}", queue=then)
    got: list[str] = []
    end = time.monotonic() + HANG
    while then not in got:
        assert time.monotonic() < end, f"no NOTIFY for the marker {then!r} within {HANG:g}s; heard {got}"
        got += listener.wait(end - time.monotonic())
    return got


@pytest.mark.postgres
def test_the_runs_trigger_notifies_when_a_run_may_have_become_claimable(pg_url):
    from store import open_store

    with open_store(pg_url) as store:
        listener = store.wakeups.listener()
        try:
            # A new run notifies, with its queue
            run(store, "a")
            assert heard(store, listener, then="m1") == ["q", "m1"]
            # Claiming, renewing and appending do not
            [(_, token)] = store.queues.claim(owner="w", ttl=30, now=T0, statuses=ACTIVE_STATUSES, limit=1,
                                            queues=["q"])
            store.leases.renew("a", token=token, ttl=30, now=T0 + 1)
            store.append("a", [NewEvent(2, "Resumed", "{}", T0 + 1)], token=token, now=T0 + 1)
            assert heard(store, listener, then="m2") == ["m2"]
            # Handing the run back does
            store.leases.release("a", token=token, now=T0 + 2)
            assert heard(store, listener, then="m3") == ["q", "m3"]
            # So does a wake (a signal arrived), and a run with no queue says so with ""
            run(store, "b", queue=None)
            assert heard(store, listener, then="m4") == ["", "m4"]
            store.wakeups.park("b", token=0, wake_at=T0 + 99, now=T0, status="waiting")
            heard(store, listener, then="m5")  # parking b may notify or not: not what this test is about
            assert store.wakeups.wake("b", now=T0 + 3)
            assert heard(store, listener, then="m6") == ["", "m6"]
            # A finished run does not
            [(_, token)] = store.queues.claim(owner="w", ttl=30, now=T0 + 4, statuses=ACTIVE_STATUSES, limit=1,
                                            queues=["q"])
            store.append("a", [NewEvent(3, "RunCompleted", "{}", T0 + 5)], token=token, now=T0 + 5,
                         status="completed", finished=True, release_lease=True)
            assert heard(store, listener, then="m7") == ["m7"]
        finally:
            listener.close()


def test_sqlite_has_nothing_to_listen_to(sqlite_url):
    from store import open_store

    with open_store(sqlite_url) as store:
        assert store.wakeups.listener() is None
