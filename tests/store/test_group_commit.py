"""`store.append_many`: appends of several runs in one transaction, each fenced by its own token and
given its own verdict. Runs on SQLite and on Postgres."""

from __future__ import annotations

import pytest
from store_helpers import T0, ev, new_run

from store import ConflictError, FencedError, NewSnapshot, RunNotFoundError


def item(run_id: str, *seqs: int, token: int = 1, **extra):
    return {"run_id": run_id, "events": [ev(s) for s in seqs], "token": token, "now": T0 + 10, **extra}


def seqs(store, run_id: str) -> list[int]:
    return [e.seq for e in store.events(run_id)]


def test_appends_of_several_runs_commit_together_each_under_its_own_fence(store):
    # Given three runs leased by w1, one of them since taken over (token 2)
    for run_id in ("a", "b", "c"):
        new_run(store, run_id, owner="w1", ttl=30)
    store.leases.acquire("b", owner="w2", ttl=30, now=T0 + 30)
    # When w1's appends for all three (two for a) and one for a run that does not exist arrive together
    results = store.append_many([item("a", 2), item("b", 2), item("c", 2, 3), item("a", 3), item("ghost", 2)])
    # Then a and c are journaled, b is fenced and unchanged, the missing run is named
    assert [type(r).__name__ if r else None for r in results] == [
        None, "FencedError", None, None, "RunNotFoundError"]
    assert isinstance(results[1], FencedError) and isinstance(results[4], RunNotFoundError)
    assert seqs(store, "a") == [1, 2, 3] and seqs(store, "c") == [1, 2, 3] and seqs(store, "b") == [1]


def test_after_a_failed_append_of_a_run_its_later_appends_are_not_written(store):
    # Given a run whose lease was taken over
    new_run(store, "a", owner="w1", ttl=30)
    store.leases.acquire("a", owner="w2", ttl=30, now=T0 + 30)
    # When two stale appends of it arrive, the second with the current token
    results = store.append_many([item("a", 2), item("a", 3, token=2)])
    # Then neither is written: the second would leave a gap at seq 2
    assert all(isinstance(r, FencedError) for r in results)
    assert seqs(store, "a") == [1]


def test_status_snapshot_and_release_ride_in_the_group(store):
    new_run(store, "a", owner="w1", ttl=30)
    new_run(store, "b", owner="w1", ttl=30)
    # When one run finishes (status, snapshot, lease released) in the same group as another's step
    snap = NewSnapshot(seq=2, state="{}", sha256="h2", trigger="final", created_at=T0 + 10)
    results = store.append_many([
        item("a", 2, status="completed", finished=True, snapshot=snap, keep_snapshots=3, release_lease=True),
        item("b", 2)])
    # Then both are journaled, and a is completed, released and snapshotted
    assert results == [None, None]
    run = store.get_run("a")
    assert (run.status, run.finished_at, run.lease_owner) == ("completed", T0 + 10, None)
    assert [s.seq for s in store.snapshots("a")] == [2]
    assert store.get_run("b").status == "pending" and seqs(store, "b") == [1, 2]


def test_a_duplicate_seq_fails_only_its_append(store):
    # Given a run that already has seq 2
    new_run(store, "a", owner="w1", ttl=30, events=2)
    new_run(store, "b", owner="w1", ttl=30)
    # When a group holds an append at seq 2 again, and another run's append
    results = store.append_many([item("a", 2), item("b", 2)])
    # Then the duplicate is a conflict and the other append is journaled
    assert isinstance(results[0], ConflictError) and results[1] is None
    assert seqs(store, "a") == [1, 2] and seqs(store, "b") == [1, 2]


def test_nothing_to_append_and_bad_arguments(store):
    assert store.append_many([]) == []
    with pytest.raises(ValueError, match="status"):
        store.append_many([item("a", 2, finished=True)])
    with pytest.raises(ConflictError):
        store.append_many([item("a", 2, 2)])


