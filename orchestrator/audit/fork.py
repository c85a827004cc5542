"""Where a fork starts: the state a run had just before a step's latest execution.

A fork is a *new* run (invariant 7: history is never rewritten) whose ``RunStarted`` input is that
state and whose first frontier is the step alone. Unlike ``rollback``'s checkpoint, the step may
have failed rather than completed: forking a failed run at the step that failed, once its code is
fixed, is the main reason to fork. So the point is found by folding, not from the step's
``StepCompleted`` (a failure journals no input reference): every step of a tick sees the state as
it was when the tick began, and the state only changes when a tick ends, so the state just before
the step's last event is the state its execution saw.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, apply
from orchestrator.errors import RunStateError

__all__ = ["ForkPoint", "fork_point"]


def _of_execution(kind: str) -> bool:
    """Events journaled while a step runs (its start, calls, waits, completion or failure), as
    opposed to events that merely name a step afterwards (a run failing, a compensation)."""
    return kind != EventKind.RUN_FAILED and not kind.startswith(("Saga", "Compensation", "RolledBack"))


@dataclass(frozen=True, slots=True)
class ForkPoint:
    step: str
    seq: int  #: the parent's journal seq the state was folded at (the start of the step's tick)
    state: dict[str, Any]


def fork_point(
    run_id: str,
    events: Sequence[tuple[int, str, Mapping[str, Any]]],
    step: str,
    reduce: Callable[[dict[str, Any], Mapping[str, Any]], None],
) -> ForkPoint:
    """The state before ``step``'s latest execution in ``events`` (decoded, in seq order)."""
    last = None
    for index, (_, kind, data) in enumerate(events):
        if data.get("step") == step and _of_execution(kind):
            last = index
    if last is None:
        ran = sorted({d["step"] for _, k, d in events if isinstance(d.get("step"), str) and _of_execution(k)})
        raise RunStateError(f"run {run_id!r} never ran step {step!r}; it ran: {', '.join(ran) or 'no steps'}")
    folded = RunState()
    for seq, kind, data in events[:last]:
        apply(folded, seq, kind, data, reduce)
    return ForkPoint(step=step, seq=folded.state_seq, state=folded.state)
