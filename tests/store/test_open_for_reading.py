"""Opening a store for reading (`open_store(url, create=False)`): it checks, and never writes.

A reading open must not create a file, a table or a version row, run a migration, or change a
SQLite file's journal mode (invariant 10: bad input loses nothing, and a reader changes nothing).
Each test looks at the database from outside the store, before and after: on SQLite the file's
bytes and the files beside it, on Postgres the tables of the test's schema.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
from store_helpers import ev, new_run, raw_connect

from store import (
    SCHEMA_VERSION,
    ConfigError,
    SchemaVersionError,
    StoreError,
    StoreUnavailableError,
    open_store,
)
from store import _version as schema_module  # the migration registry under test

NOT_AGENTSAGA = "holds no agentsaga tables: not an agentsaga database, or none was written yet"


def _sql(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    conn = raw_connect(url)
    try:
        if not url.startswith("sqlite"):
            sql = sql.replace("?", "%s")
        cur = conn.execute(sql, params)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []
    finally:
        conn.close()


def _tables(url: str) -> list[str]:
    if url.startswith("sqlite"):
        sql = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
    else:
        sql = ("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
               " ORDER BY table_name")
    return [r[0] for r in _sql(url, sql)]


def _path(url: str) -> Path:
    return Path(url.split("sqlite:///", 1)[1])


def _footprint(url: str) -> object:
    """What a reader must leave exactly as it was: on SQLite the file's bytes and every file in its
    directory (no -wal/-shm/-journal left behind); on Postgres the tables of the schema."""
    if url.startswith("sqlite"):
        path = _path(url)
        files = sorted(p.name for p in path.parent.iterdir())
        return files, hashlib.sha256(path.read_bytes()).hexdigest()
    return _tables(url)


@pytest.fixture
def foreign(db_url: str) -> str:
    """`db_url` holding another application's table and row, and nothing of agentsaga's."""
    conn = raw_connect(db_url)
    try:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (id, name) VALUES (1, 'ada')")
    finally:
        conn.close()
    return db_url


def test_a_database_of_another_application_is_refused_and_left_as_it_was(foreign):
    # Given another application's database
    before = _footprint(foreign)
    # When it is opened for reading
    with pytest.raises(SchemaVersionError) as refused:
        open_store(foreign, create=False, retry_for=0)
    # Then it is refused, naming the database and what creates a schema, and not one byte or table
    # of it changed
    assert str(refused.value) == (
        f"{foreign} {NOT_AGENTSAGA}. Reading never creates them; the first open that may write does: "
        "Orchestrator(url) or open_store(url) in Python, or a verb that drives runs: "
        "agentsaga run, enqueue, recover or worker")
    assert (refused.value.found, refused.value.supported, refused.value.absent) == (None, SCHEMA_VERSION, True)
    assert _footprint(foreign) == before
    assert _tables(foreign) == ["users"]
    assert _sql(foreign, "SELECT id, name FROM users") == [(1, "ada")]


def test_an_empty_database_is_refused_and_stays_empty(db_url):
    # Given an empty database: a 0-byte SQLite file, or a new Postgres schema
    if db_url.startswith("sqlite"):
        _path(db_url).write_bytes(b"")
    before = _footprint(db_url)
    # When it is opened for reading
    with pytest.raises(SchemaVersionError, match=NOT_AGENTSAGA):
        open_store(db_url, create=False, retry_for=0)
    # Then nothing was written: still 0 bytes (not a 100 KB agentsaga database), still no tables
    assert _footprint(db_url) == before
    assert _tables(db_url) == []
    if db_url.startswith("sqlite"):
        assert _path(db_url).stat().st_size == 0


def test_a_missing_sqlite_file_is_refused_and_not_created(tmp_path, monkeypatch):
    # Given a directory without the database file, and a relative URL naming it
    monkeypatch.chdir(tmp_path)
    # When it is opened for reading
    with pytest.raises(StoreUnavailableError) as refused:
        open_store("sqlite:///nothing-here.db", create=False)
    # Then the error names the file and the working directory, and no file appeared
    assert "no database at 'nothing-here.db'" in str(refused.value)
    assert str(tmp_path) in str(refused.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_database_has_nothing_to_read(url):
    with pytest.raises(ConfigError) as refused:
        open_store(url, create=False)
    assert f"{url} is an in-memory database" in str(refused.value)
    assert "nothing in it to read" in str(refused.value)


def test_an_up_to_date_database_is_read_and_left_as_it_was(db_url):
    # Given an agentsaga database with a run, written and closed
    with open_store(db_url) as writer:
        new_run(writer, "r1", events=3)
    before = _footprint(db_url)
    # When it is opened for reading and read
    with open_store(db_url, create=False) as reader:
        assert [r.run_id for r in reader.list_runs()] == ["r1"]
        assert [e.seq for e in reader.events("r1")] == [1, 2, 3]
        assert reader.info()["schema_version"] == SCHEMA_VERSION
    # Then the database is byte for byte (SQLite) or table for table (Postgres) what it was
    assert _footprint(db_url) == before


def test_a_reading_open_keeps_the_sqlite_files_journal_mode(sqlite_url):
    # Given an agentsaga database its writer keeps in rollback-journal mode
    with open_store(sqlite_url, sqlite_journal_mode="DELETE") as writer:
        new_run(writer, "r1")
    before = _footprint(sqlite_url)
    # When it is opened for reading (whose default journal mode would be WAL)
    with open_store(sqlite_url, create=False) as reader:
        assert reader.info()["journal_mode"] == "DELETE"
        assert reader.get_run("r1").run_id == "r1"
    # Then it is still in DELETE mode, its header unchanged (setting WAL rewrites it)
    fresh = sqlite3.connect(_path(sqlite_url))
    try:
        assert fresh.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        fresh.close()
    assert _footprint(sqlite_url) == before


def test_a_reading_open_may_still_write_the_catalog_of_an_existing_database(db_url):
    # Given an agentsaga database with a run and its snapshot (verify's marks are catalog writes)
    from store import NewSnapshot

    with open_store(db_url) as writer:
        token = new_run(writer, "r1", events=1)
        writer.append("r1", [ev(2)], token=token, now=1.0, status="running",
                      snapshot=NewSnapshot(seq=2, state="{}", sha256="0" * 64, trigger="test", created_at=1.0))
    # When a store opened without create marks the snapshot
    with open_store(db_url, create=False) as reader:
        assert reader.mark_snapshot("r1", 2, "verified", reason=None, checked_at=2.0)
    # Then the mark landed: create=False is about the schema, not about the rows of an existing one
    with open_store(db_url, create=False) as again:
        assert [info.validity for info in again.snapshot_catalog("r1")] == ["verified"]


def test_an_older_schema_is_refused_naming_what_migrates_it_and_nothing_is_migrated(db_url, monkeypatch):
    # Given a database at this version, and this code one version later with a migration to it
    open_store(db_url).close()
    ran: list[str] = []
    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(schema_module.MIGRATIONS, SCHEMA_VERSION, lambda execute, name: ran.append(name))
    before = _footprint(db_url)
    # When it is opened for reading
    with pytest.raises(SchemaVersionError) as refused:
        open_store(db_url, create=False)
    # Then it is refused, naming the database, both versions and what would migrate it
    message = str(refused.value)
    assert message.startswith(f"{db_url} has schema version {SCHEMA_VERSION} and this agentsaga reads "
                              f"version {SCHEMA_VERSION + 1}: it needs a migration")
    assert "agentsaga run, enqueue, resume, recover or worker" in message and "Orchestrator(url)" in message
    assert (refused.value.found, refused.value.supported) == (SCHEMA_VERSION, SCHEMA_VERSION + 1)
    assert refused.value.absent is False  # it has the tables: only the agentsaga tables' absence is absent
    # And no migration ran, the version row still says the old version, nothing changed
    assert ran == []
    assert _sql(db_url, "SELECT value FROM agentsaga_meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    assert _footprint(db_url) == before
    # While an open that may write migrates it, as before
    open_store(db_url).close()
    assert ran == [("sqlite" if db_url.startswith("sqlite") else "postgresql")]


@pytest.mark.parametrize("create", [True, False], ids=["writing", "reading"])
def test_a_newer_schema_is_refused_naming_the_database(db_url, create):
    # Given a database a future agentsaga made (on Postgres, reached with a password in its URL)
    open_store(db_url).close()
    _sql(db_url, "UPDATE agentsaga_meta SET value = '999' WHERE key = 'schema_version'")
    url = db_url if db_url.startswith("sqlite") else "postgresql://postgres:pw123@" + db_url.split("@", 1)[1]
    # When it is opened
    with pytest.raises(SchemaVersionError) as refused:
        open_store(url, create=create)
    # Then the message names the versions and the database, its password masked
    message = str(refused.value)
    assert message.startswith(f"database schema version 999 is newer than this agentsaga supports "
                              f"({SCHEMA_VERSION}): ")
    assert url.replace("pw123", "***") in message and "pw123" not in message
    assert (refused.value.found, refused.value.supported) == (999, SCHEMA_VERSION)


@pytest.mark.parametrize("damage", ["row deleted", "table dropped"])
@pytest.mark.parametrize("create", [True, False], ids=["writing", "reading"])
def test_agentsaga_tables_without_a_version_are_damage_and_never_stamped(db_url, create, damage):
    # Given an agentsaga database whose version row (or its whole meta table) was removed
    with open_store(db_url) as writer:
        new_run(writer, "r1")
    if damage == "row deleted":
        _sql(db_url, "DELETE FROM agentsaga_meta")
    else:
        _sql(db_url, "DROP TABLE agentsaga_meta")
    before = _footprint(db_url)
    # When it is opened, for reading or for writing
    with pytest.raises(StoreError) as refused:
        open_store(db_url, create=create, retry_for=0)
    # Then it is refused as damaged, naming the database, and no version was stamped on it
    assert not isinstance(refused.value, SchemaVersionError)
    assert str(refused.value).startswith(f"{db_url} is damaged: it holds agentsaga tables but no schema version")
    assert _footprint(db_url) == before
    if damage == "row deleted":
        assert _sql(db_url, "SELECT key, value FROM agentsaga_meta") == []
    else:
        assert "agentsaga_meta" not in _tables(db_url)


def test_a_version_that_is_no_number_names_the_database(db_url):
    open_store(db_url).close()
    _sql(db_url, "UPDATE agentsaga_meta SET value = 'three' WHERE key = 'schema_version'")
    for create in (True, False):
        with pytest.raises(StoreError) as refused:
            open_store(db_url, create=create)
        assert str(refused.value) == f"{db_url} is damaged: agentsaga_meta.schema_version is 'three', not a number"


def test_create_must_be_true_or_false(sqlite_url):
    with pytest.raises(ConfigError, match="create must be True or False"):
        open_store(sqlite_url, create="no")
    assert not os.path.exists(_path(sqlite_url))


# -- integers the database cannot bind ---------------------------------------------------------


@pytest.mark.parametrize(("call", "argument"), [
    (lambda s: s.list_runs(limit=2**63), "list_runs: limit"),
    (lambda s: s.list_runs(limit=-1), "list_runs: limit"),
    (lambda s: s.list_runs(offset=-5), "list_runs: offset"),
    (lambda s: s.list_runs(offset=10**20), "list_runs: offset"),
    (lambda s: s.list_runs(limit=None, offset=-1), "list_runs: offset"),
    (lambda s: s.list_runs(limit=True), "list_runs: limit"),
    (lambda s: s.list_runs(limit=2.5), "list_runs: limit"),
    (lambda s: s.events("r1", after_seq=-1), "events: after_seq"),
    (lambda s: s.events("r1", until_seq=99999999999999999999999), "events: until_seq"),
    (lambda s: s.events("r1", until_seq=-1), "events: until_seq"),
    (lambda s: s.snapshot("r1", 2**64), "snapshot: seq"),
    (lambda s: s.mark_snapshot("r1", 2**64, "verified", reason=None, checked_at=0.0), "mark_snapshot: seq"),
    (lambda s: s.prune_snapshots("r1", 2**63), "prune_snapshots: keep"),
])
def test_integers_out_of_range_are_a_value_error_naming_the_argument(store, call, argument):
    # Given a store with a run
    new_run(store, "r1", events=2)
    # When an integer argument lies outside what the database can bind (or is no integer)
    with pytest.raises(ValueError) as refused:
        call(store)
    # Then a ValueError names the argument and the range, instead of a driver's OverflowError
    assert str(refused.value).startswith(f"{argument} must be")
    assert "0..2**63-1" in str(refused.value)


def test_the_largest_integers_the_database_binds_are_accepted(store):
    new_run(store, "r1", events=2)
    top = 2**63 - 1
    assert [r.run_id for r in store.list_runs(limit=top)] == ["r1"]
    assert store.list_runs(limit=top, offset=top) == []
    assert store.list_runs(limit=0) == []
    assert [e.seq for e in store.events("r1", after_seq=0, until_seq=top)] == [1, 2]
    assert store.events("r1", after_seq=top) == []
    assert store.snapshot("r1", top) is None
