"""Retention: what ``gc`` may delete, and the report of what it did (or would do).

Two independent rules, both applied to finished runs only:

- ``keep_snapshots=K``: all but the newest K snapshots of a finished run are deleted. Snapshots
  are an optimisation (invariant 2), so this loses no history; K may be 0.
- ``older_than=S``: a finished run whose end is more than S seconds ago is deleted whole (its
  row, journal, snapshots and signals).

"Finished" is an allow-list, ``GC_STATUSES``, not "anything but running": a status added later
(a run waiting for a signal, say) is never collected by accident. ``compensation_failed`` is
deliberately not in it: such a run still holds effects that were not undone, and
``agentsaga compensate`` needs its journal to finish the job. Deletion is conditional on the status
in the same statement (``delete_runs(..., statuses=GC_STATUSES)``), so a finished run that is
rolled back while gc runs is spared, not deleted mid-flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from store import RunRecord

__all__ = ["GC_STATUSES", "GcReport", "finished_at", "plan_deletions"]

GC_STATUSES: tuple[str, ...] = ("completed", "failed", "cancelled", "compensated")


def finished_at(rec: RunRecord) -> float:
    """When the run ended (the row's last update for a run finished before finished_at existed)."""
    return rec.finished_at if rec.finished_at is not None else rec.updated_at


@dataclass(frozen=True, slots=True)
class GcReport:
    """What ``orc.gc(...)`` did, or with ``dry_run`` would do."""

    dry_run: bool
    keep_snapshots: int | None
    older_than: float | None
    #: runs deleted: {"run_id", "workflow", "status", "finished_at"}
    deleted: tuple[dict[str, Any], ...] = ()
    #: snapshots pruned per run: {"run_id", "status", "deleted": [seq...], "kept": [seq...]}
    pruned: tuple[dict[str, Any], ...] = ()
    #: runs that were not finished and so were never looked at, by status
    untouched: dict[str, int] = field(default_factory=dict)
    #: runs chosen for deletion whose status changed before the delete (spared)
    spared: int = 0

    @property
    def snapshots_deleted(self) -> int:
        return sum(len(p["deleted"]) for p in self.pruned)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run, "keep_snapshots": self.keep_snapshots, "older_than": self.older_than,
            "runs_deleted": len(self.deleted), "snapshots_deleted": self.snapshots_deleted,
            "deleted": list(self.deleted), "pruned": list(self.pruned), "untouched": dict(self.untouched),
            "spared": self.spared,
        }

    def headline(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        text = f"gc {verb} {len(self.deleted)} run(s) and {self.snapshots_deleted} snapshot(s)"
        kept = sum(self.untouched.values())
        if kept:
            text += f"; {kept} unfinished run(s) untouched (" + ", ".join(
                f"{n} {s}" for s, n in sorted(self.untouched.items())) + ")"
        if self.spared:
            text += f"; {self.spared} run(s) spared because they were resumed meanwhile"
        return text


def plan_deletions(runs: Sequence[RunRecord], *, cutoff: float | None) -> list[RunRecord]:
    """The finished runs that ended before ``cutoff`` (none when there is no cutoff)."""
    if cutoff is None:
        return []
    return [r for r in runs if r.status in GC_STATUSES and finished_at(r) < cutoff]
