"""The store contract, part 1: runs and the journal. Runs on SQLite and on Postgres.

Sibling files hold the rest of the contract (leases, claims, queries, breakers and signals,
retention, opening, failures, threads); all of them use the same `store`/`db_url` fixtures.
"""

from __future__ import annotations

import pytest
from store_helpers import T0, ev, new_run

from store import (
    ConflictError,
    DuplicateRunError,
    EventRecord,
    FencedError,
    NewSnapshot,
    RunNotFoundError,
)


def snap(seq: int, state: str = '{"s": 1}') -> NewSnapshot:
    return NewSnapshot(seq=seq, state=state, sha256=f"h{seq}", trigger="every", created_at=T0 + seq)


# -- create_run -------------------------------------------------------------------------------


def test_create_run_and_events_round_trip(store):
    # Given JSON payloads with non-ASCII text and odd spacing (the store must not re-encode them)
    events = [ev(1, "RunStarted", '{"q": "café ☕",  "n": [1, 2]}', at=T0 + 0.125),
              ev(2, "StepCompleted", '{"out": null}', at=T0 + 1.5)]
    # When a run is created with them
    token = store.create_run(run_id="r1", workflow="research", version="3", fingerprint="fp1",
                             target='{"step": "plan"}', created_at=T0, events=events,
                             parent_run_id="r0", queue="q1", priority=5, dedup_key="d1")
    # Then the run row and the journal read back exactly as written
    assert token == 0
    run = store.get_run("r1")
    assert (run.run_id, run.workflow, run.version, run.fingerprint, run.target) == (
        "r1", "research", "3", "fp1", '{"step": "plan"}')
    assert (run.status, run.created_at, run.updated_at, run.finished_at) == (
        "pending", T0, T0, None
    )
    assert (run.parent_run_id, run.queue, run.priority, run.dedup_key) == ("r0", "q1", 5, "d1")
    assert (run.lease_owner, run.lease_token, run.lease_expires_at, run.recoveries) == (
        None, 0, None, 0
    )
    assert store.events("r1") == [EventRecord(e.seq, e.kind, e.data, e.at) for e in events]
    assert store.last_seq("r1") == 2


def test_create_run_with_lease_owner_returns_token_1(store):
    # Given / When a run created already leased
    token = new_run(store, "r1", owner="w1", ttl=30.0, status="running")
    # Then it holds token 1, expiring created_at + ttl
    run = store.get_run("r1")
    assert token == 1
    assert (run.lease_owner, run.lease_token, run.lease_expires_at, run.status) == (
        "w1", 1, T0 + 30.0, "running"
    )


def test_duplicate_run_id_raises_and_writes_nothing(store):
    # Given a run r1 with one event
    new_run(store, "r1", events=1, workflow="first")
    # When another create_run uses the same id, with other events
    with pytest.raises(DuplicateRunError, match="r1") as raised:
        new_run(store, "r1", events=3, workflow="second")
    # Then the error names the run and the original run and journal are untouched
    assert raised.value.run_id == "r1"
    assert store.get_run("r1").workflow == "first"
    assert [e.seq for e in store.events("r1")] == [1]


def test_duplicate_dedup_key_names_the_existing_run(store):
    # Given a run with dedup key "order-7"
    new_run(store, "r1", dedup_key="order-7")
    # When a second run is created with the same key
    with pytest.raises(DuplicateRunError) as raised:
        new_run(store, "r2", dedup_key="order-7")
    # Then the error carries the existing run's id, and r2 does not exist
    assert raised.value.existing_run_id == "r1"
    with pytest.raises(RunNotFoundError):
        store.get_run("r2")
    # And runs without a dedup key never collide with each other
    new_run(store, "r3")
    new_run(store, "r4")


def test_create_run_with_duplicate_seq_in_batch_writes_nothing(store):
    # When the first events repeat a seq
    with pytest.raises(ConflictError):
        store.create_run(run_id="r1", workflow="wf", version="1", fingerprint="fp", target="{}",
                         created_at=T0, events=[ev(1), ev(1)])
    # Then not even the run row exists
    with pytest.raises(RunNotFoundError):
        store.get_run("r1")


