"""`store.breakers`: circuit-breaker state shared by every worker, as opaque JSON with a version.

One idea: a named, versioned blob with compare-and-set. The store does not know what a breaker is
(the state machine lives in `compensations`, its use in `orchestrator.tools.breakers`); it only
guarantees that of two writers who read the same version, exactly one wins.
"""

from __future__ import annotations

from typing import Any

from ._boundary import Boundary
from ._dialect import Dialect

__all__ = ["Breakers"]


class Breakers:
    """Breaker rows: `get` and `compare_and_set`."""

    def __init__(self, dialect: Dialect, boundary: Boundary) -> None:
        self._d = dialect
        self._b = boundary

    def get(self, name: str) -> tuple[str | None, int]:
        """(state JSON, version) of the breaker; (None, 0) if it was never written."""
        row = self._b.run(
            "breakers.get",
            lambda conn: self._d.fetchone(
                conn, "SELECT state, version FROM agentsaga_breakers WHERE name = ?", (name,)
            ),
        )
        return (None, 0) if row is None else (row[0], int(row[1]))

    def compare_and_set(self, name: str, *, state: str, expected_version: int, now: float) -> bool:
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
            "breakers.compare_and_set", lambda conn: self._d.execute(conn, sql, params).rowcount == 1
        )
