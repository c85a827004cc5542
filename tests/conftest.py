"""Fixtures shared by the whole test suite.

Backend-level tests take `db_url` (or `store`), which runs them once on SQLite and once on
Postgres. Postgres comes from `AGENTSAGA_TEST_PG` (default: local trust auth, database
`test`); each test gets a schema of its own, dropped afterwards. Without a reachable server the
Postgres half is skipped on a laptop and fails in CI (env `CI` set), so a broken backend is
never silently green in CI.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def _mask(url: str) -> str:
    return re.sub(r"(://[^/?#@:]*:)[^/?#@]*@", r"\1***@", url)


def _libpq(url: str) -> str:
    """The URL as libpq reads it: `postgres://` and `postgresql+psycopg://` mean psycopg."""
    return "postgresql://" + url.split("://", 1)[1]


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    """The test Postgres server's URL, verified reachable."""
    url = os.environ.get("AGENTSAGA_TEST_PG", PG_DEFAULT)
    try:
        import psycopg

        with psycopg.connect(_libpq(url), connect_timeout=3):
            pass
    except Exception as exc:  # any reason at all means "no usable server"
        reason = f"{type(exc).__name__}: {str(exc).strip()}"
        if os.environ.get("CI"):
            pytest.fail(f"Postgres not reachable at {_mask(url)}: {reason}")
        pytest.skip(f"Postgres not reachable at {_mask(url)}: {reason}; set AGENTSAGA_TEST_PG")
    return url


@pytest.fixture
def pg_url(pg_base_url: str) -> Iterator[str]:
    """A URL selecting a fresh, empty schema `t_<hex>`; the schema is dropped afterwards."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex}"
    with psycopg.connect(_libpq(pg_base_url), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in pg_base_url else "?"
    yield f"{pg_base_url}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(_libpq(pg_base_url), autocommit=True) as conn:
        # Fail loudly rather than hang if a test left a transaction open in the schema.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A SQLite file in the test's temporary directory."""
    return f"sqlite:///{tmp_path}/agentsaga.db"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn (ids `sqlite`, `postgres`): the URL of an empty database."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url: str):
    """`open_store(db_url)`, closed after the test."""
    from store import open_store

    opened = open_store(db_url)
    yield opened
    opened.close()
