"""Reading runs for audit: listing, history, verification, forks, reports and retention.

``AuditMixin`` is mixed into ``Orchestrator``; it uses only ``self.store``, ``self.engine`` and the
Orchestrator's workflow lookup, and never drives a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator import _codec as codec
from store import RunRecord

if TYPE_CHECKING:
    from store import Store

__all__ = ["AuditMixin"]


class AuditMixin:
    store: Store

    def get_run(self, run_id: str) -> RunRecord:
        return self.store.get_run(run_id)

    def list_runs(self, *, status: str | Sequence[str] | None = None, workflow: str | None = None,
                  since: float | None = None, until: float | None = None, limit: int = 100) -> list[RunRecord]:
        return self.store.list_runs(status=status, workflow=workflow, since=since, until=until, limit=limit)

    def history(self, run_id: str) -> list[dict[str, Any]]:
        """Every event of the run in order: ``{"seq", "kind", "at", "data"}`` with data decoded."""
        self.store.get_run(run_id)
        return [{"seq": e.seq, "kind": e.kind, "at": e.at, "data": codec.loads(e.data)} for e in self.store.events(run_id)]

