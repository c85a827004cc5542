"""The store contract: `store.queues`, workers claiming runs. Runs on SQLite and on Postgres.

Limits on a queue (`claim_from`, `in_flight`) are tested with the worker, in tests/scale/test_limits.py.
"""

from __future__ import annotations

import threading
from collections import Counter

from store_helpers import T0, new_run

from store import open_store


def test_claim_picks_priority_then_age_and_respects_limit(store):
    # Given pending runs of different priorities and ages
    new_run(store, "old-low", owner=None, created_at=T0, priority=0)
    new_run(store, "new-high", owner=None, created_at=T0 + 2, priority=5)
    new_run(store, "old-high", owner=None, created_at=T0 + 1, priority=5)
    new_run(store, "new-low", owner=None, created_at=T0 + 3, priority=0)
    # When a worker claims three
    claimed = store.queues.claim(owner="w1", ttl=30, now=T0 + 10, limit=3)
    # Then it gets the high-priority ones oldest first, then the oldest low one, each leased
    assert [run_id for run_id, _ in claimed] == ["old-high", "new-high", "old-low"]
    for run_id, token in claimed:
        run = store.get_run(run_id)
        assert (run.lease_owner, run.lease_token, run.lease_expires_at) == ("w1", token, T0 + 40)
    assert store.get_run("new-low").lease_owner is None


def test_claim_skips_other_statuses_live_leases_and_sleepers(store):
    # Given runs that must not be claimed, and one of each kind that must
    new_run(store, "done", owner=None, status="completed")
    new_run(store, "leased", owner="w0", ttl=100)
    new_run(store, "sleeping", owner=None, status="suspended")
    token = store.leases.acquire("sleeping", owner="w0", ttl=1, now=T0)
    store.wakeups.park("sleeping", token=token, wake_at=T0 + 50, now=T0)
    store.leases.release("sleeping", token=token, now=T0)
    new_run(store, "pending", owner=None)
    new_run(store, "expired", owner="w0", ttl=5, status="running")
    # When w1 claims pending/running runs at T0 + 10
    claimed = dict(store.queues.claim(owner="w1", ttl=30, now=T0 + 10))
    # Then only the free pending run and the expired running one are taken
    assert set(claimed) == {"pending", "expired"}
    assert store.get_run("expired").recoveries == 1
    assert store.get_run("pending").recoveries == 0
    # And a sleeper is claimable once awake, if its status is asked for
    woke = store.queues.claim(owner="w2", ttl=30, now=T0 + 50, statuses=("suspended",))
    assert [run_id for run_id, _ in woke] == ["sleeping"]


def test_claim_filters_by_queue(store):
    new_run(store, "a", owner=None, queue="fast")
    new_run(store, "b", owner=None, queue="slow")
    new_run(store, "c", owner=None)
    assert store.queues.claim(owner="w", ttl=5, now=T0, queues=["fast"]) == [("a", 1)]
    assert store.queues.claim(owner="w", ttl=5, now=T0, queues=[]) == []
    assert {r for r, _ in store.queues.claim(owner="w", ttl=5, now=T0)} == {"b", "c"}


def test_claim_returns_each_run_to_only_one_of_two_concurrent_workers(db_url):
    # Given 30 pending runs, and two workers with stores of their own on the same database
    stores = [open_store(db_url), open_store(db_url)]
    try:
        for i in range(30):
            new_run(stores[0], f"r{i:02}", owner=None, created_at=T0 + i)
        start = threading.Barrier(2)
        got: list[list[tuple[str, int]]] = [[], []]
        failures: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                start.wait()
                while batch := stores[n].queues.claim(owner=f"w{n}", ttl=60, now=T0 + 100, limit=3):
                    got[n].extend(batch)
            except BaseException as exc:  # surfaced below: a thread's failure must fail the test
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in (0, 1)]
        # When both claim in a loop until nothing is left
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Then every run was claimed exactly once, by the worker the store says leased it
        assert failures == []
        counts = Counter(run_id for batch in got for run_id, _ in batch)
        assert sorted(counts) == [f"r{i:02}" for i in range(30)]
        assert set(counts.values()) == {1}
        for n in (0, 1):
            for run_id, token in got[n]:
                run = stores[0].get_run(run_id)
                assert (run.lease_owner, run.lease_token) == (f"w{n}", token)
    finally:
        for s in stores:
            s.close()
