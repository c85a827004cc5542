"""What a backend must provide, and the parts every backend shares.

The `Store` and its parts (`_api.py`, `_journal.py`, `_leases.py`, ...) hold all the logic and
speak SQL with `?` placeholders against the tables of `_schema.py`. A dialect supplies only what
differs between SQLite and Postgres: how to connect (and with which settings), the driver's
placeholder style, how a write transaction starts, the row-locking clauses, the hot-path append
statement, the claim query, and how the driver's exceptions map onto `ErrorKind`, the store's
vocabulary for "what to do about this error".
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sqlalchemy.engine import Dialect as SADialect

from ._version import schema_mismatch
from .errors import SchemaVersionError

__all__ = ["Dialect", "ErrorKind", "CHUNK", "iter_chunks", "marks"]

CHUNK = 500  # ids per IN (...) list, far below every driver's parameter limit


class ErrorKind(enum.Enum):
    """How the boundary treats a driver exception."""

    UNIQUE = "unique"  # unique / primary-key violation: the caller maps it to a domain error
    TRANSIENT = "transient"  # locked, deadlock, serialization: nothing was written, retry
    DISCONNECT = "disconnect"  # connection lost: reconnect and retry; a COMMIT may have landed
    UNAVAILABLE = "unavailable"  # retrying cannot help (no such file, authentication failed)
    # a table or column the statement names is missing (a schema changed outside agentsaga), or
    # the file is no database of this kind: report it as the schema's fault, naming the database
    SCHEMA = "schema"
    OTHER = "other"  # a bug or a damaged database: report it at once


class Dialect:
    """Base class of the backends; subclasses override the class attributes and hooks."""

    name: str
    url: str  # as given, with any password masked
    sa_dialect: SADialect  # compiles the SQLModel tables to this backend's DDL
    driver_errors: tuple[type[BaseException], ...]
    # True when all threads must share one connection (SQLite :memory:): the boundary then
    # serialises every call instead of opening a connection per thread.
    shared: bool = False
    # Statements run first in the schema transaction, making concurrent opens take turns.
    schema_lock_sql: tuple[str, ...] = ()
    # Appended to the fencing SELECT of a multi-statement append: share when only inserting
    # children of the run, update when the run row itself will change. Empty where the
    # transaction already holds the database's single write lock (SQLite).
    lock_share: str = ""
    lock_update: str = ""
    # Appended to the claim query's candidate SELECT.
    claim_lock: str = ""
    # Bound parameters one statement may carry (multi-row INSERTs are chunked under it).
    max_params: int = 999
    # What LIMIT takes to mean "no limit" (needed to write OFFSET alone).
    no_limit: str = "ALL"
    # One `?` parameter, a table name: returns a row when the table exists (on search_path).
    table_exists_sql: str

    # -- connections -------------------------------------------------------------------------

    def connect(self) -> Any:
        """A new DBAPI connection in autocommit mode, configured for the store."""
        raise NotImplementedError

    def close(self, conn: Any) -> None:
        conn.close()

    def is_broken(self, conn: Any) -> bool:
        """True when `conn` can no longer be used and must be replaced."""
        raise NotImplementedError

    def transaction(self, conn: Any) -> AbstractContextManager[None]:
        """An explicit write transaction: commit on success, roll back on any exception."""
        raise NotImplementedError

    def pipeline(self, conn: Any) -> AbstractContextManager[Any]:
        """A block whose statements may be sent without waiting for each answer (Postgres: one
        round trip per result actually read, plus one at the end; elsewhere: nothing changes).
        A driver error may then surface at a later statement or at the end of the block, so code
        inside classifies errors around the whole block, not around each statement."""
        return nullcontext()

    def bulk_insert(self, conn: Any, table: str, columns: Sequence[str], types: Sequence[str],
                    rows: Sequence[Sequence[Any]]) -> None:
        """Insert `rows` (tuples in `columns` order) into `table` in one call. `types` are the
        columns' Postgres types, for a backend that sends the rows as one array per column."""
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks(len(columns))})"
        self.executemany(conn, sql, rows)

    def where_in(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """A `column IN (...)` condition for `values` and its parameters (keep `values` under
        `CHUNK`). Here one placeholder each; Postgres passes one array, so the statement's text
        stays the same whatever the count (the driver parses and prepares it once)."""
        return f"{column} IN ({marks(len(values))})", list(values)

    def unique_table(self, exc: BaseException) -> str:
        """The table whose unique key `exc` (classified UNIQUE) violated, without the
        ``agentsaga_`` prefix ("events", "snapshots", "runs"); "" when it cannot tell."""
        text = str(exc)
        for table in ("snapshots", "events", "runs"):
            if f"agentsaga_{table}" in text:
                return table
        return ""

    def info(self, conn: Any) -> dict[str, Any]:
        """Backend settings as the live connection reports them."""
        return {}

    # -- statements --------------------------------------------------------------------------

    def q(self, sql: str) -> str:
        """`sql` with `?` placeholders rewritten to the driver's paramstyle."""
        return sql

    def execute(self, conn: Any, sql: str, params: Sequence[Any]) -> Any:
        return conn.execute(self.q(sql), params)

    def executemany(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        conn.cursor().executemany(self.q(sql), rows)

    def fetchall(self, conn: Any, sql: str, params: Sequence[Any]) -> list[tuple]:
        return list(self.execute(conn, sql, params).fetchall())

    def fetchone(self, conn: Any, sql: str, params: Sequence[Any]) -> tuple | None:
        # fetchall, not fetchone: a half-read cursor keeps SQLite's statement (and in
        # autocommit mode its implicit transaction) open.
        rows = self.fetchall(conn, sql, params)
        return rows[0] if rows else None

    def append_one(self, conn: Any, params: Sequence[Any]) -> int:
        """The hot path: insert one event if the token matches, as one implicit transaction.

        `params` = (seq, kind, at, data, run_id, token); returns the number of rows inserted.
        """
        raise NotImplementedError

    def claim_sql(self, where: str) -> str:
        """The claim statement (`?` style): lease the runs chosen by `where`, return them.

        Parameters, in order: owner, expires_at, then those of `where`, then the limit.
        """
        return (
            "UPDATE agentsaga_runs SET lease_token = lease_token + 1, lease_owner = ?,"
            " lease_expires_at = ?,"
            " recoveries = recoveries + (CASE WHEN lease_owner IS NULL THEN 0 ELSE 1 END)"
            " WHERE pk IN (SELECT pk FROM agentsaga_runs WHERE " + where +
            " ORDER BY priority DESC, created_at, pk LIMIT ?" + self.claim_lock + ")"
            " RETURNING run_id, lease_token, priority, created_at, pk"
        )

    # -- errors ------------------------------------------------------------------------------

    def schema_error(self, exc: BaseException, op: str) -> SchemaVersionError:
        """The error for `exc`, classified SCHEMA while doing `op`: the database, the part missing
        (the driver's first line: "no such column: recoveries") and what to do."""
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return schema_mismatch(self.url, op, detail)

    def classify(self, exc: BaseException, conn: Any | None) -> ErrorKind:
        """What `exc` (one of `driver_errors`) means; `conn` is None while connecting."""
        raise NotImplementedError


def iter_chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Slices of at most `size`, to keep `IN (...)` lists under every driver's limits."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def marks(n: int) -> str:
    """`n` placeholders for an `IN (...)` list: "?, ?, ?"."""
    return ", ".join("?" * n)
