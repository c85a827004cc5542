"""What workers coordinate through: leases (with fencing tokens), breaker state, signals.

A mixin of `Store` (see `_api.py`), split off so each file reads as one idea: `_api.py` is the
journal, this is the shared state around it.

Every lease change is one conditional UPDATE ... RETURNING: the database decides atomically
whether the caller wins, so two acquirers (or an acquirer and a claimer) can never both get a
token. The token only ever grows; the journal accepts appends only with the current token
(invariant 6), so whoever was leased before a takeover is fenced out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import ConflictError, FencedError, LeaseHeldError, RunNotFoundError

if TYPE_CHECKING:
    from ._boundary import Boundary
    from ._dialect import Dialect

__all__ = ["CoordinationMixin"]

_TAKE_LEASE = (
    "lease_token = lease_token + 1, lease_owner = ?, lease_expires_at = ?,"
    # A previous owner that never released means the run is being recovered.
    " recoveries = recoveries + (CASE WHEN lease_owner IS NULL THEN 0 ELSE 1 END)"
)
_READ_LEASE = "SELECT lease_owner, lease_expires_at FROM agentsaga_runs WHERE run_id = ?"
_ACQUIRE_RACES = 3  # re-reads allowed when the lease changes between our UPDATE and our read


def _marks(n: int) -> str:
    return ", ".join("?" * n)


class CoordinationMixin:
    _d: Dialect
    _b: Boundary

    # -- shared helpers --------------------------------------------------------------------------

    def _require_run(self, conn: Any, run_id: str) -> int:
        row = self._d.fetchone(conn, "SELECT pk FROM agentsaga_runs WHERE run_id = ?", (run_id,))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r}", run_id=run_id)
        return row[0]

    def _fenced(self, run_id: str, token: int, current: int) -> FencedError:
        return FencedError(
            f"run {run_id!r}: lease token {token} is stale, the current token is {current}"
            " (the run has been leased again since)",
            run_id=run_id,
            token=token,
            current_token=current,
        )

    def _raise_fenced_or_missing(self, conn: Any, run_id: str, token: int) -> None:
        """After a token-guarded write matched no row: say why."""
        sql = "SELECT lease_token FROM agentsaga_runs WHERE run_id = ?"
        row = self._d.fetchone(conn, sql, (run_id,))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r}", run_id=run_id)
        raise self._fenced(run_id, token, row[0])

    def _guarded_update(
        self, op: str, run_id: str, token: int, sets: str, params: Sequence[Any]
    ) -> None:
        """UPDATE the run's `sets` if `token` is current; else Fenced/RunNotFound."""
        sql = f"UPDATE agentsaga_runs SET {sets} WHERE run_id = ? AND lease_token = ?"

        def work(conn: Any) -> None:
            if self._d.execute(conn, sql, (*params, run_id, token)).rowcount != 1:
                self._raise_fenced_or_missing(conn, run_id, token)

        self._b.run(op, work)

    # -- leases ----------------------------------------------------------------------------------

    def acquire_lease(
        self, run_id: str, *, owner: str, ttl: float, now: float, force: bool = False,
        status: str | None = None,
    ) -> int:
        """Lease the run if free or expired (or always, with `force`); return the new token."""
        if ttl <= 0:
            raise ValueError("acquire_lease: ttl must be > 0")
        sets, params = _TAKE_LEASE, [owner, now + ttl]
        if status is not None:
            sets += ", status = ?, updated_at = ?"
            params += [status, now]
        where, wparams = "run_id = ?", [run_id]
        if not force:
            where += " AND (lease_owner IS NULL OR lease_expires_at <= ?)"
            wparams.append(now)
        sql = f"UPDATE agentsaga_runs SET {sets} WHERE {where} RETURNING lease_token"
        d = self._d

        def work(conn: Any) -> int:
            for _ in range(_ACQUIRE_RACES):
                rows = d.fetchall(conn, sql, (*params, *wparams))
                if rows:
                    return int(rows[0][0])
                row = d.fetchone(conn, _READ_LEASE, (run_id,))
                if row is None:
                    raise RunNotFoundError(f"no run {run_id!r}", run_id=run_id)
                held_by, expires = row
                if held_by is not None and expires is not None and expires > now:
                    break
                # Released or expired between the UPDATE and this read: try again.
            raise LeaseHeldError(
                f"run {run_id!r} is leased by {held_by!r} until {expires}",
                run_id=run_id, owner=held_by, expires_at=expires,
            )

        return self._b.run("acquire_lease", work)

    def renew_lease(self, run_id: str, *, token: int, ttl: float, now: float) -> None:
        """Extend the lease to now + ttl; `FencedError` if `token` is no longer current."""
        if ttl <= 0:
            raise ValueError("renew_lease: ttl must be > 0")
        self._guarded_update("renew_lease", run_id, token, "lease_expires_at = ?", (now + ttl,))

    def release_lease(
        self, run_id: str, *, token: int, now: float, status: str | None = None,
        error: str | None = None,
    ) -> None:
        """Give the lease up (the token is kept), optionally setting status and error."""
        if status is None and error is not None:
            raise ValueError("release_lease: error needs a status")
        sets, params = "lease_owner = NULL, lease_expires_at = NULL", []
        if status is not None:
            sets += ", status = ?, error = ?, updated_at = ?"
            params = [status, error, now]
        self._guarded_update("release_lease", run_id, token, sets, params)

    def set_wake_at(
        self, run_id: str, *, token: int, wake_at: float | None, now: float,
        status: str | None = None,
    ) -> None:
        """Park the run until `wake_at` (None: wake now); claims skip it until then."""
        sets, params = "wake_at = ?", [wake_at]
        if status is not None:
            sets += ", status = ?, updated_at = ?"
            params += [status, now]
        self._guarded_update("set_wake_at", run_id, token, sets, params)

    def wake(self, run_id: str, *, now: float, statuses: Sequence[str] = ("waiting",)) -> bool:
        """Make a parked run claimable now (a signal arrived); True if a run in `statuses` was woken.

        Unfenced on purpose: it changes only when the run may be claimed, never its journal.
        """
        statuses = list(statuses)
        sql = (f"UPDATE agentsaga_runs SET wake_at = ? WHERE run_id = ? AND status IN ({_marks(len(statuses))})")
        return self._b.run("wake", lambda conn: self._d.execute(conn, sql, (now, run_id, *statuses)).rowcount == 1)

    def claim_runs(
        self, *, owner: str, ttl: float, now: float,
        statuses: Sequence[str] = ("pending", "running"), limit: int = 10,
        queues: Sequence[str] | None = None,
    ) -> list[tuple[str, int]]:
        """Lease up to `limit` claimable runs, highest priority then oldest first."""
        if ttl <= 0:
            raise ValueError("claim_runs: ttl must be > 0")
        statuses = [statuses] if isinstance(statuses, str) else list(statuses)
        queue_list = None
        if queues is not None:
            queue_list = [queues] if isinstance(queues, str) else list(queues)
        if limit <= 0 or not statuses or queue_list == []:
            return []
        where = (
            f"status IN ({_marks(len(statuses))})"
            " AND (lease_owner IS NULL OR lease_expires_at <= ?)"
            " AND (wake_at IS NULL OR wake_at <= ?)"
        )
        params: list[Any] = [owner, now + ttl, *statuses, now, now]
        if queue_list is not None:
            where += f" AND queue IN ({_marks(len(queue_list))})"
            params += queue_list
        params.append(limit)
        sql = self._d.claim_sql(where)
        rows = self._b.run("claim_runs", lambda conn: self._d.fetchall(conn, sql, params))
        # RETURNING has no order of its own; hand runs out in the order they were chosen.
        rows.sort(key=lambda r: (-r[2], r[3], r[4]))
        return [(run_id, int(token)) for run_id, token, *_ in rows]

    # -- breakers --------------------------------------------------------------------------------

    def get_breaker(self, name: str) -> tuple[str | None, int]:
        """(state JSON, version) of the breaker; (None, 0) if it was never written."""
        row = self._b.run(
            "get_breaker",
            lambda conn: self._d.fetchone(
                conn, "SELECT state, version FROM agentsaga_breakers WHERE name = ?", (name,)
            ),
        )
        return (None, 0) if row is None else (row[0], int(row[1]))

    def cas_breaker(self, name: str, *, state: str, expected_version: int, now: float) -> bool:
        """Write `state` if the breaker is still at `expected_version`; True if written."""
        if expected_version == 0:
            sql = (
                "INSERT INTO agentsaga_breakers (name, state, version, updated_at)"
                " VALUES (?, ?, 1, ?) ON CONFLICT (name) DO NOTHING"
            )
            params: tuple[Any, ...] = (name, state, now)
        else:
            sql = (
                "UPDATE agentsaga_breakers SET state = ?, version = version + 1, updated_at = ?"
                " WHERE name = ? AND version = ?"
            )
            params = (state, now, name, expected_version)
        return self._b.run(
            "cas_breaker", lambda conn: self._d.execute(conn, sql, params).rowcount == 1
        )

    # -- signals ---------------------------------------------------------------------------------

    def send_signal(self, run_id: str, name: str, data: str, *, now: float) -> int:
        """Queue a signal (JSON `data`) for the run; return its id."""

        def work(conn: Any) -> int:
            rows = self._d.fetchall(
                conn,
                "INSERT INTO agentsaga_signals (run_pk, name, data, sent_at, consumed)"
                " SELECT pk, ?, ?, ?, ? FROM agentsaga_runs WHERE run_id = ? RETURNING pk",
                (name, data, now, False, run_id),
            )
            if not rows:
                raise RunNotFoundError(f"no run {run_id!r}", run_id=run_id)
            return int(rows[0][0])

        return self._b.run("send_signal", work)

    def pending_signals(
        self, run_id: str, name: str | None = None
    ) -> list[tuple[int, str, str, float]]:
        """Unconsumed signals of the run, oldest first: (id, name, data, sent_at)."""

        def work(conn: Any) -> list[tuple[int, str, str, float]]:
            pk = self._require_run(conn, run_id)
            sql = (
                "SELECT pk, name, data, sent_at FROM agentsaga_signals"
                " WHERE run_pk = ? AND consumed = ?"
            )
            params: list[Any] = [pk, False]
            if name is not None:
                sql += " AND name = ?"
                params.append(name)
            rows = self._d.fetchall(conn, sql + " ORDER BY pk", params)
            return [(int(i), n, data, at) for i, n, data, at in rows]

        return self._b.run("pending_signals", work)

    def consume_signal(self, signal_id: int) -> None:
        """Mark one signal consumed; `ConflictError` if unknown or already consumed.

        Prefer `append(..., consume_signals=[id])`, which records the event that handles the
        signal and consumes it in one transaction.
        """

        def work(conn: Any) -> None:
            sql = "UPDATE agentsaga_signals SET consumed = ? WHERE pk = ? AND consumed = ?"
            if self._d.execute(conn, sql, (True, signal_id, False)).rowcount != 1:
                raise ConflictError(f"signal {signal_id} is unknown or already consumed")

        self._b.run("consume_signal", work)

    def _consume(self, conn: Any, run_pk: int, run_id: str, ids: Sequence[int]) -> None:
        """Inside an append's transaction: consume `ids`, all of them or raise."""
        wanted = list(dict.fromkeys(ids))
        sql = (
            "UPDATE agentsaga_signals SET consumed = ?"
            f" WHERE run_pk = ? AND consumed = ? AND pk IN ({_marks(len(wanted))})"
        )
        if self._d.execute(conn, sql, (True, run_pk, False, *wanted)).rowcount != len(wanted):
            raise ConflictError(
                f"run {run_id!r}: signals {wanted} are not all pending for this run"
                " (unknown, another run's, or already consumed)",
                run_id=run_id,
            )
