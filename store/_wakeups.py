"""`store.wakeups`: when a run may next be claimed, and being told the moment it may.

One idea: the time at which a run becomes claimable. A run holding its lease *parks* (`park`: no
claim takes it before `wake_at`), a signal *wakes* it (`wake`), and an idle worker must neither
spin nor sleep past work. Two things tell it when to look again:

- `next_due(now=..., statuses=...)`: the earliest time a run that is not claimable now becomes so
  (a lease expires, a parked run's timer is due). Both are index range scans (`status,
  lease_expires_at` and `status, wake_at`), so asking costs the same with ten runs or ten million.
- `listener()`: on Postgres, a dedicated connection LISTENing on the schema's channel. The trigger
  created with the schema (`_schema.py`) NOTIFies it, with the run's queue as payload, whenever a
  run may have become claimable (created, handed back, woken by a signal, retried). SQLite has no
  such thing: `listener()` is None and workers poll (with backoff).

Taking the claimable runs is the queues' part (`_queues.py`); this part only moves and reads the
moment they become claimable.

The listener's connection is its own: LISTEN is per session, and the store's per-thread connections
come and go with the retry boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._boundary import Boundary
from ._dialect import Dialect, marks
from ._fence import Fence
from .errors import StoreUnavailableError

__all__ = ["Wakeups", "Listener"]

_CHANNEL_SQL = "SELECT 'agentsaga_' || left(md5(current_schema()), 16)"


class Listener:
    """A LISTENing Postgres session. ``wait(timeout)`` returns the payloads (queue names; "" for
    runs with no queue) that arrived, ``[]`` on timeout; a lost connection raises
    ``StoreUnavailableError`` (open a new listener to carry on). Use from one thread."""

    def __init__(self, conninfo: str, url: str) -> None:
        import psycopg

        self._url = url
        try:
            self._conn = psycopg.connect(conninfo, autocommit=True)
            channel = self._conn.execute(_CHANNEL_SQL).fetchall()[0][0]
            self._conn.execute(f'LISTEN "{channel}"')
        except psycopg.Error as exc:
            self._close_quietly()
            raise StoreUnavailableError(f"cannot LISTEN on {url}: {type(exc).__name__}: {str(exc).strip()}",
                                        url=url) from exc
        self.channel = channel

    def wait(self, timeout: float) -> list[str]:
        import psycopg

        try:
            first = list(self._conn.notifies(timeout=max(timeout, 0.0), stop_after=1))
            if not first:
                return []
            # Drain what else is queued without waiting: one wake-up for a burst of enqueues.
            more = list(self._conn.notifies(timeout=0.0))
        except psycopg.Error as exc:
            self._close_quietly()
            raise StoreUnavailableError(f"LISTEN connection to {self._url} lost: {type(exc).__name__}: "
                                        f"{str(exc).strip()}", url=self._url) from exc
        return [n.payload for n in first + more]

    def _close_quietly(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a connection already known broken: nothing left to lose
                pass

    def close(self) -> None:
        self._close_quietly()


class Wakeups:
    """When runs may next be claimed: `park`, `wake`, `next_due`, `listener`."""

    def __init__(self, dialect: Dialect, boundary: Boundary, fence: Fence) -> None:
        self._d = dialect
        self._b = boundary
        self._fence = fence

    def park(
        self, run_id: str, *, token: int, wake_at: float | None, now: float,
        status: str | None = None, release: bool = False, unless_signalled: Sequence[str] = (),
    ) -> float | None:
        """Park the run until `wake_at` (None: wake now); claims skip it until then. Fenced by
        `token`: only the lease holder parks its run. With `release`, the lease goes in the same
        transaction.

        `unless_signalled` names the signals the run waits for: when one of them is already pending,
        the run is parked due now instead. Checked under the run row's lock in the same transaction,
        so a signal sent at any moment is never lost: either it is committed before this check (and
        seen here), or its sender's `wake` comes after the park (and sees the run waiting). Returns
        the wake-up time set."""
        names = list(dict.fromkeys(unless_signalled))
        d, fence = self._d, self._fence

        def work(conn: Any) -> float | None:
            with d.transaction(conn):
                row = d.fetchone(conn, "SELECT pk, lease_token FROM agentsaga_runs WHERE run_id = ?" + d.lock_update,
                                 (run_id,))
                if row is None:
                    fence.raise_fenced_or_missing(conn, run_id, token)
                pk, current = row
                if current != token:
                    raise fence.fenced_error(run_id, token, current)
                due = wake_at
                if names:
                    sql = (f"SELECT 1 FROM agentsaga_signals WHERE run_pk = ? AND consumed = ? "
                           f"AND name IN ({marks(len(names))}) LIMIT 1")
                    if d.fetchone(conn, sql, (pk, False, *names)) is not None:
                        due = now
                sets, params = ["wake_at = ?"], [due]
                if status is not None:
                    sets.append("status = ?, updated_at = ?")
                    params += [status, now]
                if release:
                    sets.append("lease_owner = NULL, lease_expires_at = NULL")
                d.execute(conn, f"UPDATE agentsaga_runs SET {', '.join(sets)} WHERE pk = ?", (*params, pk))
                return due

        return self._b.run("wakeups.park", work)

    def wake(self, run_id: str, *, now: float, statuses: Sequence[str] = ("waiting",)) -> bool:
        """Make a parked run claimable now (a signal arrived); True if a run in `statuses` was woken.

        Unfenced on purpose: it changes only when the run may be claimed, never its journal.
        """
        statuses = list(statuses)
        sql = f"UPDATE agentsaga_runs SET wake_at = ? WHERE run_id = ? AND status IN ({marks(len(statuses))})"
        return self._b.run(
            "wakeups.wake", lambda conn: self._d.execute(conn, sql, (now, run_id, *statuses)).rowcount == 1
        )

    def listener(self) -> Listener | None:
        """A new LISTENing session on Postgres (the caller closes it); None on SQLite."""
        conninfo = getattr(self._d, "conninfo", None)
        if self._d.name != "postgresql" or conninfo is None:
            return None
        return Listener(conninfo, self._d.url)

    def next_due(self, *, now: float, statuses: Sequence[str], queues: Sequence[str] | None = None) -> float | None:
        """The earliest time after `now` at which a run in `statuses` (of `queues`, if given) that
        is not claimable now becomes claimable: a live lease expiring, a timer coming due."""
        statuses = list(statuses)
        if not statuses or (queues is not None and not list(queues)):
            return None
        extra, qparams = "", []
        if queues is not None:
            extra = f" AND queue IN ({marks(len(queues))})"
            qparams = list(queues)
        in_statuses = marks(len(statuses))
        lease_sql = (f"SELECT MIN(lease_expires_at) FROM agentsaga_runs WHERE status IN ({in_statuses})"
                     " AND lease_expires_at > ?")
        wake_sql = f"SELECT MIN(wake_at) FROM agentsaga_runs WHERE status IN ({in_statuses}) AND wake_at > ?"

        def work(conn: Any) -> float | None:
            found = []
            for sql in (lease_sql, wake_sql):
                row = self._d.fetchone(conn, sql + extra, (*statuses, now, *qparams))
                if row is not None and row[0] is not None:
                    found.append(float(row[0]))
            return min(found) if found else None

        return self._b.run("wakeups.next_due", work)
