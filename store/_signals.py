"""`store.signals`: messages sent to a run from outside (a human's approval, another system).

One idea: a per-run inbox of JSON messages, each consumed at most once. Sending does not wake the
run: that is `store.wakeups.wake`, a separate call, because waking changes when a run may be
claimed and a signal may arrive for a run that is not waiting.

Consuming is normally part of journaling the event that handles the signal: `Store.append(...,
consume_signals=[ids])` calls `consume_in_transaction` from inside its own transaction, so the
event and the consumption commit together or not at all. That function is this module's second
public name (for the journal, not for users): it takes the journal's connection and never opens
a boundary call or a transaction of its own. Its third, `insert_in_transaction`, is for creating
a run with signals already waiting in its inbox (a restored savepoint's), in the create's
transaction, under the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._boundary import Boundary
from ._dialect import Dialect, marks
from ._fence import Fence
from .errors import ConflictError, RunNotFoundError

__all__ = ["Signals", "consume_in_transaction", "insert_in_transaction"]


class Signals:
    """A run's inbox: `send`, `pending`, `consume`."""

    def __init__(self, dialect: Dialect, boundary: Boundary, fence: Fence) -> None:
        self._d = dialect
        self._b = boundary
        self._fence = fence

    def send(self, run_id: str, name: str, data: str, *, now: float) -> int:
        """Queue a signal (JSON `data`) for the run; return its id."""

        def work(conn: Any) -> int:
            rows = self._d.fetchall(
                conn,
                "INSERT INTO agentsaga_signals (run_pk, name, data, sent_at, consumed)"
                " SELECT pk, ?, ?, ?, ? FROM agentsaga_runs WHERE run_id = ? RETURNING pk",
                (name, data, now, False, run_id),
            )
            if not rows:
                raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
            return int(rows[0][0])

        return self._b.run("signals.send", work)

    def pending(self, run_id: str, name: str | None = None) -> list[tuple[int, str, str, float]]:
        """Unconsumed signals of the run, oldest first: (id, name, data, sent_at)."""

        def work(conn: Any) -> list[tuple[int, str, str, float]]:
            pk = self._fence.require_run(conn, run_id)
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

        return self._b.run("signals.pending", work)

    def consume(self, signal_id: int) -> None:
        """Mark one signal consumed; `ConflictError` if unknown or already consumed.

        Prefer `append(..., consume_signals=[id])`, which records the event that handles the
        signal and consumes it in one transaction.
        """

        def work(conn: Any) -> None:
            sql = "UPDATE agentsaga_signals SET consumed = ? WHERE pk = ? AND consumed = ?"
            if self._d.execute(conn, sql, (True, signal_id, False)).rowcount != 1:
                raise ConflictError(f"signal {signal_id} is unknown or already consumed")

        self._b.run("signals.consume", work)


def consume_in_transaction(
    dialect: Dialect, conn: Any, run_pk: int, run_id: str, ids: Sequence[int]
) -> None:
    """Inside the caller's transaction on `conn`: consume `ids` of run `run_pk`, all or raise."""
    wanted = list(dict.fromkeys(ids))
    sql = (
        "UPDATE agentsaga_signals SET consumed = ?"
        f" WHERE run_pk = ? AND consumed = ? AND pk IN ({marks(len(wanted))})"
    )
    # RETURNING, not rowcount: inside a pipelined transaction (Postgres) a rowcount is known only
    # after a round trip, which reading the returned rows makes.
    if len(dialect.fetchall(conn, sql + " RETURNING pk", (True, run_pk, False, *wanted))) != len(wanted):
        raise ConflictError(
            f"run {run_id!r}: signals {wanted} are not all pending for this run"
            " (unknown, another run's, or already consumed)",
            run_id=run_id,
        )


def insert_in_transaction(
    dialect: Dialect, conn: Any, run_pk: int, signals: Sequence[tuple[str, str, float]]
) -> None:
    """Inside the caller's transaction on `conn`: queue `signals` ((name, JSON data, sent_at), oldest
    first) for run `run_pk`, unconsumed. One statement per signal, in order: their ids keep the
    order they are given in, which is the order they are delivered in."""
    sql = "INSERT INTO agentsaga_signals (run_pk, name, data, sent_at, consumed) VALUES (?, ?, ?, ?, ?)"
    for name, data, sent_at in signals:
        dialect.execute(conn, sql, (run_pk, name, data, sent_at, False))
