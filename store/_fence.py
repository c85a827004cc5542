"""The fence: finding a run, and telling a stale lease token from a missing run.

Invariant 6 (one writer per run) is enforced by every write that names a run and a token: the
journal's appends, the lease changes, parking a run, recording its failures. They all need the same
three answers, so they share this one collaborator (built once by `Store.__init__` and handed to
each part that writes under a token) instead of each keeping its own copy:

- `require_run`: the run's primary key, or `RunNotFoundError`;
- `fenced_error`: the `FencedError` naming both tokens;
- `raise_fenced_or_missing`: after a token-guarded write matched no row, say why;
- `update_if_current`: the token-guarded single-row UPDATE itself.

Everything here works on a connection the caller already holds, inside the caller's `Boundary`
call (and transaction, if any): the fence adds no round trip and no transaction of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from ._dialect import Dialect
from .errors import FencedError, RunNotFoundError

__all__ = ["Fence"]


class Fence:
    """Run lookups and stale-token errors shared by every part that writes under a lease token."""

    def __init__(self, dialect: Dialect) -> None:
        self._d = dialect

    def require_run(self, conn: Any, run_id: str) -> int:
        """The run's primary key; `RunNotFoundError` if there is no such run."""
        row = self._d.fetchone(conn, "SELECT pk FROM agentsaga_runs WHERE run_id = ?", (run_id,))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
        return row[0]

    def fenced_error(self, run_id: str, token: int, current: int) -> FencedError:
        return FencedError(
            f"run {run_id!r}: lease token {token} is stale, the current token is {current}"
            " (the run has been leased again since: another process took it over, and this one must stop"
            " driving it; the new owner continues it)",
            run_id=run_id,
            token=token,
            current_token=current,
        )

    def raise_fenced_or_missing(self, conn: Any, run_id: str, token: int) -> NoReturn:
        """After a token-guarded write matched no row: say why."""
        sql = "SELECT lease_token FROM agentsaga_runs WHERE run_id = ?"
        row = self._d.fetchone(conn, sql, (run_id,))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
        raise self.fenced_error(run_id, token, row[0])

    def update_if_current(
        self, conn: Any, run_id: str, token: int, sets: str, params: Sequence[Any]
    ) -> None:
        """UPDATE the run's `sets` if `token` is current; else Fenced/RunNotFound."""
        sql = f"UPDATE agentsaga_runs SET {sets} WHERE run_id = ? AND lease_token = ?"
        if self._d.execute(conn, sql, (*params, run_id, token)).rowcount != 1:
            self.raise_fenced_or_missing(conn, run_id, token)
