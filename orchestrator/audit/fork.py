"""Where a fork starts: the state a run had just before a step's latest execution.

A fork is a *new* run (invariant 7: history is never rewritten) whose ``RunStarted`` input is that
state and whose first frontier is the step alone. Unlike ``rollback``'s checkpoint, the step may
have failed rather than completed: forking a failed run at the step that failed, once its code is
fixed, is the main reason to fork. So the point is found by folding, not from the step's
``StepCompleted`` (a failure journals no input reference): every step of a tick sees the state as
it was when the tick began, and the state only changes when a tick ends, so the state just before
the step's last event is the state its execution saw.

That state must stand in the world as it did then. A fork point whose state holds the result of an
effect the parent undid since (its saga compensated it when the run failed, or a rollback did) is
refused: the fork would continue from a booking that was cancelled, a charge that was refunded, as
if it stood, and its own saga would never undo it again. Which effects the state holds, and which
of them were undone, is read along the parent's lineage exactly as for a rollback point
(``orchestrator.engine.rollback.undone_effects``). The refusal names the parent, the step, each
undone effect (its step and seq, and where it was undone) and the nearest steps whose fork point
holds none (the steps before the first undone effect, often the run's start, fork and make their
effects anew under the fork's own idempotency keys), before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, apply
from orchestrator.engine.rollback import undone_effects
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


Event = tuple[int, str, Mapping[str, Any]]


def fork_point(
    run_id: str,
    events: Sequence[Event],
    step: str,
    reduce: Callable[[dict[str, Any], Mapping[str, Any]], None],
) -> ForkPoint:
    """The state before ``step``'s latest execution in ``events`` (decoded, in seq order); a
    ``RunStateError`` if the parent never ran the step, or if that state holds an effect the parent
    undid since (see the module docstring)."""
    last = _last_executions(events)
    if step not in last:
        ran = sorted(last)
        raise RunStateError(f"run {run_id!r} never ran step {step!r}; it ran: {', '.join(ran) or 'no steps'}")
    folded = RunState()
    for seq, kind, data in events[:last[step]]:
        apply(folded, seq, kind, data, reduce)
    undone = undone_effects(events, folded.state_seq)
    if undone:
        raise RunStateError(_refusal(run_id, events, step, folded.state_seq, undone, last, reduce))
    return ForkPoint(step=step, seq=folded.state_seq, state=folded.state)


def _last_executions(events: Sequence[Event]) -> dict[str, int]:
    """Each step the run executed -> the index in ``events`` of its latest execution's last event."""
    last: dict[str, int] = {}
    for index, (_, kind, data) in enumerate(events):
        step = data.get("step")
        if isinstance(step, str) and _of_execution(kind):
            last[step] = index
    return last


def _refusal(run_id: str, events: Sequence[Event], step: str, seq: int, undone: list[tuple[int, int]],
             last: Mapping[str, int], reduce: Callable[[dict[str, Any], Mapping[str, Any]], None]) -> str:
    """Why ``step`` cannot be forked at (its state at ``seq`` holds ``undone``), and where the run can be."""
    effects = ", ".join(f"step {events[e - 1][2].get('step')!r} (seq {e}, compensated at seq {at})" for e, at in undone)
    what = "an effect" if len(undone) == 1 else "effects"
    # Every step's fork point (the state before its latest execution), in one fold: which hold nothing undone.
    at_index: dict[int, list[str]] = {}
    for name, index in last.items():
        at_index.setdefault(index, []).append(name)
    points: dict[int, list[str]] = {}
    folded = RunState()
    for index, (at, kind, data) in enumerate(events):
        for name in at_index.get(index, ()):
            points.setdefault(folded.state_seq, []).append(name)
        apply(folded, at, kind, data, reduce)
    valid = [p for p in sorted(points) if not undone_effects(events, p)]
    before = [p for p in valid if p < seq][-1:]
    after = [p for p in valid if p > seq][:1]

    def named(point: int) -> str:
        steps = " or ".join(f"step {name!r}" for name in sorted(points[point]))
        start = ", the run's start" if events[point - 1][1] == EventKind.RUN_STARTED else ""
        return f"{steps} (its state at seq {point}{start})"

    nearest = [named(p) for p in (*before, *after)]
    if nearest:
        instead = f"fork it at {' or at '.join(nearest)} instead, where every effect the state holds still stands"
    else:
        instead = "no step's fork point in this run is free of them: start a new run instead"
    it, they = ("it", "it") if len(undone) == 1 else ("them", "they")
    return (f"run {run_id!r} cannot be forked at step {step!r}: its latest execution began from the state at "
            f"seq {seq}, which holds the result of {what} run {run_id!r} undid since: {effects}; the fork would "
            f"continue from {it} as if {they} still stood. {instead[0].upper()}{instead[1:]}. Nothing was written")
