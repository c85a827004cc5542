"""The physical floor for a durable step, and the database plumbing the benchmarks share.

The floor is one small INSERT+COMMIT per transaction issued straight through the driver: stdlib
``sqlite3`` on a file in WAL with ``synchronous=FULL`` (the store's defaults), and psycopg 3 with
autocommit off against the local Postgres (its default ``synchronous_commit=on``). Each is also
measured in its cheapest form, one INSERT that is its own transaction (autocommit), because that
is what the store's hot path issues: the stricter floor is reported beside the defined one. Nothing durable
can cost less per step than that, so every engine's per-step time is read as a ratio to it, measured
in the same run on the same disk (the disk's flush latency varies a lot between machines).

Postgres is found through ``AGENTSAGA_TEST_PG``, else the local default; when it cannot be reached
the Postgres numbers are ``None`` and a one-line reason says why. Every benchmark run works in fresh
schemas of its own (``bench_<pid>_<random>``) and drops them when it ends.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"

# About the size of a trivial step's journaled output ({"n": 123, "pad": "x" * 40} as JSON).
ROW = "x" * 60


def pg_url() -> str:
    return os.environ.get("AGENTSAGA_TEST_PG") or DEFAULT_PG


def pg_unavailable(url: str | None = None) -> str | None:
    """None when Postgres answers, else a one-line reason (no psycopg, refused, auth...)."""
    try:
        import psycopg
    except ImportError as exc:  # the postgres extra is not installed
        return f"psycopg not importable: {exc}"
    try:
        with psycopg.connect(url or pg_url(), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # any failure to reach the server means: no Postgres numbers
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"Postgres not reachable at {mask(url or pg_url())}: {first}"
    return None


def mask(url: str) -> str:
    """The URL with any password replaced, for printing."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    cred, host = rest.rsplit("@", 1)
    user = cred.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in cred else ''}@{host}"


def with_search_path(url: str, schema: str) -> str:
    """The URL with ``options=-csearch_path=<schema>`` added, so unqualified tables land there."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote('-csearch_path=' + schema, safe='')}"


def new_schema_name(tag: str = "") -> str:
    return f"bench_{os.getpid()}_{secrets.token_hex(3)}{('_' + tag) if tag else ''}"


class PgSchemas:
    """Creates fresh schemas on demand and drops every one of them on ``close()``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.created: list[str] = []

    def new(self, tag: str = "") -> str:
        import psycopg

        name = new_schema_name(tag)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        self.created.append(name)
        return name

    def drop(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        if name in self.created:
            self.created.remove(name)

    def close(self) -> None:
        for name in list(self.created):
            try:
                self.drop(name)
            except Exception:  # best effort on the way out; a leftover schema is harmless
                pass


def pg_schema_bytes(url: str, schema: str) -> int:
    """Bytes on disk of every table in ``schema``, with its indexes and TOAST."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'm')",
            (schema,),
        ).fetchone()
    return int(row[0])


# -- SQLite -------------------------------------------------------------------------------------
def sqlite_files(path: str) -> list[str]:
    return [path, path + "-wal", path + "-journal"]


def remove_sqlite(path: str) -> None:
    for p in sqlite_files(path) + [path + "-shm"]:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def sqlite_bytes(path: str) -> int:
    """File + WAL size after a TRUNCATE checkpoint (what the database really holds, not WAL slack).

    Retries briefly if a checkpoint cannot complete because another connection is mid-transaction.
    """
    for _ in range(50):
        conn = sqlite3.connect(path, timeout=5)
        try:
            busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            conn.close()
        if not busy:
            break
        time.sleep(0.02)
    return sum(os.path.getsize(p) for p in sqlite_files(path) if os.path.exists(p))


# -- the floor ----------------------------------------------------------------------------------
def sqlite_floor_once(path: str, n: int = 1000, *, single: bool = False) -> float:
    """Milliseconds per INSERT+COMMIT on a fresh file in WAL, synchronous=FULL.

    ``single=False``: BEGIN, INSERT, COMMIT (the floor as the issues define it). ``single=True``:
    one INSERT in autocommit mode, its own implicit transaction: the cheapest durable write the
    driver offers, and the form the store's single-event append takes, so it is reported beside.
    """
    remove_sqlite(path)
    conn = sqlite3.connect(path, isolation_level=None)  # we issue BEGIN/COMMIT ourselves
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, data TEXT NOT NULL)")
        sql = "INSERT INTO floor (data) VALUES (?)"

        def one() -> None:
            if single:
                conn.execute(sql, (ROW,))
            else:
                conn.execute("BEGIN")
                conn.execute(sql, (ROW,))
                conn.execute("COMMIT")

        for _ in range(50):  # warm the page cache and the WAL file before timing
            one()
        t0 = time.perf_counter()
        for _ in range(n):
            one()
        return (time.perf_counter() - t0) * 1000.0 / n
    finally:
        conn.close()
        remove_sqlite(path)


def pg_floor_once(url: str, n: int = 1000, *, single: bool = False) -> float:
    """Milliseconds per INSERT+COMMIT through psycopg 3 in a fresh schema.

    ``single=False``: autocommit off, ``execute`` then ``commit()`` (psycopg sends BEGIN, the
    INSERT and COMMIT: three round trips; the floor as the brief defines it). ``single=True``:
    autocommit on, one prepared INSERT that commits by itself in one round trip, the form the
    store's single-event append takes; reported beside as the stricter floor.
    """
    import psycopg

    schemas = PgSchemas(url)
    schema = schemas.new("floor")
    try:
        with psycopg.connect(url, autocommit=single) as conn:
            table = f'"{schema}".floor'
            conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, data text NOT NULL)")
            if not single:
                conn.commit()
            sql = f"INSERT INTO {table} (data) VALUES (%s)"

            def one() -> None:
                conn.execute(sql, (ROW,), prepare=True)
                if not single:
                    conn.commit()

            for _ in range(50):  # warm the connection and the table before timing
                one()
            t0 = time.perf_counter()
            for _ in range(n):
                one()
            return (time.perf_counter() - t0) * 1000.0 / n
    finally:
        schemas.close()


def summary(values: list[float]) -> dict[str, float] | None:
    """Median with min and max; None for no values."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


@contextmanager
def pg_schemas(url: str) -> Iterator[PgSchemas]:
    schemas = PgSchemas(url)
    try:
        yield schemas
    finally:
        schemas.close()
