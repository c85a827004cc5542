"""Fixtures shared by the whole test suite.

Backend-level tests take `db_url` (or `store`), which runs them once on SQLite and once on
Postgres. Postgres comes from `AGENTSAGA_TEST_PG` (default: local trust auth, database
`test`); each test gets a schema of its own, dropped afterwards. Without a reachable server the
Postgres half is skipped on a laptop and fails in CI (env `CI` set), so a broken backend is
never silently green in CI.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import sqlite3
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"

#: Taken by every test for its whole run (shared), and exclusively by a test that stops the shared
#: Postgres server: with the README's `pytest -n 3` (pytest-xdist) three tests run at once, and a
#: server restart must not cut the other worker's connections. Any pytest session on this machine
#: takes the same lock, so two sessions at once are kept apart the same way.
SERVER_LOCK = os.path.join(tempfile.gettempdir(), "agentsaga-tests-server.lock")
#: Passed through on the way to SERVER_LOCK. flock grants a shared lock while an exclusive one
#: waits, so a worker running test after test kept the restart test waiting for minutes; the
#: restart test holds this gate while it waits, which stops new shared takers at the gate: it waits
#: only for the tests already running.
SERVER_GATE = SERVER_LOCK + ".gate"


@contextmanager
def server_lock(exclusive: bool) -> Iterator[None]:
    """SERVER_LOCK, shared or exclusive, taken through SERVER_GATE (see above)."""
    with open(SERVER_GATE, "a+") as gate, open(SERVER_LOCK, "a+") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _server_share(request: pytest.FixtureRequest) -> Iterator[None]:
    with server_lock(exclusive=request.node.get_closest_marker("restarts_postgres") is not None):
        yield


#: Where the suite's processes keep their bytecode when the environment forbids writing it beside the
#: sources (PYTHONDONTWRITEBYTECODE, see pytest_configure): outside the checkout, shared by every run.
BYTECODE_DIR = os.path.join(tempfile.gettempdir(), "agentsaga-tests-pycache")


def pytest_configure(config: pytest.Config) -> None:
    """With PYTHONDONTWRITEBYTECODE set, every process the suite starts (a console script, a child
    killed with SIGKILL, a worker, a benchmark's child: thousands of them) compiled the project's
    modules from source again, about 0.1 s each on this 2-core machine, and every pytest-xdist worker
    rewrote every test module's asserts again. The suite then keeps bytecode under BYTECODE_DIR
    instead (PYTHONPYCACHEPREFIX): the checkout stays as clean as the variable meant it to, and what
    runs is the same code (a cached file is used only while its source is unchanged). Set here, the
    environment reaches the xdist workers, which start after configuration, and the processes the
    tests start."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ.setdefault("PYTHONPYCACHEPREFIX", BYTECODE_DIR)
    if sys.pycache_prefix is None:
        sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that restarts the shared Postgres server is collected first, so that pytest-xdist hands
    it to a worker at the start: it then waits only for the other worker's first test. Collected in
    the middle, it waited for whatever the other worker was running (59 s behind a benchmark smoke
    test, one worker idle all that time).

    The ``long`` tests (tens of seconds each: the benchmark smoke tests, the wheel) come next. At the
    end of the collection (``tests/test_bench_smoke.py`` sorts after the folders) one of them started
    last kept the run going for a minute with the other workers idle; early, the short tests fill
    the other workers meanwhile."""
    items.sort(key=lambda item: (item.get_closest_marker("restarts_postgres") is None,
                                 item.get_closest_marker("long") is None))


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

        with server_lock(exclusive=False):  # not while another worker's test restarts the server
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


# What the server sends once an autocommit INSERT of one row / an explicit COMMIT is durable:
# CommandComplete with that tag, then ReadyForQuery(idle) = 'Z', length 5, 'I'.
_READY_IDLE = b"Z\x00\x00\x00\x05I"


class CommitEatingProxy:
    """Forwards TCP to Postgres; when armed with a tag, drops the reply that completes it.

    To lose a reply *after* the server committed, a store talks to Postgres through this proxy:
    armed, it swallows the server's answer to a commit and cuts the connection, exactly what a
    network partition at the wrong moment looks like."""

    INSERT_DONE = b"INSERT 0 1\x00"  # an autocommit INSERT of one row
    COMMIT_DONE = b"COMMIT\x00"  # an explicit transaction's COMMIT

    def __init__(self, host: str, port: int):
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._tag: bytes | None = None
        self.ate = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, tag: bytes) -> None:
        self._tag = tag

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed
            server = socket.create_connection(self._target)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while data := src.recv(65536):
                tag = self._tag
                if from_server and tag is not None and tag in data and data.endswith(_READY_IDLE):
                    # The server has committed and is idle; the client never hears of it.
                    self._tag = None
                    self.ate.set()
                    return
                dst.sendall(data)
        except OSError:
            pass  # the other direction closed the sockets
        finally:
            for s in (src, dst):
                # shutdown, not just close: it wakes the sibling thread blocked in recv() on
                # the same socket and sends the FIN the client is waiting to see.
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already shut down by the sibling thread
                s.close()


@pytest.fixture
def proxied_url(pg_url: str) -> Iterator[tuple[str, CommitEatingProxy]]:
    """(URL, proxy): `pg_url` reached through a `CommitEatingProxy`."""
    parts = urlsplit(pg_url)
    proxy = CommitEatingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    # Plain TCP so the proxy can read the protocol; SSL would hide the commit tags.
    url = pg_url.replace(f"@{parts.netloc.split('@', 1)[1]}", f"@127.0.0.1:{proxy.port}", 1)
    yield url + "&sslmode=disable", proxy
    proxy.close()


class LostReply:
    """One write whose commit lands but whose caller hears a retryable error instead, per backend.

    Postgres: the `CommitEatingProxy` loses the server's reply and cuts the session (the store
    sees a lost connection). SQLite has no wire to cut: the store's dialect (an instance attribute,
    as tests/orchestrator/crashflow.py reaches it) lets its next transaction commit, then raises
    the driver's "database is locked", which the store retries as it would a real one."""

    def __init__(self, url: str, proxy: CommitEatingProxy | None, admin_url: str | None = None,
                 app: str | None = None):
        self.url = url
        self._proxy = proxy
        self._admin_url = admin_url
        self._app = app
        self._sqlite_ate = False

    def drop_session(self, store: Any) -> None:
        """Make `store`'s next write fail retryably with nothing written. Postgres: an administrator
        terminates the store's sessions (the next statement finds its connection gone); SQLite: the
        next transaction raises "database is locked" before it begins."""
        if self._proxy is not None:
            import psycopg

            with psycopg.connect(_libpq(self._admin_url or ""), autocommit=True) as admin:
                killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                       " WHERE application_name = %s", (self._app,)).fetchall()
            assert killed and all(ok for (ok,) in killed), f"no session of {self._app} to terminate"
            return
        dialect = store._d

        def locked(conn: Any) -> Any:
            del dialect.transaction  # once
            busy = sqlite3.OperationalError("database is locked (injected: nothing was written)")
            busy.sqlite_errorcode = 5  # SQLITE_BUSY: the store retries it
            raise busy

        dialect.transaction = locked

    def arm(self, store: Any, tag: str) -> None:
        """Lose the reply to `store`'s next write: ``insert`` (Postgres: an autocommit INSERT of
        one row) or ``commit`` (an explicit transaction's COMMIT). On SQLite both are the next
        transaction."""
        if tag not in ("insert", "commit"):
            raise ValueError(f"LostReply.arm: tag must be 'insert' or 'commit', got {tag!r}")
        if self._proxy is not None:
            self._proxy.arm(CommitEatingProxy.INSERT_DONE if tag == "insert" else CommitEatingProxy.COMMIT_DONE)
            return
        dialect = store._d
        real = dialect.transaction

        @contextmanager
        def committed_then_lost(conn: Any) -> Iterator[None]:
            with real(conn):
                yield
            del dialect.transaction  # once: the class's own transaction again
            self._sqlite_ate = True
            lost = sqlite3.OperationalError("database is locked (injected: the COMMIT landed)")
            lost.sqlite_errorcode = 5  # SQLITE_BUSY: the store retries it
            raise lost

        dialect.transaction = committed_then_lost

    @property
    def ate(self) -> bool:
        """Whether the armed fault has fired (a reply was lost)."""
        return self._proxy.ate.is_set() if self._proxy is not None else self._sqlite_ate


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def lost_reply(request: pytest.FixtureRequest) -> LostReply:
    """Each backend in turn (ids `sqlite`, `postgres`): a `LostReply` over an empty database."""
    if request.param == "sqlite":
        return LostReply(request.getfixturevalue("sqlite_url"), None)
    url, proxy = request.getfixturevalue("proxied_url")
    app = f"lostreply_{uuid.uuid4().hex[:12]}"
    return LostReply(f"{url}&application_name={app}", proxy, request.getfixturevalue("pg_url"), app)
