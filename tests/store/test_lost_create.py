"""A create whose COMMIT landed but whose reply was lost: the store's retry must recognise its own
run and return its token, not call it a duplicate; a run someone else created stays a duplicate.

The fault is the `lost_reply` fixture's (tests/conftest.py): on Postgres a proxy swallows the
server's answer to the commit and cuts the session; on SQLite the commit lands and the driver then
reports "database is locked". Either way the store retries a write that is already in.
"""

from __future__ import annotations

import pytest
from store_helpers import T0, ev, new_run

from store import DuplicateRunError, NewSnapshot, open_store

_ROW = {"workflow": "wf", "version": "1", "fingerprint": "fp", "target": "{}"}


def started(data: str = '{"input": 1}') -> object:
    return ev(1, kind="RunStarted", data=data, at=T0)


def create(store, run_id: str, **fields):
    args = dict(_ROW, run_id=run_id, created_at=T0, events=[started()], lease_owner="w1", lease_ttl=30.0)
    return store.create_run(**(args | fields))


def runs(store) -> list[tuple[str, str | None, int]]:
    return [(r.run_id, r.lease_owner, r.lease_token) for r in store.list_runs(limit=None)]


def journal(store, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in store.events(run_id)]


@pytest.mark.parametrize("shape", ["one-event", "batch"])
def test_create_run_whose_commit_reply_was_lost_returns_its_token(lost_reply, shape):
    # Given a store, and a network that will lose the reply to the next create's commit
    store = open_store(lost_reply.url, retry_for=30)
    try:
        extra = {} if shape == "one-event" else {
            "events": [started(), ev(2)], "snapshot": NewSnapshot(2, "{}", "h", "every", T0)}
        lost_reply.arm(store, "insert" if shape == "one-event" else "commit")
        # When creating a run: the commit lands, the caller hears an error, the store retries
        token = create(store, "r1", **extra)
        # Then the retry recognised the run it had written: its token, one row, one RunStarted
        assert lost_reply.ate
        assert token == 1
        assert runs(store) == [("r1", "w1", 1)]
        assert journal(store, "r1") == ([(1, "RunStarted")] if shape == "one-event"
                                        else [(1, "RunStarted"), (2, "StepCompleted")])
    finally:
        store.close()


def test_create_run_with_a_dedup_key_whose_commit_reply_was_lost_returns_its_token(lost_reply):
    # Given a network that will lose the reply to the next create's commit
    store = open_store(lost_reply.url, retry_for=30)
    try:
        lost_reply.arm(store, "insert")
        # When creating an unleased, queued run with a dedup key
        token = create(store, "r1", lease_owner=None, lease_ttl=None, queue="q", dedup_key="k1")
        # Then its own dedup key did not make it a duplicate of itself
        assert lost_reply.ate
        assert token == 0
        assert runs(store) == [("r1", None, 0)]
        assert store.get_run("r1").dedup_key == "k1"
    finally:
        store.close()


@pytest.mark.parametrize("theirs", ["other-time", "other-input", "other-owner-dedup"])
def test_create_retried_into_another_callers_run_is_a_duplicate(lost_reply, theirs):
    # Given another caller's run: our id created at another time, or with another input; or
    # another id holding our dedup key
    store = open_store(lost_reply.url, retry_for=30)
    try:
        if theirs == "other-time":
            create(store, "r1", created_at=T0 - 1)
        elif theirs == "other-input":
            create(store, "r1", events=[started('{"input": 2}')])
        else:
            create(store, "r0", dedup_key="k1")
        before = runs(store)
        # And a session that fails our create's first attempt before anything is written
        lost_reply.drop_session(store)
        # When creating our run: the retry meets their row
        with pytest.raises(DuplicateRunError) as raised:
            create(store, "r1", dedup_key="k1")
        # Then it is a duplicate, naming the run in the way, and nothing changed
        assert raised.value.existing_run_id == ("r0" if theirs == "other-owner-dedup" else "r1")
        assert runs(store) == before
    finally:
        store.close()


def test_group_create_whose_commit_reply_was_lost_returns_each_token(lost_reply):
    # Given another caller's run "taken", and a network that will lose the reply to the next commit
    store = open_store(lost_reply.url, retry_for=30)
    try:
        new_run(store, "taken", created_at=T0 - 1)
        lost_reply.arm(store, "commit")
        items = [
            dict(_ROW, run_id="a", created_at=T0, events=[started()], lease_owner="w1", lease_ttl=30.0),
            dict(_ROW, run_id="b", created_at=T0, events=[started()], queue="q", dedup_key="kb"),
            dict(_ROW, run_id="taken", created_at=T0, events=[started()]),
            dict(_ROW, run_id="a", created_at=T0, events=[started()], lease_owner="w1", lease_ttl=30.0),
            dict(_ROW, run_id="c", created_at=T0, events=[started()], dedup_key="kb"),
        ]
        # When creating them as one group: the commit lands, the caller hears an error, it retries
        answers = store.create_runs(items)
        # Then the runs the group wrote get their tokens; the genuine duplicates stay duplicates:
        # another caller's id, an id an earlier item holds, a dedup key an earlier item holds
        assert lost_reply.ate
        assert answers[:2] == [1, 0]
        assert [(type(a).__name__, a.existing_run_id) for a in answers[2:]] == [
            ("DuplicateRunError", "taken"), ("DuplicateRunError", "a"), ("DuplicateRunError", "b")]
        assert sorted(runs(store)) == [("a", "w1", 1), ("b", None, 0), ("taken", "w1", 1)]
        assert journal(store, "a") == journal(store, "b") == [(1, "RunStarted")]
        assert journal(store, "taken") == [(1, "StepCompleted")]
    finally:
        store.close()
