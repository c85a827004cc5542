"""Postgres sessions that die under the store: reconnect, and never double-journal.

These use the real server. To lose a reply *after* the server committed, the store talks to
Postgres through a small TCP proxy that, when armed, swallows the server's answer to a commit
and cuts the connection: exactly what a network partition at the wrong moment looks like.
"""

from __future__ import annotations

import socket
import threading
import uuid
from urllib.parse import urlsplit

import pytest
from store_helpers import T0, ev, new_run, raw_connect

from store import ConflictError, NewSnapshot, open_store

pytestmark = pytest.mark.postgres

# What the server sends once an autocommit INSERT of one row / an explicit COMMIT is durable:
# CommandComplete with that tag, then ReadyForQuery(idle) = 'Z', length 5, 'I'.
_READY_IDLE = b"Z\x00\x00\x00\x05I"
_INSERT_DONE = b"INSERT 0 1\x00"
_COMMIT_DONE = b"COMMIT\x00"


class CommitEatingProxy:
    """Forwards TCP to Postgres; when armed with a tag, drops the reply that completes it."""

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
def proxied_url(pg_url):
    parts = urlsplit(pg_url)
    proxy = CommitEatingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    # Plain TCP so the proxy can read the protocol; SSL would hide the commit tags.
    url = pg_url.replace(f"@{parts.netloc.split('@', 1)[1]}", f"@127.0.0.1:{proxy.port}", 1)
    yield url + "&sslmode=disable", proxy
    proxy.close()


@pytest.mark.parametrize("batch", [1, 2], ids=["one-event", "batch"])
def test_append_whose_commit_reply_was_lost_is_not_doubled(proxied_url, batch):
    url, proxy = proxied_url
    store = open_store(url, retry_for=5)
    try:
        # Given a run, and a network that will lose the reply to the next append's commit
        token = new_run(store, "r1")
        proxy.arm(_INSERT_DONE if batch == 1 else _COMMIT_DONE)
        events = [ev(2 + i) for i in range(batch)]
        # When appending: the commit lands, the session dies, the store retries
        extra = {} if batch == 1 else {"status": "running",
                                       "snapshot": NewSnapshot(3, "{}", "h", "every", T0)}
        store.append("r1", events, token=token, now=T0 + 5, **extra)
        # Then the retry recognised its own committed rows: one copy, no error
        assert proxy.ate.is_set()
        assert [e.seq for e in store.events("r1")] == list(range(1, 2 + batch))
        # And a genuinely different event at a taken seq is still a conflict
        with pytest.raises(ConflictError):
            store.append("r1", [ev(2, data='{"other": 1}')], token=token, now=T0)
    finally:
        store.close()


def test_store_reconnects_after_its_session_is_killed(pg_url):
    # Given a store whose Postgres session is then terminated by an administrator
    app = f"victim_{uuid.uuid4().hex[:12]}"
    store = open_store(f"{pg_url}&application_name={app}", retry_for=5)
    admin = raw_connect(pg_url)
    try:
        token = new_run(store, "r1")
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        ).fetchall()
        assert killed == [(True,)]
        # When the store is used again
        store.append("r1", [ev(2)], token=token, now=T0)
        # Then it reconnected transparently and the append landed once
        assert [e.seq for e in store.events("r1")] == [1, 2]
    finally:
        admin.close()
        store.close()
