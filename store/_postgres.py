"""The Postgres backend (psycopg 3): one database shared by many workers.

Connections run in autocommit mode, so the single-statement append is one round trip (no
BEGIN/COMMIT pair); multi-statement writes open an explicit transaction. Writers lock the run
row they fence on (`FOR SHARE` when only adding journal rows, `FOR NO KEY UPDATE` when they
will also change the run row, so two appenders of one run never both hold share locks and then
deadlock upgrading them). Claims use `FOR UPDATE SKIP LOCKED`, so many workers polling one
table never wait on each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy.dialects.postgresql import psycopg as sa_psycopg
from sqlalchemy.engine import URL

from ._dialect import Dialect, ErrorKind
from ._url import config_error, mask_url

__all__ = ["PostgresDialect"]

_APPEND_ONE = (
    "INSERT INTO agentsaga_events (run_pk, seq, kind, at, data)"
    " SELECT pk, %s, %s, %s, %s FROM agentsaga_runs WHERE run_id = %s AND lease_token = %s"
    # Waits for a concurrent takeover to commit (then the new token fails the WHERE) or makes
    # the takeover wait for this insert: the fencing check cannot interleave with a takeover.
    " FOR SHARE"
)

# SQLSTATEs after which the session is gone even if psycopg has not noticed yet.
_SESSION_LOST = frozenset({"57P01", "57P02", "57P03"})  # admin/crash shutdown, starting up
# Failures that leave the session usable and succeed when simply tried again.
_ROLLED_BACK = frozenset({"40001", "40P01"})  # serialization failure, deadlock detected
_RETRY_IN_PLACE = frozenset({"55P03", "53300"})  # lock not available, too many connections
# A statement naming a table or column the schema lacks: undefined_table, undefined_column.
_SCHEMA_MISSING = frozenset({"42P01", "42703"})
# A refused login carries no SQLSTATE in libpq's connect error, only the server's FATAL text:
# these mean the URL itself is wrong (database, role, password, pg_hba), so retrying cannot help.
_PERMANENT_AT_CONNECT = re.compile(
    r"database \".*\" does not exist|role \".*\" does not exist|password authentication failed"
    r"|no pg_hba\.conf entry|(peer|ident|SCRAM|GSSAPI|SSPI|certificate) authentication failed"
    r"|no password supplied|permission denied for database|not permitted to log in",
    re.IGNORECASE,
)


# The Python type each bulk-inserted column's values are made into (see `bulk_insert`).
_CAST = {"double precision": float, "bigint": int, "integer": int}


class PostgresDialect(Dialect):
    name = "postgresql"
    sa_dialect = sa_psycopg.dialect()
    driver_errors = (psycopg.Error,)
    # Per schema, so test schemas (and tenants) in one database do not queue behind each other.
    schema_lock_sql = (
        "SELECT pg_advisory_xact_lock(hashtext('agentsaga.schema'), hashtext(current_schema()))",
    )
    lock_share = " FOR SHARE"
    lock_update = " FOR NO KEY UPDATE"
    claim_lock = " FOR UPDATE SKIP LOCKED"
    table_exists_sql = "SELECT 1 WHERE to_regclass(?) IS NOT NULL"
    max_params = 32767

    def __init__(self, url: str, parsed: URL, *, retry_for: float):
        if parsed.port is not None and not 1 <= parsed.port <= 65535:
            raise config_error(url, f"port {parsed.port} is out of range")
        # libpq parses the URI itself (multi-host lists, percent-escapes, every query option);
        # asking it here, without connecting, turns an unknown option into a ConfigError now.
        try:
            params = conninfo_to_dict("postgresql://" + url.split("://", 1)[1])
        except psycopg.Error as exc:
            raise config_error(url, str(exc).strip()) from None
        # Without a timeout a black-holed host blocks in connect() far beyond `retry_for`.
        params.setdefault("connect_timeout", str(max(2, min(30, math.ceil(retry_for)))))
        self.url = mask_url(url)
        self.conninfo = make_conninfo("", **params)
        self._q: dict[str, str] = {}
        self._bulk: dict[tuple[Any, ...], str] = {}

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.conninfo, autocommit=True)

    def is_broken(self, conn: psycopg.Connection) -> bool:
        return conn.closed or conn.broken

    def transaction(self, conn: psycopg.Connection):
        # In autocommit mode psycopg's transaction block sends BEGIN, then COMMIT, or ROLLBACK
        # when the block raises.
        return conn.transaction()

    def pipeline(self, conn: psycopg.Connection):
        # psycopg's pipeline mode: statements are queued and sent together; reading a result (or
        # leaving the block) is one round trip for everything queued before it.
        return conn.pipeline()

    def bulk_insert(self, conn: psycopg.Connection, table: str, columns: Sequence[str], types: Sequence[str],
                    rows: Sequence[Sequence[Any]]) -> None:
        # One statement of one binary array per column, unnested into rows: a third of the driver's
        # CPU of executemany (which sends, and in a pipeline syncs its buffers, row by row), and one
        # statement text whatever the count, so it is prepared once.
        key = (table, tuple(columns), tuple(types))
        sql = self._bulk.get(key)
        if sql is None:
            arrays = ", ".join(f"%b::{t}[]" for t in types)
            sql = self._bulk[key] = f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays})"
        # An array holds one type: a float column's ints (an injected clock's whole seconds) are
        # sent as floats, as the database would store them anyway.
        arrays = [[None if v is None else _CAST[t](v) for v in column] if t in _CAST else list(column)
                  for t, column in zip(types, zip(*rows, strict=True), strict=True)]
        conn.execute(sql, arrays, prepare=True)

    def where_in(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        # One array parameter: a text of hundreds of placeholders is parsed again on every call
        # (too long for psycopg's query cache) and never prepared.
        return f"{column} = ANY(?)", [list(values)]

    def unique_table(self, exc: BaseException) -> str:
        diag = getattr(exc, "diag", None)
        table = getattr(diag, "table_name", None) or ""
        if table.startswith("agentsaga_"):
            return table[len("agentsaga_"):]
        return super().unique_table(exc)

    def info(self, conn: psycopg.Connection) -> dict[str, Any]:
        schema = conn.execute("SELECT current_schema()").fetchall()[0][0]
        return {"server_version": conn.info.server_version, "schema": schema}

    def q(self, sql: str) -> str:
        cached = self._q.get(sql)
        if cached is None:
            cached = self._q[sql] = sql.replace("%", "%%").replace("?", "%s")
        return cached

    def append_one(self, conn: psycopg.Connection, params: Sequence[Any]) -> int:
        # prepare=True: parse and plan once per connection, not after psycopg's default of
        # five executions.
        return conn.execute(_APPEND_ONE, params, prepare=True).rowcount

    def claim_sql(self, where: str) -> str:
        # `= ANY(ARRAY(subquery))` makes the candidate SELECT an init plan that runs exactly
        # once; with `IN (subquery)` the planner may rescan a LIMIT ... SKIP LOCKED subquery
        # and lease more rows than asked for.
        return (
            "UPDATE agentsaga_runs SET lease_token = lease_token + 1, lease_owner = ?,"
            " lease_expires_at = ?,"
            " recoveries = recoveries + (CASE WHEN lease_owner IS NULL THEN 0 ELSE 1 END)"
            " WHERE pk = ANY(ARRAY(SELECT pk FROM agentsaga_runs WHERE " + where +
            " ORDER BY priority DESC, created_at, pk LIMIT ?" + self.claim_lock + "))"
            " RETURNING run_id, lease_token, priority, created_at, pk"
        )

    def classify(self, exc: BaseException, conn: psycopg.Connection | None) -> ErrorKind:
        if isinstance(exc, pg_errors.UniqueViolation):
            return ErrorKind.UNIQUE
        sqlstate = getattr(exc, "sqlstate", None) or ""
        if conn is None:  # while connecting
            if sqlstate[:2] in ("28", "3D") or _PERMANENT_AT_CONNECT.search(str(exc)):
                return ErrorKind.UNAVAILABLE  # authentication failed, no such database or role
            if isinstance(exc, psycopg.OperationalError):  # refused, timed out, starting up
                return ErrorKind.TRANSIENT
            return ErrorKind.OTHER
        if self.is_broken(conn) or sqlstate[:2] == "08" or sqlstate in _SESSION_LOST:
            return ErrorKind.DISCONNECT
        # A serialization failure or a deadlock victim: the server rolled the whole transaction
        # back, so running it again is safe. By SQLSTATE: psycopg's DeadlockDetected and
        # SerializationFailure are not TransactionRollback subclasses. (Not all of class 40:
        # 40003, statement completion unknown, is not known to be rolled back.)
        if sqlstate in _ROLLED_BACK or isinstance(exc, pg_errors.TransactionRollback) or sqlstate in _RETRY_IN_PLACE:
            return ErrorKind.TRANSIENT
        if sqlstate in _SCHEMA_MISSING:
            return ErrorKind.SCHEMA
        return ErrorKind.OTHER
