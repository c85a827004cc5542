"""What wakes an idle worker: the store's next due time, and NOTIFY from the runs table's trigger."""

from __future__ import annotations

import pytest

from orchestrator.engine import ACTIVE_STATUSES
from store import NewEvent

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


@pytest.mark.postgres
def test_the_runs_trigger_notifies_when_a_run_may_have_become_claimable(pg_url):
    from store import open_store

    with open_store(pg_url) as store:
        listener = store.wakeups.listener()
        try:
            # A new run notifies, with its queue
            run(store, "a")
            assert listener.wait(2.0) == ["q"]
            # Claiming, renewing and appending do not
            [(_, token)] = store.queues.claim(owner="w", ttl=30, now=T0, statuses=ACTIVE_STATUSES, limit=1)
            store.leases.renew("a", token=token, ttl=30, now=T0 + 1)
            store.append("a", [NewEvent(2, "Resumed", "{}", T0 + 1)], token=token, now=T0 + 1)
            assert listener.wait(0.3) == []
            # Handing the run back does
            store.leases.release("a", token=token, now=T0 + 2)
            assert listener.wait(2.0) == ["q"]
            # So does a wake (a signal arrived), and a run with no queue says so with ""
            run(store, "b", queue=None)
            assert listener.wait(2.0) == [""]
            store.wakeups.park("b", token=0, wake_at=T0 + 99, now=T0, status="waiting")
            listener.wait(0.3)
            assert store.wakeups.wake("b", now=T0 + 3)
            assert listener.wait(2.0) == [""]
            # A finished run does not
            [(_, token)] = store.queues.claim(owner="w", ttl=30, now=T0 + 4, statuses=ACTIVE_STATUSES, limit=1,
                                            queues=["q"])
            store.append("a", [NewEvent(3, "RunCompleted", "{}", T0 + 5)], token=token, now=T0 + 5,
                         status="completed", finished=True, release_lease=True)
            assert listener.wait(0.3) == []
        finally:
            listener.close()


def test_sqlite_has_nothing_to_listen_to(sqlite_url):
    from store import open_store

    with open_store(sqlite_url) as store:
        assert store.wakeups.listener() is None