def test_get_run_and_journal_reads_of_unknown_run_raise(store):
    for read in (store.get_run, store.events, store.last_seq, store.snapshots):
        with pytest.raises(RunNotFoundError, match="nope") as raised:
            read("nope")
        assert raised.value.run_id == "nope"


# -- append -----------------------------------------------------------------------------------


def test_append_one_event_then_read_ranges(store):
    # Given a leased run with one event
    token = new_run(store, "r1")
    # When events 2..5 are appended one at a time
    for seq in range(2, 6):
        store.append("r1", [ev(seq)], token=token, now=T0 + seq)
    # Then every range read returns exactly the events in it, ascending
    assert [e.seq for e in store.events("r1")] == [1, 2, 3, 4, 5]
    assert [e.seq for e in store.events("r1", after_seq=3)] == [4, 5]
    assert [e.seq for e in store.events("r1", after_seq=1, until_seq=3)] == [2, 3]
    assert store.events("r1", after_seq=5) == []
    assert store.last_seq("r1") == 5


def test_last_seq_of_run_without_events_is_zero(store):
    new_run(store, "r1", events=0)
    assert store.last_seq("r1") == 0
    assert store.events("r1") == []


@pytest.mark.parametrize("batch", [1, 3], ids=["one-event", "batch"])
def test_append_with_stale_token_is_fenced_and_writes_nothing(store, batch):
    # Given a run taken over by a second worker (the first one's token is now stale)
    old = new_run(store, "r1", owner="w1")
    new = store.leases.acquire("r1", owner="w2", ttl=30, now=T0 + 1, force=True)
    # When the first worker appends with its old token
    with pytest.raises(FencedError) as raised:
        store.append("r1", [ev(2 + i) for i in range(batch)], token=old, now=T0 + 2,
                     status=None if batch == 1 else "failed")
    # Then it is fenced (the error names both tokens) and nothing changed
    assert (raised.value.run_id, raised.value.token, raised.value.current_token) == ("r1", old, new)
    assert [e.seq for e in store.events("r1")] == [1]
    assert store.get_run("r1").status == "pending"


@pytest.mark.parametrize("batch", [1, 2], ids=["one-event", "batch"])
def test_append_to_unknown_run_raises_run_not_found(store, batch):
    with pytest.raises(RunNotFoundError, match="ghost"):
        store.append("ghost", [ev(i) for i in range(1, batch + 1)], token=1, now=T0)


def test_append_duplicate_seq_raises_conflict_and_writes_nothing(store):
    # Given a run with events 1 and 2
    token = new_run(store, "r1", events=2)
    # When another writer's seq 2 arrives
    with pytest.raises(ConflictError, match="seq 2") as raised:
        store.append("r1", [ev(2, "Other", '{"other": true}')], token=token, now=T0)
    # Then the error names run and seq, and event 2 is still the original
    assert (raised.value.run_id, raised.value.seq) == ("r1", 2)
    assert store.events("r1")[1] == EventRecord(2, "StepCompleted", '{"n": 2}', T0 + 2)


def test_append_is_all_or_nothing(store):
    # Given a run with events 1..2 and one snapshot
    token = new_run(store, "r1", events=2)
    store.append("r1", [], token=token, now=T0, snapshot=snap(2))
    # When a batch whose *second* event duplicates seq 2 also carries a status, a snapshot,
    # a lease release and a signal to consume
    signal = store.signals.send("r1", "approve", "{}", now=T0)
    with pytest.raises(ConflictError) as raised:
        store.append("r1", [ev(3), ev(2), ev(4)], token=token, now=T0 + 9, status="completed",
                     finished=True, snapshot=snap(4), keep_snapshots=1, release_lease=True,
                     consume_signals=[signal])
    # Then none of it happened
    assert raised.value.seq == 2
    assert [e.seq for e in store.events("r1")] == [1, 2]
    run = store.get_run("r1")
    assert (run.status, run.finished_at, run.updated_at, run.lease_owner) == (
        "pending", None, T0, "w1"
    )
    assert [s.seq for s in store.snapshots("r1")] == [2]
    assert [s[0] for s in store.signals.pending("r1")] == [signal]


