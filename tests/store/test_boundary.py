"""What callers see when the database misbehaves (the boundary, `_boundary.py`): only store
errors, bounded retries."""

from __future__ import annotations

import threading

import pytest
from store_helpers import T0, ev, new_run, raw_connect

from store import SchemaVersionError, StoreError, StoreUnavailableError, open_store


def test_unreachable_postgres_is_unavailable_after_retrying():
    # Given a URL (with a password) whose port nothing listens on
    url = "postgresql://agent:s3cret@127.0.0.1:1/agentsaga"
    # When opening it with a short retry budget
    with pytest.raises(StoreUnavailableError) as raised:
        open_store(url, retry_for=0.3)
    # Then the error names the URL with the password masked, and the last cause
    message = str(raised.value)
    assert "postgresql://agent:***@127.0.0.1:1/agentsaga" in message
    assert "s3cret" not in message
    assert raised.value.url == "postgresql://agent:***@127.0.0.1:1/agentsaga"
    assert not isinstance(raised.value.__cause__, StoreError)  # the driver's error, for debugging


@pytest.mark.postgres
def test_missing_postgres_database_is_unavailable(pg_base_url):
    url = pg_base_url.rsplit("/", 1)[0] + "/agentsaga_no_such_database"
    with pytest.raises(StoreUnavailableError, match="agentsaga_no_such_database"):
        open_store(url, retry_for=0.3)


def test_missing_sqlite_directory_is_unavailable(tmp_path):
    with pytest.raises(StoreUnavailableError, match="no-such-dir"):
        open_store(f"sqlite:///{tmp_path}/no-such-dir/x.db", retry_for=0.3)


@pytest.mark.parametrize("batch", [1, 2], ids=["one-event", "batch"])
def test_locked_sqlite_append_retries_then_is_unavailable(sqlite_url, batch):
    # Given a run, and another connection holding the database's write lock
    store = open_store(sqlite_url, busy_timeout=0.05, retry_for=0.3)
    locker = raw_connect(sqlite_url)
    try:
        token = new_run(store, "r1")
        locker.execute("BEGIN EXCLUSIVE")
        # When appending while the lock is never released
        with pytest.raises(StoreUnavailableError, match="locked") as raised:
            store.append("r1", [ev(2 + i) for i in range(batch)], token=token, now=T0)
        # Then the error names the database, and nothing was written
        assert sqlite_url in str(raised.value)
        locker.execute("ROLLBACK")
        assert store.last_seq("r1") == 1
    finally:
        locker.close()
        store.close()


@pytest.mark.parametrize("batch", [1, 2], ids=["one-event", "batch"])
def test_locked_sqlite_append_succeeds_when_the_lock_goes_away(sqlite_url, batch):
    # Given a lock held by another connection, released 0.2 s from now (retries go on for as long
    # as a loaded machine may need to get there: the bound only stops a hang)
    store = open_store(sqlite_url, busy_timeout=0.05, retry_for=120)
    locker = raw_connect(sqlite_url)
    try:
        token = new_run(store, "r1")
        locker.execute("BEGIN EXCLUSIVE")
        release = threading.Timer(0.2, locker.execute, args=("ROLLBACK",))
        release.start()
        # When appending meanwhile (each attempt gives up on the lock after 0.05 s)
        store.append("r1", [ev(2 + i) for i in range(batch)], token=token, now=T0)
        release.join()
        # Then the retries carried it through once the lock was gone
        assert store.last_seq("r1") == 1 + batch
    finally:
        locker.close()
        store.close()


def test_driver_errors_are_translated_not_leaked(store, raw_sql):
    # Given a run, and its journal table dropped behind the store's back (damage)
    new_run(store, "r1")
    raw_sql("DROP TABLE agentsaga_events")
    # When reading or appending
    for op, call in (("events", lambda: store.events("r1")),
                     ("append", lambda: store.append("r1", [ev(2)], token=1, now=T0))):
        with pytest.raises(StoreError) as raised:
            call()
        # Then the error is the store's own (a missing table is the schema's fault), naming the
        # database, the table and the operation, with the driver's as cause
        assert type(raised.value) is SchemaVersionError
        assert str(raised.value).startswith(f"{store.url} lacks part of the agentsaga schema")
        assert "agentsaga_events" in str(raised.value) and f"(in {op})" in str(raised.value)
        assert raised.value.__cause__ is not None
        assert not isinstance(raised.value.__cause__, StoreError)


def test_closed_store_refuses_work(db_url):
    store = open_store(db_url)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.count_by_status()


def test_invalid_arguments_are_value_errors_and_write_nothing(store):
    token = new_run(store, "r1")
    with pytest.raises(ValueError):
        store.leases.acquire("r1", owner="w", ttl=0, now=T0)
    with pytest.raises(ValueError):
        store.create_run(run_id="r2", workflow="w", version="1", fingerprint="f", target="{}",
                         created_at=T0, events=[], lease_owner="w")
    with pytest.raises(ValueError):
        store.append("r1", [ev(2)], token=token, now=T0, finished=True)
    assert store.last_seq("r1") == 1
    assert [r.run_id for r in store.list_runs()] == ["r1"]
