"""Event kinds: the vocabulary of the journal. The store sees them only as strings and JSON text.

Every event's ``data`` is a JSON object; the fields each kind carries are documented in
docs/guarantees.md and folded by ``orchestrator.engine.fold.apply``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EventKind", "TERMINAL_STATUSES", "ACTIVE_STATUSES"]


class EventKind:
    RUN_STARTED: Final = "RunStarted"
    RESUMED: Final = "Resumed"
    STEP_STARTED: Final = "StepStarted"
    STEP_COMPLETED: Final = "StepCompleted"
    STEP_FAILED: Final = "StepFailed"
    SNAPSHOT_REJECTED: Final = "SnapshotRejected"
    RUN_COMPLETED: Final = "RunCompleted"
    RUN_FAILED: Final = "RunFailed"
    RUN_CANCELLED: Final = "RunCancelled"


#: A run in one of these never runs a step again.
TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "cancelled", "compensated", "compensation_failed"})
#: Runs that recovery may pick up (once their lease is free or expired; a waiting run once its
#: timer is due or a signal woke it).
ACTIVE_STATUSES: Final = ("pending", "running", "compensating", "waiting")
