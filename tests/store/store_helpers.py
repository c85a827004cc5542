"""Building blocks for the store tests: events, runs, and a driver connection that reaches
the database behind the store's back (another agentsaga version, damage, a competing writer)."""

from __future__ import annotations

import sqlite3
from typing import Any

from store import NewEvent, Store

T0 = 1_700_000_000.0  # a fixed "now": the store never reads the clock, so neither do tests


def ev(seq: int, kind: str = "StepCompleted", data: str | None = None,
       at: float | None = None) -> NewEvent:
    """An event; by default with a distinct payload and time per seq."""
    return NewEvent(seq=seq, kind=kind, data=data if data is not None else f'{{"n": {seq}}}',
                    at=at if at is not None else T0 + seq)


def new_run(store: Store, run_id: str = "r1", *, events: int = 1, owner: str | None = "w1",
            ttl: float = 30.0, created_at: float = T0, **fields: Any) -> int:
    """Create a run with `events` events (seq 1..n); leased by `owner` unless None."""
    defaults = dict(workflow="wf", version="1", fingerprint="fp", target="{}")
    return store.create_run(
        run_id=run_id, created_at=created_at, events=[ev(i) for i in range(1, events + 1)],
        lease_owner=owner, lease_ttl=ttl if owner else None, **(defaults | fields),
    )


def _sqlite_path(url: str) -> str:
    return url.split("sqlite:///", 1)[1]


def raw_connect(url: str):
    """A driver connection to the database behind `url`, outside any store."""
    if url.startswith("sqlite"):
        return sqlite3.connect(_sqlite_path(url), isolation_level=None, check_same_thread=False)
    import psycopg

    return psycopg.connect("postgresql://" + url.split("://", 1)[1], autocommit=True)