def test_append_duplicate_snapshot_seq_conflicts_and_writes_nothing(store):
    # Given a snapshot at seq 1
    token = new_run(store, "r1")
    store.append("r1", [], token=token, now=T0, snapshot=snap(1))
    # When an append brings new events and another snapshot at seq 1
    with pytest.raises(ConflictError, match="snapshot"):
        store.append("r1", [ev(2)], token=token, now=T0, snapshot=snap(1, '{"s": 2}'))
    # Then the event was not written either, and the first snapshot stands
    assert store.last_seq("r1") == 1
    assert store.snapshot("r1", 1).state == '{"s": 1}'


def test_append_with_status_finishes_and_releases(store):
    # Given a leased, running run
    token = new_run(store, "r1", status="running")
    # When its last events are appended with a terminal status, an error text, and release
    store.append("r1", [ev(2), ev(3)], token=token, now=T0 + 50, status="failed",
                 error="boom", finished=True, release_lease=True)
    # Then status, error, updated_at and finished_at are set; the lease is free, token kept
    run = store.get_run("r1")
    assert (run.status, run.error, run.updated_at, run.finished_at) == (
        "failed", "boom", T0 + 50, T0 + 50
    )
    assert (run.lease_owner, run.lease_expires_at, run.lease_token) == (None, None, token)
    assert store.last_seq("r1") == 3


def test_append_status_without_finished_leaves_finished_at_empty(store):
    token = new_run(store, "r1")
    store.append("r1", [ev(2)], token=token, now=T0 + 5, status="running")
    run = store.get_run("r1")
    assert (run.status, run.updated_at, run.finished_at, run.lease_owner) == (
        "running", T0 + 5, None, "w1"
    )


def test_append_error_without_status_is_rejected(store):
    token = new_run(store, "r1")
    with pytest.raises(ValueError):
        store.append("r1", [ev(2)], token=token, now=T0, error="x")
    assert store.last_seq("r1") == 1


# -- snapshots --------------------------------------------------------------------------------


def test_snapshots_newest_first_and_pruned_to_keep(store):
    # Given snapshots written at seq 2, 4, 6 and 8, keeping the newest 2
    token = new_run(store, "r1")
    for seq in range(2, 9):
        store.append("r1", [ev(seq)], token=token, now=T0 + seq,
                     snapshot=snap(seq, f'{{"at": {seq}}}') if seq % 2 == 0 else None,
                     keep_snapshots=2 if seq % 2 == 0 else None)
    # Then only 8 and 6 remain, newest first, with every field intact
    snaps = store.snapshots("r1")
    assert [s.seq for s in snaps] == [8, 6]
    assert (snaps[0].state, snaps[0].sha256, snaps[0].trigger, snaps[0].created_at,
            snaps[0].schema_version) == ('{"at": 8}', "h8", "every", T0 + 8, 1)
    assert store.snapshot("r1", 6).state == '{"at": 6}'
    assert store.snapshot("r1", 4) is None


def test_snapshot_without_keep_keeps_all(store):
    token = new_run(store, "r1")
    for seq in (1, 2, 3):
        store.append("r1", [], token=token, now=T0, snapshot=snap(seq))
    assert [s.seq for s in store.snapshots("r1")] == [3, 2, 1]


def test_prune_snapshots_returns_number_deleted(store):
    # Given four snapshots
    token = new_run(store, "r1")
    for seq in (1, 2, 3, 4):
        store.append("r1", [], token=token, now=T0, snapshot=snap(seq))
    # When pruning to 1, then again
    assert store.prune_snapshots("r1", 1) == 3
    assert store.prune_snapshots("r1", 1) == 0
    # Then only the newest remains
    assert [s.seq for s in store.snapshots("r1")] == [4]
    with pytest.raises(RunNotFoundError):
        store.prune_snapshots("ghost", 1)
