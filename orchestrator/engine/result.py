"""``RunResult``: what ``run`` / ``resume`` return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.errors import RunFailedError

__all__ = ["RunResult"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """The outcome of driving a run (or of looking at one).

    ``state`` is the folded state: a dict, or an instance of the workflow's state model.
    ``error`` is a one-line summary of why the run did not complete (None when it did).
    ``note`` says how the state was read when it was read without the workflow's code (``result``
    of a run whose workflow is not registered): from which snapshot, and which fields were merged
    by replacement because their reducer is the workflow's own.
    """

    run_id: str
    status: str
    state: Any
    workflow: str
    seq: int
    error: str | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def raise_for_status(self) -> RunResult:
        """Return self when the run completed, else raise ``RunFailedError``."""
        if self.status != "completed":
            detail = f": {self.error}" if self.error else ""
            raise RunFailedError(f"run {self.run_id!r} ended {self.status}{detail}", run_id=self.run_id, status=self.status)
        return self
