"""The SQLite backend (stdlib sqlite3): the embedded default.

Connections run in autocommit mode (`isolation_level=None`) so that a single-statement append
is one implicit transaction, and a multi-statement write says `BEGIN IMMEDIATE` itself: taking
the write lock up front means the busy handler waits for it, instead of a deferred transaction
failing with SQLITE_BUSY when it tries to upgrade its read snapshot to a write.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.request import pathname2url

from sqlalchemy.dialects import sqlite as sa_sqlite
from sqlalchemy.engine import URL

from ._dialect import Dialect, ErrorKind
from ._url import config_error, mask_url
from .errors import ConfigError, SchemaVersionError, StoreUnavailableError

__all__ = ["SQLiteDialect"]

JOURNAL_MODES = ("WAL", "DELETE", "TRUNCATE", "PERSIST", "MEMORY", "OFF")
SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")  # index == PRAGMA synchronous's number

# Primary codes (the low byte of the extended result code), see sqlite.org/rescode.html.
_ERROR, _BUSY, _LOCKED, _CANTOPEN, _NOTADB = 1, 5, 6, 14, 26
_CONSTRAINT_PRIMARYKEY, _CONSTRAINT_UNIQUE = 1555, 2067

# SQLITE_ERROR's messages for a statement naming a table or column the database lacks.
_MISSING = re.compile(r"^(no such (table|column):|table \S+ has no column named )")

# RETURNING (claims, leases, create_run) arrived in SQLite 3.35.
_MIN_VERSION = (3, 35, 0)

_APPEND_ONE = (
    "INSERT INTO agentsaga_events (run_pk, seq, kind, at, data)"
    " SELECT pk, ?, ?, ?, ? FROM agentsaga_runs WHERE run_id = ? AND lease_token = ?"
)


class SQLiteDialect(Dialect):
    name = "sqlite"
    sa_dialect = sa_sqlite.dialect()
    driver_errors = (sqlite3.Error,)
    no_limit = "-1"
    table_exists_sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"

    def __init__(
        self, url: str, parsed: URL, *, synchronous: str, journal_mode: str, busy_timeout: float,
        create: bool = True,
    ):
        if parsed.username or parsed.password or parsed.host or parsed.port:
            raise config_error(url, "a sqlite URL has no user, host or port (sqlite:///path)")
        if parsed.query:
            raise config_error(url, f"unknown sqlite URL options {sorted(parsed.query)}")
        if sqlite3.sqlite_version_info < _MIN_VERSION:
            raise config_error(
                url, f"SQLite {sqlite3.sqlite_version} is too old; agentsaga needs 3.35 or newer"
            )
        self.url = mask_url(url)
        database = parsed.database or ":memory:"
        # A :memory: database lives inside one connection, so every thread must use that one.
        self.shared = database == ":memory:"
        # Resolved once: a relative path must not name another file if the process later
        # changes directory before some thread opens its connection.
        self.path = database if self.shared else os.path.abspath(database)
        self.synchronous = synchronous
        self.journal_mode = journal_mode
        self.busy_timeout = busy_timeout
        # create=False: the file must exist and is opened as it is: `mode=rw` never creates it
        # (and falls back to reading a write-protected one), and its journal mode is left alone
        # (setting WAL rewrites the header of a file that may be another application's).
        self.create = create
        if not self.shared and os.path.isdir(self.path):
            raise ConfigError(f"{self.url} names a directory ({self.path!r}), not a database file: name a file in it, "
                              f"e.g. sqlite:///{os.path.join(database, 'agentsaga.db')}")
        if not create:
            if self.shared:
                raise ConfigError(
                    f"{self.url} is an in-memory database, new and empty at every open: there is "
                    "nothing in it to read (an open that may not create a schema needs a database "
                    "that exists)"
                )
            if not os.path.exists(self.path):
                raise StoreUnavailableError(
                    f"no database at {database!r} (working directory {os.getcwd()!r}): {self.url} "
                    "names no file, and an open for reading never creates one",
                    url=self.url,
                )

    def connect(self) -> sqlite3.Connection:
        target, uri = self.path, False
        if not self.create:
            target, uri = f"file:{pathname2url(self.path)}?mode=rw", True
        conn = sqlite3.connect(
            target,
            uri=uri,
            timeout=self.busy_timeout,
            isolation_level=None,
            # The boundary guarantees one thread at a time per connection; this lets it close
            # connections left behind by threads that have exited.
            check_same_thread=False,
            cached_statements=256,
        )
        try:
            if not self.shared and self.create:
                # Persistent in the file; a no-op once set. Fetch the answer so the statement
                # is finished before the next one.
                conn.execute(f"PRAGMA journal_mode = {self.journal_mode}").fetchall()
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        except BaseException:
            conn.close()
            raise
        return conn

    def is_broken(self, conn: sqlite3.Connection) -> bool:
        try:
            conn.in_transaction  # noqa: B018 - raises ProgrammingError once closed
        except sqlite3.ProgrammingError:
            return True
        return False

    @contextmanager
    def transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            # COMMIT itself can fail (SQLITE_BUSY in rollback-journal mode), leaving the
            # transaction open; end it either way so the connection is clean for a retry.
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    # The original error is the one to report; a connection that cannot roll
                    # back is closed so the boundary replaces it (is_broken sees it closed).
                    conn.close()
            raise

    def info(self, conn: sqlite3.Connection) -> dict[str, Any]:
        journal = conn.execute("PRAGMA journal_mode").fetchall()[0][0]
        sync = conn.execute("PRAGMA synchronous").fetchall()[0][0]
        busy = conn.execute("PRAGMA busy_timeout").fetchall()[0][0]
        return {
            "sqlite_version": sqlite3.sqlite_version,
            "journal_mode": str(journal).upper(),
            "synchronous": SYNCHRONOUS[sync] if 0 <= sync < len(SYNCHRONOUS) else str(sync),
            "busy_timeout": busy / 1000.0,
            "path": self.path,
        }

    def append_one(self, conn: sqlite3.Connection, params: Sequence[Any]) -> int:
        return conn.execute(_APPEND_ONE, params).rowcount

    def classify(self, exc: BaseException, conn: sqlite3.Connection | None) -> ErrorKind:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None:
            return ErrorKind.OTHER
        if code in (_CONSTRAINT_PRIMARYKEY, _CONSTRAINT_UNIQUE):
            return ErrorKind.UNIQUE
        primary = code & 0xFF
        if primary in (_BUSY, _LOCKED):
            return ErrorKind.TRANSIENT
        if primary == _CANTOPEN:
            return ErrorKind.UNAVAILABLE
        if primary == _NOTADB or (primary == _ERROR and _MISSING.search(str(exc))):
            return ErrorKind.SCHEMA
        return ErrorKind.OTHER

    def schema_error(self, exc: BaseException, op: str) -> SchemaVersionError:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == _NOTADB:
            return SchemaVersionError(
                f"{self.url} is not an agentsaga database: the file is not a SQLite database ({exc}). "
                "Point --db / AGENTSAGA_DB at an agentsaga database, or at a new file to start one",
                found=None)
        return super().schema_error(exc, op)
