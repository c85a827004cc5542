"""`store.queues`: handing runs out to workers. Claims, with or without a queue's limits.

One idea: which runs a worker may take now, and taking them (leasing them with a new token, in the
same statement). Leasing one named run is `store.leases`; when a parked run becomes claimable
again is `store.wakeups`; bulkheads for a tool's calls are `store.slots`.

- `claim`: lease up to `limit` claimable runs, highest priority then oldest first (optionally of
  some queues only).
- `claim_some`: the same, with exclusions: queues claimed elsewhere (under their limits) and runs
  the caller must not take.
- `claim_from`: one queue under its limits. Limits hold across every process using the database,
  so they are decided by the database, never by counting in memory:
  - **concurrency** (`concurrency=N`): at most N runs of the queue leased at once. Live leases
    *are* the in-flight runs, so nothing extra has to be kept in step: a worker that dies frees
    its share when its leases expire, a run handed back frees it at once. Counting and claiming
    happen in one transaction under a per-queue lock (a Postgres advisory transaction lock;
    SQLite's `BEGIN IMMEDIATE` already admits one writer), so two workers cannot both see room
    for the last run.
  - **rate** (`rate=(n, per)`): at most n runs handed out in any window of `per` seconds. A
    sliding window, not a token bucket: a bucket lets 2n through across a window boundary. Each
    hand-out is a row in `agentsaga_queue_starts`; rows older than the window are deleted as the
    window slides.
- `in_flight`: how many runs of a queue are leased right now.

Times are the caller's (the injected clock), as everywhere in the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._boundary import Boundary
from ._dialect import Dialect, marks

__all__ = ["Queues"]

# Per schema as well as per queue: tenants (and test schemas) sharing a database do not queue
# behind each other's claims.
_PG_QUEUE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('agentsaga.queue'), hashtext(current_schema() || ':' || ?))"


def _listed(values: Sequence[str] | str | None) -> list[str] | None:
    if values is None:
        return None
    return [values] if isinstance(values, str) else list(values)


class Queues:
    """Claims: `claim`, `claim_some`, `claim_from` (under a queue's limits), `in_flight`."""

    def __init__(self, dialect: Dialect, boundary: Boundary) -> None:
        self._d = dialect
        self._b = boundary

    def claim(
        self, *, owner: str, ttl: float, now: float,
        statuses: Sequence[str] = ("pending", "running"), limit: int = 10,
        queues: Sequence[str] | None = None,
    ) -> list[tuple[str, int]]:
        """Lease up to `limit` claimable runs, highest priority then oldest first."""
        if ttl <= 0:
            raise ValueError("queues.claim: ttl must be > 0")
        statuses = [statuses] if isinstance(statuses, str) else list(statuses)
        queue_list = _listed(queues)
        if limit <= 0 or not statuses or queue_list == []:
            return []
        where, params = self._claim_where(statuses, now, queue_list, (), ())
        return self._b.run("queues.claim",
                           lambda conn: self._claim(conn, owner, ttl, now, where, params, limit))

    def claim_some(
        self, *, owner: str, ttl: float, now: float, statuses: Sequence[str], limit: int,
        queues: Sequence[str] | None = None, not_queues: Sequence[str] = (),
        not_runs: Sequence[str] = (),
    ) -> list[tuple[str, int]]:
        """`claim`, plus exclusions: queues claimed elsewhere (under their limits) and runs
        this caller must not take (it could not import their workflow)."""
        if ttl <= 0:
            raise ValueError("queues.claim_some: ttl must be > 0")
        statuses = list(statuses)
        queue_list = _listed(queues)
        if limit <= 0 or not statuses or queue_list == []:
            return []
        where, params = self._claim_where(statuses, now, queue_list, not_queues, not_runs)
        return self._b.run("queues.claim_some",
                           lambda conn: self._claim(conn, owner, ttl, now, where, params, limit))

    def claim_from(
        self, queue: str, *, owner: str, ttl: float, now: float, statuses: Sequence[str],
        limit: int, concurrency: int | None = None, rate: tuple[int, float] | None = None,
        not_runs: Sequence[str] = (),
    ) -> tuple[list[tuple[str, int]], bool]:
        """Claim up to `limit` runs of `queue`, keeping at most `concurrency` of its runs leased
        across all processes and at most `rate[0]` handed out per `rate[1]` seconds.

        Returns the claimed (run_id, token) pairs and whether a limit cut the claim short (then
        runs may be waiting for room: look again soon; else the queue had no more runnable runs)."""
        if ttl <= 0:
            raise ValueError("queues.claim_from: ttl must be > 0")
        statuses = list(statuses)
        if limit <= 0 or not statuses:
            return [], False
        d = self._d
        where, params = self._claim_where(statuses, now, [queue], (), not_runs)
        in_flight_sql = (
            f"SELECT COUNT(*) FROM agentsaga_runs WHERE status IN ({marks(len(statuses))})"
            " AND lease_expires_at > ? AND queue = ?"
        )

        def work(conn: Any) -> tuple[list[tuple[str, int]], bool]:
            with d.transaction(conn):
                if d.name == "postgresql":
                    d.execute(conn, _PG_QUEUE_LOCK, (queue,))
                room = limit
                if concurrency is not None:
                    busy = d.fetchone(conn, in_flight_sql, (*statuses, now, queue))[0]
                    room = min(room, concurrency - int(busy))
                if rate is not None:
                    n, per = rate
                    d.execute(conn, "DELETE FROM agentsaga_queue_starts WHERE queue = ? AND at <= ?",
                              (queue, now - per))
                    used = d.fetchone(conn, "SELECT COUNT(*) FROM agentsaga_queue_starts WHERE queue = ?",
                                      (queue,))[0]
                    room = min(room, n - int(used))
                if room <= 0:
                    return [], True
                claimed = self._claim(conn, owner, ttl, now, where, params, room)
                if rate is not None and claimed:
                    d.executemany(conn, "INSERT INTO agentsaga_queue_starts (queue, at) VALUES (?, ?)",
                                  [(queue, now)] * len(claimed))
                return claimed, room < limit and len(claimed) == room

        return self._b.run("queues.claim_from", work)

    def in_flight(self, queue: str, *, now: float, statuses: Sequence[str]) -> int:
        """How many runs of `queue` are leased right now (by anyone)."""
        statuses = list(statuses)
        sql = (
            f"SELECT COUNT(*) FROM agentsaga_runs WHERE status IN ({marks(len(statuses))})"
            " AND lease_expires_at > ? AND queue = ?"
        )
        row = self._b.run("queues.in_flight",
                          lambda conn: self._d.fetchone(conn, sql, (*statuses, now, queue)))
        return int(row[0])

    # -- shared by the claims -------------------------------------------------------------------

    def _claim_where(self, statuses: Sequence[str], now: float, queues: list[str] | None,
                     not_queues: Sequence[str], not_runs: Sequence[str]) -> tuple[str, list[Any]]:
        where = (
            f"status IN ({marks(len(statuses))})"
            " AND (lease_owner IS NULL OR lease_expires_at <= ?)"
            " AND (wake_at IS NULL OR wake_at <= ?)"
        )
        params: list[Any] = [*statuses, now, now]
        if queues is not None:
            where += f" AND queue IN ({marks(len(queues))})"
            params += queues
        if not_queues:
            # NULL NOT IN (...) is NULL, not true: runs with no queue must stay claimable.
            where += f" AND (queue IS NULL OR queue NOT IN ({marks(len(not_queues))}))"
            params += list(not_queues)
        if not_runs:
            where += f" AND run_id NOT IN ({marks(len(not_runs))})"
            params += list(not_runs)
        return where, params

    def _claim(self, conn: Any, owner: str, ttl: float, now: float, where: str, params: list[Any],
               limit: int) -> list[tuple[str, int]]:
        sql = self._d.claim_sql(where)
        rows = self._d.fetchall(conn, sql, [owner, now + ttl, *params, limit])
        rows.sort(key=lambda r: (-r[2], r[3], r[4]))  # RETURNING has no order of its own
        return [(run_id, int(token)) for run_id, token, *_ in rows]
