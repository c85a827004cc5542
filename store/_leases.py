"""`store.leases`: who may write a run. Acquire, renew and release a run's lease.

One idea: the lease and its fencing token. Handing out *many* runs at once (claims) is the queues'
business (`_queues.py`), and when a run may next be claimed is the wake-ups' (`_wakeups.py`); both
lease runs too, but through the claim statement, not through this part.

Every lease change is one conditional UPDATE ... RETURNING: the database decides atomically
whether the caller wins, so two acquirers (or an acquirer and a claimer) can never both get a
token. The token only ever grows; the journal accepts appends only with the current token
(invariant 6), so whoever was leased before a takeover is fenced out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._boundary import Boundary
from ._dialect import CHUNK, Dialect, iter_chunks
from ._fence import Fence
from .errors import LeaseHeldError, RunNotFoundError

__all__ = ["Leases"]

class _Keep:
    """``release``'s default for ``wake_at``: leave the column as it is."""

    __slots__ = ()


KEEP = _Keep()

_TAKE_LEASE = (
    "lease_token = lease_token + 1, lease_owner = ?, lease_expires_at = ?,"
    # A previous owner that never released means the run is being recovered.
    " recoveries = recoveries + (CASE WHEN lease_owner IS NULL THEN 0 ELSE 1 END),"
    # A run taken by its lease is driven, no longer parked: should its new owner die, claims must find
    # it once the lease expires, whatever wake-up time it was parked until (it parks anew to wait).
    " wake_at = NULL"
)
_READ_LEASE = "SELECT lease_owner, lease_expires_at FROM agentsaga_runs WHERE run_id = ?"
_ACQUIRE_RACES = 3  # re-reads allowed when the lease changes between our UPDATE and our read
_RENEW_CHUNK = 500  # runs per renewal statement (2 parameters each: well inside every driver's limit)


class Leases:
    """A run's lease: `acquire`, `renew` (`renew_many` for all a holder's runs at once), `release`,
    and `tokens` (the current tokens of many runs, read at once). Times are the caller's; `ttl` in
    seconds."""

    def __init__(self, dialect: Dialect, boundary: Boundary, fence: Fence) -> None:
        self._d = dialect
        self._b = boundary
        self._fence = fence

    def acquire(
        self, run_id: str, *, owner: str, ttl: float, now: float, force: bool = False,
        status: str | None = None,
    ) -> int:
        """Lease the run if free or expired (or always, with `force`); return the new token."""
        if ttl <= 0:
            raise ValueError("leases.acquire: ttl must be > 0")
        sets = _TAKE_LEASE
        params: list[Any] = [owner, now + ttl]
        if status is not None:
            sets += ", status = ?, updated_at = ?"
            params += [status, now]
        where = "run_id = ?"
        wparams: list[Any] = [run_id]
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
                    raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
                held_by, expires = row
                if held_by is not None and expires is not None and expires > now:
                    break
                # Released or expired between the UPDATE and this read: try again.
            raise LeaseHeldError(
                f"run {run_id!r} is leased by {held_by!r} until {expires}",
                run_id=run_id, owner=held_by, expires_at=expires,
            )

        return self._b.run("leases.acquire", work)

    def renew(self, run_id: str, *, token: int, ttl: float, now: float) -> None:
        """Extend the lease to now + ttl; `FencedError` if `token` is no longer current."""
        if ttl <= 0:
            raise ValueError("leases.renew: ttl must be > 0")
        self._update("leases.renew", run_id, token, "lease_expires_at = ?", (now + ttl,))

    def renew_many(self, held: Mapping[str, int], *, ttl: float, now: float) -> list[str]:
        """Extend every lease in `held` (run id -> token) to now + ttl in one statement per
        `_RENEW_CHUNK` runs; return the run ids that were not renewed (token no longer current, or
        no such run): their holder has lost them."""
        if ttl <= 0:
            raise ValueError("leases.renew_many: ttl must be > 0")
        # In run id order, the order a group commit locks its runs in (store/_journal.py): two
        # transactions that take several run rows each in one order cannot deadlock each other.
        items = sorted(held.items())
        if not items:
            return []
        d = self._d

        def work(conn: Any) -> set[str]:
            renewed: set[str] = set()
            for i in range(0, len(items), _RENEW_CHUNK):
                chunk = items[i:i + _RENEW_CHUNK]
                pairs = ", ".join(["(?, ?)"] * len(chunk))
                sql = (f"UPDATE agentsaga_runs SET lease_expires_at = ? WHERE pk IN (SELECT pk FROM agentsaga_runs"
                       f" WHERE (run_id, lease_token) IN (VALUES {pairs}) ORDER BY run_id{d.lock_update})"
                       " RETURNING run_id")
                params = [now + ttl, *(v for run_id, token in chunk for v in (run_id, int(token)))]
                renewed.update(row[0] for row in d.fetchall(conn, sql, params))
            return renewed

        renewed = self._b.run("leases.renew_many", work)
        return [run_id for run_id in held if run_id not in renewed]

    def tokens(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The current lease token of each run in `run_ids`, read in one statement per `CHUNK`
        runs (one round trip for a whole batch of "is my lease still current?" checks). A run that
        does not exist is absent from the answer; the caller names it. Reads only: no lock taken."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        d = self._d

        def work(conn: Any) -> dict[str, int]:
            found: dict[str, int] = {}
            for chunk in iter_chunks(ids, CHUNK):
                where, params = d.where_in("run_id", chunk)
                sql = f"SELECT run_id, lease_token FROM agentsaga_runs WHERE {where}"
                found.update((run_id, int(token)) for run_id, token in d.fetchall(conn, sql, params))
            return found

        return self._b.run("leases.tokens", work)

    def release(
        self, run_id: str, *, token: int, now: float, status: str | None = None,
        error: str | None = None, wake_at: float | None | _Keep = KEEP,
    ) -> None:
        """Give the lease up (the token is kept), optionally setting status and error, and the
        wake-up time (``wake_at``: a run given back as it was before its lease was taken, parked)."""
        if status is None and error is not None:
            raise ValueError("leases.release: error needs a status")
        sets, params = "lease_owner = NULL, lease_expires_at = NULL", []
        if status is not None:
            sets += ", status = ?, error = ?, updated_at = ?"
            params = [status, error, now]
        if not isinstance(wake_at, _Keep):
            sets += ", wake_at = ?"
            params.append(wake_at)
        self._update("leases.release", run_id, token, sets, params)

    def _update(self, op: str, run_id: str, token: int, sets: str, params: Any) -> None:
        fence = self._fence
        self._b.run(op, lambda conn: fence.update_if_current(conn, run_id, token, sets, params))
