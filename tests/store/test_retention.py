"""The store contract: deleting whole runs. Runs on SQLite and on Postgres."""

from __future__ import annotations

import pytest
from store_helpers import T0, ev, new_run

from store import NewSnapshot, RunNotFoundError


def test_delete_runs_removes_everything_of_those_runs_only(store, raw_sql):
    # Given two runs, each with events, a snapshot and a signal
    for run_id in ("gone", "kept"):
        token = new_run(store, run_id, events=3)
        store.append(run_id, [ev(4)], token=token, now=T0,
                     snapshot=NewSnapshot(4, "{}", "h", "every", T0))
        store.signals.send(run_id, "s", "{}", now=T0)
    # When one is deleted (named twice, alongside an unknown id)
    deleted = store.delete_runs(["gone", "gone", "never-existed"])
    # Then it counts one run, and nothing of it is left in any table
    assert deleted == 1
    with pytest.raises(RunNotFoundError):
        store.get_run("gone")
    for table in ("agentsaga_events", "agentsaga_snapshots", "agentsaga_signals"):
        (count,) = raw_sql(f"SELECT COUNT(*) FROM {table}")[0]
        assert count == {"agentsaga_events": 4}.get(table, 1), table
    # And the other run is intact
    assert store.last_seq("kept") == 4
    assert len(store.snapshots("kept")) == 1
    assert len(store.signals.pending("kept")) == 1


def test_a_deleted_run_id_can_be_reused_with_a_clean_journal(store):
    new_run(store, "r1", events=5)
    assert store.delete_runs(["r1"]) == 1
    new_run(store, "r1", events=1)
    assert [e.seq for e in store.events("r1")] == [1]


def test_delete_nothing(store):
    assert store.delete_runs([]) == 0


def test_delete_runs_with_statuses_spares_runs_whose_status_changed(store):
    # Given a completed run and one that was resumed (running) after a listing saw it completed
    new_run(store, "done", owner=None, status="completed")
    new_run(store, "resumed", owner=None, status="running")
    # When both are deleted on the condition that they are still completed
    deleted = store.delete_runs(["done", "resumed"], statuses=["completed"])
    # Then only the completed one is gone
    assert deleted == 1
    with pytest.raises(RunNotFoundError):
        store.get_run("done")
    assert store.get_run("resumed").status == "running"
    assert store.delete_runs(["resumed"], statuses=[]) == 0