def test_a_grouped_append_carries_everything_a_direct_append_does(store):
    # Given two leased runs, one with a pending signal and two snapshots already
    for run_id in ("a", "b"):
        new_run(store, run_id, owner="w1", ttl=30)
    signal = store.signals.send("a", "approval", '{"ok": true}', now=T0 + 1)
    for seq in (2, 3):
        old = NewSnapshot(seq=seq, state="{}", sha256=f"h{seq}", trigger="periodic", created_at=T0 + seq)
        store.append("a", [ev(seq)], token=1, now=T0 + seq, snapshot=old)
    meta = dict(workflow="wf", version="2", fingerprint="fp2", agentsaga_version="9.9", python_version="3.x",
                config_hash="cfg")
    snap = NewSnapshot(seq=4, state='{"x": 1}', sha256="h4", trigger="gate:review", created_at=T0 + 10, **meta)
    # When a's append with a snapshot (keep 2), a consumed signal and a migrated version rides in a group
    results = store.append_many([
        item("a", 4, snapshot=snap, keep_snapshots=2, consume_signals=[signal], workflow_version=("2", "fp2")),
        item("b", 2)])
    # Then the snapshot is in the catalog with its metadata and size, the oldest one is pruned,
    assert results == [None, None]
    catalog = store.snapshot_catalog("a")
    assert [(s.seq, s.trigger) for s in catalog] == [(4, "gate:review"), (3, "periodic")]
    newest = catalog[0]
    assert (newest.workflow, newest.version, newest.fingerprint, newest.agentsaga_version, newest.python_version,
            newest.config_hash, newest.size_bytes) == ("wf", "2", "fp2", "9.9", "3.x", "cfg", len('{"x": 1}'))
    # and the signal is consumed and the run row carries the new version, as a direct append leaves them
    assert store.signals.pending("a") == []
    run = store.get_run("a")
    assert (run.version, run.fingerprint) == ("2", "fp2")


def test_a_grouped_append_is_rejected_whole_with_a_negative_keep(store):
    new_run(store, "a", owner="w1", ttl=30)
    snap = NewSnapshot(seq=2, state="{}", sha256="h2", trigger="final", created_at=T0 + 10)
    with pytest.raises(ValueError, match="keep_snapshots"):
        store.append_many([item("a", 2, snapshot=snap, keep_snapshots=-1)])
    assert seqs(store, "a") == [1]


def test_a_run_created_with_one_event_and_a_snapshot_keeps_its_snapshot(store):
    # Given a run brought in with its one event and a snapshot of it (a restore)
    snap = NewSnapshot(seq=1, state="{}", sha256="h1", trigger="restore", created_at=T0, workflow="wf")
    new_run(store, "a", owner="w1", ttl=30, snapshot=snap)
    # Then the snapshot is written with the run (the one-statement create is for a run without one)
    assert [(s.seq, s.trigger, s.workflow) for s in store.snapshot_catalog("a")] == [(1, "restore", "wf")]
    assert seqs(store, "a") == [1]


def test_an_item_whose_signals_are_not_pending_fails_alone(store):
    # Given two leased runs, a's signal already consumed
    for run_id in ("a", "b"):
        new_run(store, run_id, owner="w1", ttl=30)
    signal = store.signals.send("a", "approval", '{"ok": true}', now=T0 + 1)
    store.append("a", [ev(2)], token=1, now=T0 + 2, consume_signals=[signal])
    # When a group holds an append consuming it again, and b's append
    results = store.append_many([item("a", 3, consume_signals=[signal]), item("b", 2)])
    # Then only a's append is refused; b's is journaled
    assert isinstance(results[0], ConflictError) and results[1] is None
    assert seqs(store, "a") == [1, 2] and seqs(store, "b") == [1, 2]


# -- create_runs --------------------------------------------------------------------------------


def create(run_id: str, *seqs: int, owner: str | None = "w1", **extra):
    return {"run_id": run_id, "workflow": "wf", "version": "1", "fingerprint": "fp", "target": "",
            "created_at": T0, "events": [ev(s, kind="RunStarted") for s in seqs or (1,)],
            "lease_owner": owner, "lease_ttl": 30.0 if owner else None, **extra}


def test_runs_created_together_each_get_their_token_or_their_duplicate(store):
    # Given a run "old" and a run holding dedup key "k"
    new_run(store, "old")
    new_run(store, "keyed", dedup_key="k")
    snap = NewSnapshot(seq=2, state='{"s": 2}', sha256="h2", trigger="final", created_at=T0)
    # When five creations arrive together: a new leased run with two events and a snapshot, a new
    # unleased run, the existing id, the taken dedup key, and a second creation of the first new id
    results = store.create_runs([
        create("n1", 1, 2, snapshot=snap), create("n2", owner=None, status="pending"), create("old"),
        create("n3", dedup_key="k"), create("n1")])
    # Then the new runs get their tokens, and each duplicate its own error naming the existing run
    assert results[:2] == [1, 0]
    assert [type(r).__name__ for r in results[2:]] == ["DuplicateRunError"] * 3
    assert [r.existing_run_id for r in results[2:]] == ["old", "keyed", "n1"]
    # And each created run has exactly its own events, row and snapshot; nothing else was written
    assert seqs(store, "n1") == [1, 2] and seqs(store, "n2") == [1]
    assert store.get_run("n1").lease_owner == "w1" and store.get_run("n1").lease_token == 1
    assert store.get_run("n2").status == "pending" and store.get_run("n2").lease_owner is None
    assert [s.seq for s in store.snapshots("n1")] == [2]
    assert seqs(store, "old") == [1] and store.get_run("old").dedup_key is None
    assert {r.run_id for r in store.list_runs(limit=None)} == {"old", "keyed", "n1", "n2"}


