"""`open_store`: the one factory that picks a dialect from the URL."""

from __future__ import annotations

import math

from ._api import Store
from ._dialect import Dialect
from ._sqlite import JOURNAL_MODES, SYNCHRONOUS, SQLiteDialect
from ._url import default_url, mask_url, parse_url
from .errors import ConfigError

__all__ = ["open_store"]


def open_store(
    url: str | None = None,
    *,
    sqlite_synchronous: str = "FULL",
    sqlite_journal_mode: str = "WAL",
    busy_timeout: float = 5.0,
    retry_for: float = 10.0,
    create: bool = True,
) -> Store:
    """Open the database at `url` (default: `default_url()`), creating or migrating its schema.

    `create=False` opens an existing agentsaga database and changes nothing about it: no file,
    table or version row is created, no migration is run, and a SQLite file keeps its journal
    mode. A database without the agentsaga tables, or at an older schema version, raises
    `SchemaVersionError` naming it; a SQLite file that does not exist raises
    `StoreUnavailableError`, and an in-memory URL `ConfigError` (there is nothing to read in it).
    What reading a database (the audit verbs) needs.

    `busy_timeout` is how long one SQLite statement waits for a lock; `retry_for` bounds how
    long transient failures (locked, unreachable, connection lost) are retried with backoff
    before `StoreUnavailableError`. Bad URLs and options raise `ConfigError` before any
    connection is attempted.
    """
    if url is None:
        url = default_url()
    kind, parsed = parse_url(url)
    synchronous = str(sqlite_synchronous).upper()
    journal_mode = str(sqlite_journal_mode).upper()
    if synchronous not in SYNCHRONOUS:
        raise ConfigError(
            f"sqlite_synchronous must be one of {', '.join(SYNCHRONOUS)},"
            f" not {sqlite_synchronous!r}"
        )
    if journal_mode not in JOURNAL_MODES:
        raise ConfigError(
            f"sqlite_journal_mode must be one of {', '.join(JOURNAL_MODES)},"
            f" not {sqlite_journal_mode!r}"
        )
    if not isinstance(create, bool):
        raise ConfigError(f"create must be True or False, not {create!r}")
    for option, value in (("busy_timeout", busy_timeout), ("retry_for", retry_for)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ConfigError(f"{option} must be a finite number of seconds >= 0, not {value!r}")
    dialect: Dialect
    if kind == "sqlite":
        dialect = SQLiteDialect(url, parsed, synchronous=synchronous, journal_mode=journal_mode,
                                busy_timeout=float(busy_timeout), create=bool(create))
    else:
        try:
            # Imported here: psycopg is an optional dependency (agentsaga[postgres]).
            from ._postgres import PostgresDialect
        except ImportError as exc:
            raise ConfigError(
                f"{mask_url(url)}: Postgres needs psycopg 3; install agentsaga[postgres] ({exc})"
            ) from None
        dialect = PostgresDialect(url, parsed, retry_for=float(retry_for))
    return Store(dialect, retry_for=float(retry_for), create=bool(create))
