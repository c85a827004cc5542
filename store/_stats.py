"""`store.stats`: aggregates for `agentsaga stats`. Read-only, cheap, meaning-free.

One idea: numbers over *all* runs, for an operator. They read the tables the other parts write
(runs, leases, wake-ups, failures, events) but change nothing, so they are kept together here
rather than spread over the parts whose rows they count.

The store still does not know what an event means: `recent_event_data` hands back the JSON text of
events of one kind, and the orchestrator reads the fields it wants. Every query stays on an index:
runs by status, leases by (status, lease_expires_at), events by their run's primary key for the
newest runs only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._boundary import Boundary
from ._dialect import Dialect, marks

__all__ = ["Stats"]


class Stats:
    """Aggregates: `queue_depths`, `recovery_totals`, `recent_event_data`, `failure_counts`."""

    def __init__(self, dialect: Dialect, boundary: Boundary) -> None:
        self._d = dialect
        self._b = boundary

    def queue_depths(self, *, now: float, statuses: Sequence[str]) -> list[tuple[str | None, int, int, int, int]]:
        """Per queue, over runs in `statuses`: (queue, ready, in_flight, parked, stale).

        ready: claimable now; in_flight: leased; parked: waiting for a timer or a signal; stale:
        leased, but the lease expired (its holder died or stalled: it will be recovered)."""
        statuses = list(statuses)
        if not statuses:
            return []
        sql = (
            "SELECT queue,"
            " SUM(CASE WHEN (lease_owner IS NULL OR lease_expires_at <= ?) AND (wake_at IS NULL OR wake_at <= ?)"
            " THEN 1 ELSE 0 END),"
            " SUM(CASE WHEN lease_owner IS NOT NULL AND lease_expires_at > ? THEN 1 ELSE 0 END),"
            " SUM(CASE WHEN lease_owner IS NULL AND wake_at > ? THEN 1 ELSE 0 END),"
            " SUM(CASE WHEN lease_owner IS NOT NULL AND lease_expires_at <= ? THEN 1 ELSE 0 END)"
            f" FROM agentsaga_runs WHERE status IN ({marks(len(statuses))}) GROUP BY queue"
        )
        params = (now,) * 5 + tuple(statuses)
        rows = self._b.run("stats.queue_depths", lambda conn: self._d.fetchall(conn, sql, params))
        out = [(q, int(a or 0), int(b or 0), int(c or 0), int(d or 0)) for q, a, b, c, d in rows]
        return sorted(out, key=lambda r: (r[0] is not None, r[0] or ""))

    def recovery_totals(self) -> tuple[int, int]:
        """(runs that were ever recovered, takeovers in total) over all runs."""
        sql = "SELECT SUM(CASE WHEN recoveries > 0 THEN 1 ELSE 0 END), SUM(recoveries) FROM agentsaga_runs"
        row = self._b.run("stats.recovery_totals", lambda conn: self._d.fetchone(conn, sql, ()))
        return (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)

    def recent_event_data(self, kind: str, *, runs: int) -> list[str]:
        """The `data` JSON text of every `kind` event of the `runs` most recently created runs."""
        if runs <= 0:
            return []
        sql = (
            "SELECT e.data FROM agentsaga_events e JOIN"
            " (SELECT pk FROM agentsaga_runs ORDER BY created_at DESC, pk DESC LIMIT ?) r ON r.pk = e.run_pk"
            " WHERE e.kind = ?"
        )
        rows = self._b.run("stats.recent_event_data", lambda conn: self._d.fetchall(conn, sql, (runs, kind)))
        return [r[0] for r in rows]

    def failure_counts(self) -> dict[str, int]:
        """Rows of `agentsaga_run_failures` by kind (error, dead, retried), over all runs."""
        sql = "SELECT kind, COUNT(*) FROM agentsaga_run_failures GROUP BY kind"
        rows = self._b.run("stats.failure_counts", lambda conn: self._d.fetchall(conn, sql, ()))
        return {kind: int(n) for kind, n in rows}

    def snapshot_totals(self) -> list[tuple[str, str, str, int, int]]:
        """(workflow, trigger, validity, snapshots, bytes) over the snapshots the database holds."""
        sql = (
            "SELECT workflow, trigger, validity, COUNT(*), COALESCE(SUM(size_bytes), 0)"
            " FROM agentsaga_snapshots GROUP BY workflow, trigger, validity"
        )
        rows = self._b.run("stats.snapshot_totals", lambda conn: self._d.fetchall(conn, sql, ()))
        return [(w, t, v, int(n), int(b)) for w, t, v, n, b in rows]

    def recent_event_data_by_workflow(self, kind: str, *, runs: int) -> list[tuple[str, str]]:
        """(workflow, `data` JSON text) of every `kind` event of the `runs` most recently created runs."""
        if runs <= 0:
            return []
        sql = (
            "SELECT r.workflow, e.data FROM agentsaga_events e JOIN"
            " (SELECT pk, workflow FROM agentsaga_runs ORDER BY created_at DESC, pk DESC LIMIT ?) r"
            " ON r.pk = e.run_pk WHERE e.kind = ?"
        )
        rows = self._b.run("stats.recent_event_data_by_workflow",
                           lambda conn: self._d.fetchall(conn, sql, (runs, kind)))
        return [(w, d) for w, d in rows]

    def failed_recoveries_by_workflow(self) -> dict[str, int]:
        """Failed recoveries (failure rows of kind error or dead) per workflow, over all runs."""
        sql = (
            "SELECT r.workflow, COUNT(*) FROM agentsaga_run_failures f JOIN agentsaga_runs r ON r.pk = f.run_pk"
            " WHERE f.kind IN ('error', 'dead') GROUP BY r.workflow"
        )
        rows = self._b.run("stats.failed_recoveries_by_workflow", lambda conn: self._d.fetchall(conn, sql, ()))
        return {w: int(n) for w, n in rows}