def test_a_created_run_takes_appends_like_one_made_alone(store):
    # Given runs created together
    assert store.create_runs([create("a"), create("b")]) == [1, 1]
    # When they are appended to under their tokens
    assert store.append_many([item("a", 2), item("b", 2, 3)]) == [None, None]
    # Then their journals follow on from the creation
    assert seqs(store, "a") == [1, 2] and seqs(store, "b") == [1, 2, 3]


def test_bad_creations_raise_before_anything_is_written(store):
    assert store.create_runs([]) == []
    with pytest.raises(ValueError, match="lease_ttl"):
        store.create_runs([create("a"), create("b", lease_ttl=None)])
    with pytest.raises(ConflictError):
        store.create_runs([create("a"), create("c", 1, 1)])
    assert store.list_runs(limit=None) == []


def test_a_group_writes_row_changes_snapshots_and_prunings_as_its_items_would_one_by_one(store):
    # Given two pairs of leased runs, each run with two older snapshots
    for run_id in ("a", "b", "c", "d"):
        new_run(store, run_id, owner="w1", ttl=30)
    for run_id in ("a", "c"):
        for seq in (2, 3):
            old = NewSnapshot(seq=seq, state="{}", sha256=f"h{seq}", trigger="periodic", created_at=T0 + seq)
            store.append(run_id, [ev(seq)], token=1, now=T0 + seq, snapshot=old)

    def snap(seq):
        return NewSnapshot(seq=seq, state=f'{{"at": {seq}}}', sha256=f"h{seq}", trigger="final", created_at=T0 + seq)

    def items(first, second):
        return [
            item(first, 4, snapshot=snap(4), keep_snapshots=2),
            item(second, 2, workflow_version=("2", "fp2")),
            item(first, 5, status="compensating"),
            item(first, 6, snapshot=snap(6), keep_snapshots=2, status="compensated", finished=True,
                 release_lease=True),
            item(second, 3, status="failed", error="boom", finished=True, release_lease=True),
        ]

    # When one group holds a run's snapshots, status changes and final commit, and another run's
    # version change and final commit (a, b), and the same appends are made one by one (c, d)
    assert store.append_many(items("a", "b")) == [None] * 5
    for one in items("c", "d"):
        store.append(one.pop("run_id"), one.pop("events"), **one)

    # Then both pairs end the same: the same rows, journals and pruned snapshot catalogs
    def outcome(run_id):
        r = store.get_run(run_id)
        return ((r.status, r.error, r.finished_at, r.lease_owner, r.lease_expires_at, r.version, r.fingerprint),
                seqs(store, run_id), [(s.seq, s.trigger) for s in store.snapshot_catalog(run_id)])

    assert outcome("a") == outcome("c") and outcome("b") == outcome("d")
    assert outcome("a")[0][0] == "compensated" and outcome("a")[2] == [(6, "final"), (4, "final")]
    assert outcome("b")[0][:2] == ("failed", "boom") and outcome("b")[0][5:] == ("2", "fp2")


def test_events_stamped_with_whole_and_fractional_seconds_are_journaled_together(store):
    # Given two runs, and a clock that gave one of them a whole second (an injected clock may)
    for run_id in ("a", "b"):
        new_run(store, run_id, owner="w1", ttl=30)
    # When their appends, one at an int time and one at a float time, are written in one group
    # and one append carries events at both kinds of time
    results = store.append_many([item("a", 2) | {"events": [ev(2, at=1_700_000_100)]},
                                 item("b", 2) | {"events": [ev(2, at=T0 + 0.25)]}])
    store.append("a", [ev(3, at=1_700_000_101), ev(4, at=T0 + 0.5)], token=1, now=T0 + 1)
    # Then every event is journaled with its time
    assert results == [None, None]
    assert [e.at for e in store.events("a")] == [T0 + 1, 1_700_000_100, 1_700_000_101, T0 + 0.5]
    assert [e.at for e in store.events("b")] == [T0 + 1, T0 + 0.25]


def test_many_runs_created_together_span_several_statements_and_keep_their_verdicts(store):
    # Given an existing run "x30"
    new_run(store, "x30")
    # When forty creations arrive together, the existing id among them and one id given twice far apart
    ids = [f"x{i}" for i in range(40)]
    ids[35] = "x3"
    results = store.create_runs([create(run_id) for run_id in ids])
    # Then each duplicate is named where it stands, and every other run is created once
    dups = {i: r.existing_run_id for i, r in enumerate(results) if not isinstance(r, int)}
    assert dups == {30: "x30", 35: "x3"}
    assert all(results[i] == 1 for i in range(40) if i not in dups)
    assert sorted(r.run_id for r in store.list_runs(limit=None)) == sorted(set(ids))
    assert all(seqs(store, run_id) == [1] for run_id in set(ids))
