"""``RunResult``: what ``run`` / ``resume`` return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.errors import RunFailedError

__all__ = ["FAILED_STATUSES", "RunResult"]


#: The statuses of a run that ended without doing its work (``raise_for_status`` raises for them).
FAILED_STATUSES = frozenset({"failed", "compensated", "compensation_failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class RunResult:
    """The outcome of driving a run (or of looking at one).

    ``state`` is the folded state: a dict, or an instance of the workflow's state model.
    ``error`` is a one-line summary of why the run did not complete (None when it did).
    ``failed_step`` names the step whose failure ended the run (failed, compensated or
    compensation_failed), when one did.
    ``note`` says how the state was read when it was read without the workflow's code (``result``
    of a run whose workflow is not registered): from which snapshot, and which fields were merged
    by replacement because their reducer is the workflow's own.
    ``in_doubt`` lists each effect of an ended run that may have taken effect and was not undone
    (``{"step", "key", "reason"}``): its step failed after its key left, or it was in flight when the
    run was cancelled (docs/sagas.md, "In doubt after a failure").
    """

    run_id: str
    status: str
    state: Any
    workflow: str
    seq: int
    error: str | None = None
    note: str | None = None
    failed_step: str | None = None
    in_doubt: tuple[dict[str, Any], ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def raise_for_status(self) -> RunResult:
        """Return self when the run did not fail, so it chains (``orc.run(...).raise_for_status().state``);
        raise ``RunFailedError`` naming the run, the failed step and its error when it ended failed,
        compensated, compensation_failed or cancelled. A run still waiting (for a signal or a timer)
        has not failed: it is returned too; check ``status`` for ``"completed"`` when that matters."""
        if self.status in FAILED_STATUSES:
            raise RunFailedError(self.failure_line(), run_id=self.run_id, status=self.status, step=self.failed_step,
                                 error=self.error)
        return self

    def failure_line(self) -> str:
        """One line saying how the run ended and why: ``run 'r1' failed at step 'pay': ValueError: declined``."""
        where = f" at step {self.failed_step!r}" if self.failed_step else ""
        detail = f": {self.error}" if self.error else ""
        # A failed run's error names them already; a cancelled one, or one whose compensation failed
        # (its error is the compensation's), does not.
        if self.in_doubt and self.status in ("cancelled", "compensation_failed"):
            names = ", ".join(f"{d.get('step')} (key {d.get('key')})" for d in self.in_doubt)
            detail += (f"; these effects may have taken effect and were NOT undone (in doubt): {names}; look each "
                       "one up at its service (by its key, unless its reason says the key was not sent) and "
                       "undo what stands by hand")
        return f"run {self.run_id!r} ended {self.status}{where}{detail}"
