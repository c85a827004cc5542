"""`store.failures`: failed attempts to drive a run, and the dead-letter status.

One idea: what the cluster failed to do with a run, and the bookkeeping that moves a run that keeps
failing out of the way (`dead_letter`) and back (`revive`). The journal says what a run did; this
table says what the cluster failed to do with it. A row per event, newest last, in
`agentsaga_run_failures`:

- `error`: an attempt to drive the run raised (the caller's JSON: type, message, traceback);
- `dead`: the run was moved to status `dead` (its `status` column keeps the one to restore);
- `retried`: someone put it back by hand; failures before this row no longer count.

Each row also records the run's `recoveries` counter at that moment: takeovers of a lease whose
owner never released it (a worker that died or stalled) count as failed recoveries too, and the
counter at the last retry is where the count starts again.

`dead` is a status like any other to the store: no claim selects it unless asked to. The counts
over all runs (for `agentsaga stats`) are in `store.stats`, with the other aggregates.
"""

from __future__ import annotations

from typing import Any

from ._boundary import Boundary
from ._dialect import Dialect
from ._fence import Fence
from .errors import RunNotFoundError

__all__ = ["Failures"]

_INSERT = (
    "INSERT INTO agentsaga_run_failures (run_pk, at, owner, kind, error, recoveries, status)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


class Failures:
    """A run's failure rows: `record`, `for_run`, `dead_letter`, `revive`."""

    def __init__(self, dialect: Dialect, boundary: Boundary, fence: Fence) -> None:
        self._d = dialect
        self._b = boundary
        self._fence = fence

    def _leased_row(self, conn: Any, run_id: str, token: int) -> tuple[int, str, int]:
        """(pk, status, recoveries) of the run, locked, if `token` is current; else Fenced/NotFound."""
        d = self._d
        row = d.fetchone(conn, "SELECT pk, status, recoveries, lease_token FROM agentsaga_runs WHERE run_id = ?"
                         + d.lock_update, (run_id,))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
        if row[3] != token:
            raise self._fence.fenced_error(run_id, token, row[3])
        return int(row[0]), row[1], int(row[2])

    def record(self, run_id: str, *, token: int, now: float, owner: str, error: str,
               retry_at: float | None = None) -> None:
        """Record a failed attempt and give the lease back (fenced by `token`), in one transaction.
        With `retry_at`, no claim takes the run before then (a failing run is not retried hot)."""
        d = self._d

        def work(conn: Any) -> None:
            with d.transaction(conn):
                pk, status, recoveries = self._leased_row(conn, run_id, token)
                d.execute(conn, _INSERT, (pk, now, owner, "error", error, recoveries, status))
                sets, params = "lease_owner = NULL, lease_expires_at = NULL", []
                if retry_at is not None:
                    sets += ", wake_at = ?"
                    params.append(retry_at)
                d.execute(conn, f"UPDATE agentsaga_runs SET {sets} WHERE pk = ?", (*params, pk))

        self._b.run("failures.record", work)

    def for_run(self, run_id: str) -> list[tuple[float, str | None, str, str, int, str | None]]:
        """The run's rows, oldest first: (at, owner, kind, error JSON, recoveries then, status then)."""
        sql = (
            "SELECT f.at, f.owner, f.kind, f.error, f.recoveries, f.status FROM agentsaga_run_failures f"
            " JOIN agentsaga_runs r ON r.pk = f.run_pk WHERE r.run_id = ? ORDER BY f.pk"
        )

        def work(conn: Any) -> list[tuple[float, str | None, str, str, int, str | None]]:
            rows = self._d.fetchall(conn, sql, (run_id,))
            if not rows:
                self._fence.require_run(conn, run_id)
            return [(at, owner, kind, error, int(rec), status) for at, owner, kind, error, rec, status in rows]

        return self._b.run("failures.for_run", work)

    def dead_letter(self, run_id: str, *, token: int, now: float, owner: str, error: str,
                    message: str) -> None:
        """Move the run to status `dead` (its lease released, `message` as its error), recording
        `error` and the status it had (`revive` restores it); fenced by `token`."""
        d = self._d

        def work(conn: Any) -> None:
            with d.transaction(conn):
                pk, status, recoveries = self._leased_row(conn, run_id, token)
                d.execute(conn, _INSERT, (pk, now, owner, "dead", error, recoveries, status))
                d.execute(conn, "UPDATE agentsaga_runs SET status = 'dead', error = ?, updated_at = ?,"
                                " lease_owner = NULL, lease_expires_at = NULL WHERE pk = ?", (message, now, pk))

        self._b.run("failures.dead_letter", work)

    def revive(self, run_id: str, *, now: float, by: str) -> str | None:
        """Put a `dead` run back to the status it had, claimable now; that status, or None if the
        run is not dead."""
        d = self._d

        def work(conn: Any) -> str | None:
            with d.transaction(conn):
                row = d.fetchone(conn, "SELECT pk, status, recoveries FROM agentsaga_runs WHERE run_id = ?"
                                 + d.lock_update, (run_id,))
                if row is None:
                    raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
                pk, current, recoveries = row
                if current != "dead":
                    return None
                found = d.fetchone(conn, "SELECT status FROM agentsaga_run_failures WHERE run_pk = ?"
                                         " AND kind = 'dead' ORDER BY pk DESC LIMIT 1", (pk,))
                status = (found[0] if found else None) or "pending"
                d.execute(conn, _INSERT, (pk, now, by, "retried", "{}", recoveries, "dead"))
                d.execute(conn, "UPDATE agentsaga_runs SET status = ?, error = NULL, wake_at = NULL,"
                                " updated_at = ? WHERE pk = ?", (status, now, pk))
                return status

        return self._b.run("failures.revive", work)
