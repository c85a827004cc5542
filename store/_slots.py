"""`store.slots`: bulkheads in the database. A fixed number of slots per name, for in-flight calls.

One idea: at most N holders of a name at once, across every process using the database (used for
in-flight calls to one API). Runs are not involved: queue limits on runs are the claims' business
(`_queues.py`), because there a live lease already *is* the in-flight run.

N numbered rows per name; a holder takes a free or expired one with one conditional UPDATE and
renews it while it holds it. A holder that dies stops renewing, and its slot is free once it
expires. Times are the caller's (the injected clock), as everywhere in the store.
"""

from __future__ import annotations

from typing import Any

from ._boundary import Boundary
from ._dialect import Dialect

__all__ = ["Slots"]

_TAKE_SLOT = (
    "UPDATE agentsaga_slots SET holder = ?, expires_at = ?"
    " WHERE name = ? AND (holder IS NULL OR expires_at <= ?) AND idx = (SELECT idx FROM agentsaga_slots"
    " WHERE name = ? AND idx < ? AND (holder IS NULL OR expires_at <= ?) ORDER BY idx LIMIT 1{lock})"
    " RETURNING idx"
)


class Slots:
    """Named slots: `acquire`, `renew`, `release`, `held`."""

    def __init__(self, dialect: Dialect, boundary: Boundary) -> None:
        self._d = dialect
        self._b = boundary
        # (name, limit) pairs whose rows this store has made sure exist: one INSERT per pair.
        self._made: set[tuple[str, int]] = set()

    def acquire(self, name: str, *, limit: int, holder: str, ttl: float, now: float) -> int | None:
        """Take one of `limit` slots named `name` for `holder` until now + ttl; its index, or None
        when all are held. A slot whose holder stopped renewing it is free once it expires."""
        if limit <= 0 or ttl <= 0:
            raise ValueError("slots.acquire: limit and ttl must be > 0")
        d = self._d
        take = _TAKE_SLOT.format(lock=d.claim_lock)
        made = self._made

        def work(conn: Any) -> int | None:
            if (name, limit) not in made:
                # The rows exist once per (name, limit); raising a limit adds rows, lowering it
                # leaves the extra rows unused (idx < limit below).
                d.executemany(conn, "INSERT INTO agentsaga_slots (name, idx) VALUES (?, ?)"
                                    " ON CONFLICT (name, idx) DO NOTHING", [(name, i) for i in range(limit)])
                made.add((name, limit))
            rows = d.fetchall(conn, take, (holder, now + ttl, name, now, name, limit, now))
            return int(rows[0][0]) if rows else None

        return self._b.run("slots.acquire", work)

    def release(self, name: str, idx: int, *, holder: str) -> bool:
        """Free the slot if `holder` still holds it; True if it did."""
        sql = "UPDATE agentsaga_slots SET holder = NULL, expires_at = NULL WHERE name = ? AND idx = ? AND holder = ?"
        return self._b.run("slots.release",
                           lambda conn: self._d.execute(conn, sql, (name, idx, holder)).rowcount == 1)

    def renew(self, name: str, idx: int, *, holder: str, ttl: float, now: float) -> bool:
        """Extend the slot to now + ttl; False when `holder` lost it (it expired and was taken)."""
        sql = "UPDATE agentsaga_slots SET expires_at = ? WHERE name = ? AND idx = ? AND holder = ?"
        return self._b.run("slots.renew",
                           lambda conn: self._d.execute(conn, sql, (now + ttl, name, idx, holder)).rowcount == 1)

    def held(self, name: str, *, now: float) -> int:
        """How many slots named `name` are held (not expired) right now."""
        sql = "SELECT COUNT(*) FROM agentsaga_slots WHERE name = ? AND holder IS NOT NULL AND expires_at > ?"
        return int(self._b.run("slots.held", lambda conn: self._d.fetchone(conn, sql, (name, now)))[0])
