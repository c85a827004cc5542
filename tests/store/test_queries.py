"""The store contract: listing and counting runs. Runs on SQLite and on Postgres."""

from __future__ import annotations

from store_helpers import T0, new_run


def _ids(runs):
    return [r.run_id for r in runs]


def test_list_runs_filters_orders_and_pages(store):
    # Given runs of two workflows and statuses; r3 and r4 share a created_at
    new_run(store, "r1", owner=None, created_at=T0 + 1, workflow="a", status="completed")
    new_run(store, "r2", owner=None, created_at=T0 + 2, workflow="b", status="running")
    new_run(store, "r3", owner=None, created_at=T0 + 3, workflow="a", status="failed")
    new_run(store, "r4", owner=None, created_at=T0 + 3, workflow="a", status="running")
    new_run(store, "r5", owner=None, created_at=T0 + 5, workflow="b", status="completed")
    # Then listing is newest first, later-created first on ties
    assert _ids(store.list_runs()) == ["r5", "r4", "r3", "r2", "r1"]
    # And each filter narrows it, alone and together
    assert _ids(store.list_runs(status="running")) == ["r4", "r2"]
    assert _ids(store.list_runs(status=["completed", "failed"])) == ["r5", "r3", "r1"]
    assert store.list_runs(status=[]) == []
    assert _ids(store.list_runs(workflow="a")) == ["r4", "r3", "r1"]
    assert _ids(store.list_runs(workflow="a", status="running")) == ["r4"]
    assert _ids(store.list_runs(since=T0 + 2, until=T0 + 5)) == ["r4", "r3", "r2"]
    # And limit/offset page through the same order
    assert _ids(store.list_runs(limit=2)) == ["r5", "r4"]
    assert _ids(store.list_runs(limit=2, offset=2)) == ["r3", "r2"]
    assert _ids(store.list_runs(limit=None, offset=3)) == ["r2", "r1"]


def test_list_runs_returns_full_records(store):
    new_run(store, "r1", owner="w1", ttl=10, workflow="wf", priority=3, queue="q")
    (run,) = store.list_runs()
    assert run == store.get_run("r1")
    assert (run.lease_owner, run.priority, run.queue) == ("w1", 3, "q")


def test_count_by_status(store):
    # Given an empty store
    assert store.count_by_status() == {}
    # When runs in three statuses exist
    for i, status in enumerate(["running", "completed", "running", "failed", "running"]):
        new_run(store, f"r{i}", owner=None, status=status)
    # Then each status is counted
    assert store.count_by_status() == {"running": 3, "completed": 1, "failed": 1}
