"""Postgres sessions that die under the store: reconnect, and never double-journal.

These use the real server. To lose a reply *after* the server committed, the store talks to
Postgres through the `proxied_url` fixture's `CommitEatingProxy` (tests/conftest.py), which, when
armed, swallows the server's answer to a commit and cuts the connection: exactly what a network
partition at the wrong moment looks like.
"""

from __future__ import annotations

import uuid

import pytest
from store_helpers import T0, ev, new_run, raw_connect

from store import ConflictError, NewSnapshot, open_store

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("batch", [1, 2], ids=["one-event", "batch"])
def test_append_whose_commit_reply_was_lost_is_not_doubled(proxied_url, batch):
    url, proxy = proxied_url
    store = open_store(url, retry_for=5)
    try:
        # Given a run, and a network that will lose the reply to the next append's commit
        token = new_run(store, "r1")
        proxy.arm(proxy.INSERT_DONE if batch == 1 else proxy.COMMIT_DONE)
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
