"""A database whose agentsaga schema is incomplete, or a file that is no database at all, is named
as such by every operation: a `SchemaVersionError` naming the database (password masked), the part
missing and what to do, never the driver's own error (invariant 10: bad input gets a clear error).

The version row is checked when a store opens; a table or a column removed behind agentsaga's back
(by hand, by a partial restore) is found by the first statement that needs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from store_helpers import new_run, raw_connect

from store import SCHEMA_VERSION, SchemaVersionError, open_store

LACKS = f"lacks part of the agentsaga schema (version {SCHEMA_VERSION}) it is marked with"
CREATES = "the first open that may write: Orchestrator(url) or open_store(url) in Python"


def _exec(url: str, sql: str) -> None:
    conn = raw_connect(url)
    try:
        conn.execute(sql)
    finally:
        conn.close()


def _with_password(url: str) -> str:
    """On Postgres, the same database reached with a password in the URL (the test server trusts)."""
    return url if url.startswith("sqlite") else "postgresql://postgres:s3cret@" + url.split("@", 1)[1]


@pytest.mark.parametrize("create", [True, False], ids=["open-to-write", "open-to-read"])
def test_a_column_dropped_behind_agentsagas_back_is_named_by_every_operation(db_url, create):
    # Given an agentsaga database with a run, whose runs table then lost a column
    with open_store(db_url) as writer:
        new_run(writer, "r1", events=2)
    _exec(db_url, "ALTER TABLE agentsaga_runs DROP COLUMN recoveries")
    url = _with_password(db_url)
    # When it is opened (its version row is current, so the open succeeds) and used
    with open_store(url, create=create, retry_for=0) as store:
        for operation in (lambda: store.get_run("r1"), lambda: store.list_runs(),
                          lambda: new_run(store, "r2")):
            with pytest.raises(SchemaVersionError) as refused:
                operation()
            # Then each says which database lacks what, and what to do; not the driver's words
            message = str(refused.value)
            assert message.startswith(f"{url.replace('s3cret', '***')} {LACKS}: "), message
            assert "recoveries" in message and CREATES in message
            assert "s3cret" not in message
            assert "OperationalError" not in message and "UndefinedColumn" not in message
            assert (refused.value.found, refused.value.supported) == (None, SCHEMA_VERSION)


def test_a_dropped_table_is_named_by_the_operation_that_needs_it(db_url):
    # Given an agentsaga database whose snapshots table was dropped
    with open_store(db_url) as writer:
        new_run(writer, "r1", events=2)
    _exec(db_url, "DROP TABLE agentsaga_snapshots" + ("" if db_url.startswith("sqlite") else " CASCADE"))
    with open_store(db_url, create=False, retry_for=0) as store:
        # When something that does not need it is read, it works
        assert [e.seq for e in store.events("r1")] == [1, 2]
        # And what needs it says which table is missing
        with pytest.raises(SchemaVersionError, match=re.escape(LACKS) + ": .*agentsaga_snapshots"):
            store.snapshots("r1")


@pytest.mark.parametrize("create", [True, False], ids=["open-to-write", "open-to-read"])
def test_a_file_that_is_not_a_sqlite_database_is_named_and_left_as_it_was(tmp_path: Path, create):
    # Given a text file where the database should be
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    before = path.read_bytes()
    # When it is opened, to write or to read
    with pytest.raises(SchemaVersionError) as refused:
        open_store(f"sqlite:///{path}", create=create, retry_for=0)
    # Then the error says it is not a database, naming it, and the file is untouched
    assert str(refused.value).startswith(
        f"sqlite:///{path} is not an agentsaga database: the file is not a SQLite database")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]
