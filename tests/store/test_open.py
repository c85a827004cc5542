"""Opening a store: URLs, options, schema creation and versioning, SQLite settings."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from store_helpers import T0, ev, new_run, raw_connect

from store import (
    SCHEMA_VERSION,
    ConfigError,
    SchemaVersionError,
    StoreError,
    StoreUnavailableError,
    default_url,
    open_store,
)
from store import _version as schema_module  # the migration registry and version under test

# -- URLs and options (no database needed) ----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "notaurl",
        "",
        "mysql://x",
        "postgresql://:badport",
        "postgresql://u:secret@h:99999/db",
        "postgresql://u:secret@h:notaport/db",
        "postgresql://u:secret@h/db?bogus_option=1",
        "sqlite://user:secret@host/file.db",
        "sqlite:///file.db?timeout=3",
    ],
)
def test_malformed_url_is_a_config_error_naming_it_without_password(url):
    # When opening a URL that cannot work
    with pytest.raises(ConfigError) as raised:
        open_store(url, retry_for=0)
    # Then the error names the URL and the accepted schemes, never the password
    message = str(raised.value)
    assert "secret" not in message
    assert url.replace("secret", "***") in message
    assert "postgresql://" in message and "sqlite://" in message


def test_unsupported_scheme_keeps_the_user_visible_but_masks_the_password():
    with pytest.raises(ConfigError) as raised:
        open_store("mysql://admin:hunter2@db.example/prod")
    assert "mysql://admin:***@db.example/prod" in str(raised.value)
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    "options",
    [
        {"sqlite_synchronous": "SOMETIMES"},
        {"sqlite_journal_mode": "JOURNAL"},
        {"busy_timeout": -1},
        {"retry_for": "ten"},
    ],
)
def test_bad_option_is_a_config_error(sqlite_url, options):
    with pytest.raises(ConfigError):
        open_store(sqlite_url, **options)


def test_default_url_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("AGENTSAGA_DB", raising=False)
    assert default_url() == "sqlite:///agentsaga.db"
    monkeypatch.setenv("AGENTSAGA_DB", "postgresql://h/db")
    assert default_url() == "postgresql://h/db"


def test_open_without_url_uses_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSAGA_DB", f"sqlite:///{tmp_path}/from-env.db")
    with open_store() as s:
        new_run(s, "r1")
    assert (tmp_path / "from-env.db").exists()


def test_relative_sqlite_path_is_in_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///rel.db") as s:
        new_run(s, "r1")
    assert (tmp_path / "rel.db").exists()


def test_sqlite_store_reports_dialect_and_url(sqlite_url):
    with open_store(sqlite_url) as s:
        assert (s.dialect, s.url) == ("sqlite", sqlite_url)


@pytest.mark.postgres
@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "postgresql+psycopg"])
def test_postgres_schemes_mean_psycopg_and_the_password_is_masked(pg_url, scheme):
    # Given a URL with a password (trust auth ignores it) in each accepted spelling
    url = f"{scheme}://postgres:pw123@" + pg_url.split("@", 1)[1]
    # Then it opens a Postgres store whose URL and repr hide the password
    with open_store(url) as s:
        assert s.dialect == "postgresql"
        assert "pw123" not in s.url and "pw123" not in repr(s)


@pytest.mark.postgres
@pytest.mark.parametrize("wrong", ["database", "role"])
def test_a_mistyped_postgres_database_or_role_fails_at_once_naming_the_url(pg_base_url, wrong, monkeypatch):
    from store._postgres import PostgresDialect

    # Given a URL naming a database or a role the server does not have, with a password in it
    rest = pg_base_url.split("://", 1)[1].split("@", 1)[1]
    host, _, _ = rest.partition("/")
    url = (f"postgresql://postgres:pw123@{host}/no_such_db_x" if wrong == "database"
           else f"postgresql://no_such_role_x:pw123@{host}/test")
    attempts = []
    real_connect = PostgresDialect.connect
    monkeypatch.setattr(PostgresDialect, "connect", lambda self: attempts.append(1) or real_connect(self))
    # When the store is opened, with retries allowed for a long time
    with pytest.raises(StoreUnavailableError) as caught:
        open_store(url, retry_for=30)  # were it retried, several attempts would be counted
    # Then it failed on the first attempt, not retried, naming the URL (password masked) and the cause
    message = str(caught.value)
    assert len(attempts) == 1
    assert "not retried" in message and "after retrying" not in message
    assert f"postgres:***@{host}/no_such_db_x" in message if wrong == "database" else "no_such_role_x:***@" in message
    assert "pw123" not in message
    assert f'{wrong} "no_such_{"db" if wrong == "database" else "role"}_x" does not exist' in message


@pytest.mark.parametrize("text", [
    'connection to server at "h", port 5432 failed: FATAL:  password authentication failed for user "u"',
    'connection to server at "h", port 5432 failed: FATAL:  no pg_hba.conf entry for host "1.2.3.4"',
    'connection to server at "h", port 5432 failed: fe_sendauth: no password supplied',
])
def test_refused_logins_are_permanent_and_refused_connections_transient(text):
    import psycopg

    from store._dialect import ErrorKind
    from store._postgres import PostgresDialect
    from store._url import parse_url

    # Given the Postgres dialect classifying errors raised while connecting
    url = "postgresql://u@h/db"
    dialect = PostgresDialect(url, parse_url(url)[1], retry_for=1)
    # Then a refused login is permanent, while a refused or timed-out connection is worth retrying
    assert dialect.classify(psycopg.OperationalError(text), None) is ErrorKind.UNAVAILABLE
    refused = 'connection to server at "h", port 5432 failed: Connection refused'
    assert dialect.classify(psycopg.OperationalError(refused), None) is ErrorKind.TRANSIENT


# -- schema -----------------------------------------------------------------------------------


def test_reopening_keeps_data_and_schema(db_url):
    with open_store(db_url) as first:
        new_run(first, "r1", events=2)
    with open_store(db_url) as second:
        assert second.last_seq("r1") == 2
        assert second.info()["schema_version"] == SCHEMA_VERSION


def test_newer_schema_version_is_refused(db_url, raw_sql):
    # Given a database whose meta row says a future agentsaga made it
    open_store(db_url).close()
    raw_sql("UPDATE agentsaga_meta SET value = '999' WHERE key = 'schema_version'")
    # When this agentsaga opens it
    with pytest.raises(SchemaVersionError) as raised:
        open_store(db_url)
    # Then it refuses, naming both versions and the database
    assert str(raised.value).startswith(
        f"database schema version 999 is newer than this agentsaga supports ({SCHEMA_VERSION}): "
    )
    assert db_url.split("?")[0].split("@")[-1] in str(raised.value)
    assert (raised.value.found, raised.value.supported) == (999, SCHEMA_VERSION)


def test_processes_racing_to_create_the_schema_all_succeed(db_url):
    # Given a fresh database and six openers released at once
    start = threading.Barrier(6)
    results: list[object] = []

    def opener() -> None:
        start.wait()
        try:
            with open_store(db_url) as s:
                results.append(s.count_by_status())
        except BaseException as exc:  # collected: a failed opener must fail the test
            results.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every one opened the same, working, empty schema
    assert results == [{}] * 6


# -- SQLite settings --------------------------------------------------------------------------


def test_sqlite_defaults_to_wal_and_synchronous_full(sqlite_url):
    with open_store(sqlite_url) as s:
        new_run(s, "r1")
        info = s.info()
        assert (info["journal_mode"], info["synchronous"], info["busy_timeout"]) == (
            "WAL", "FULL", 5.0
        )
    # WAL is a property of the file, so a fresh connection sees it too
    fresh = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        assert fresh.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        fresh.close()


def test_sqlite_settings_are_configurable(sqlite_url):
    with open_store(sqlite_url, sqlite_synchronous="normal", sqlite_journal_mode="DELETE",
                    busy_timeout=0.25) as s:
        new_run(s, "r1")
        info = s.info()
        assert (info["journal_mode"], info["synchronous"], info["busy_timeout"]) == (
            "DELETE", "NORMAL", 0.25
        )
    fresh = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        assert fresh.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        fresh.close()


def test_in_memory_sqlite_is_a_real_backend_shared_by_threads():
    # Given an in-memory store (one connection, shared)
    with open_store("sqlite://") as s:
        token = new_run(s, "r1", events=0)

        # When several threads append to it
        def append(seq: int) -> None:
            s.append("r1", [ev(seq)], token=token, now=T0)

        threads = [threading.Thread(target=append, args=(seq,)) for seq in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Then all of them landed in the one database
        assert [e.seq for e in s.events("r1")] == list(range(1, 9))
        assert s.info()["path"] == ":memory:"
    with open_store("sqlite:///:memory:") as other:
        assert other.count_by_status() == {}


def test_opening_an_up_to_date_database_needs_no_write_lock(sqlite_url):
    # Given an existing database whose write lock another process holds
    open_store(sqlite_url).close()
    locker = raw_connect(sqlite_url)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        # When a reader opens it without any patience for locks
        with open_store(sqlite_url, busy_timeout=0, retry_for=0) as s:
            # Then it opens and reads (WAL readers never wait for the writer)
            assert s.count_by_status() == {}
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def test_older_schema_runs_registered_migrations_once(db_url, raw_sql, monkeypatch):
    # Given a database at this version, and this code one version later with a migration to it
    open_store(db_url).close()
    calls: list[str] = []

    def add_notes(execute, dialect_name):
        calls.append(dialect_name)
        execute("CREATE TABLE agentsaga_notes (note TEXT)")

    monkeypatch.setattr(schema_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(schema_module.MIGRATIONS, SCHEMA_VERSION, add_notes)
    # When it is opened twice
    open_store(db_url).close()
    open_store(db_url).close()
    # Then the migration ran once, and the database records version 2
    assert len(calls) == 1
    assert raw_sql("SELECT COUNT(*) FROM agentsaga_notes") == [(0,)]
    assert raw_sql("SELECT value FROM agentsaga_meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION + 1),)]


def test_damaged_version_row_is_a_store_error(db_url, raw_sql):
    open_store(db_url).close()
    raw_sql("UPDATE agentsaga_meta SET value = 'banana' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="banana"):
        open_store(db_url)


@pytest.mark.parametrize("create", [True, False], ids=["to write", "to read"])
def test_a_sqlite_url_naming_a_directory_is_a_config_error_saying_so(tmp_path, create):
    # Given a SQLite URL that names a directory
    folder = tmp_path / "runs"
    folder.mkdir()
    # When a store is opened on it / Then the error says it is a directory and how to name a file
    with pytest.raises(ConfigError, match=r"names a directory .*not a database file: name a file in it, "
                                          r"e\.g\. sqlite:///.*runs/agentsaga\.db"):
        open_store(f"sqlite:///{folder}", create=create)
    # And nothing was made in it
    assert list(folder.iterdir()) == []
