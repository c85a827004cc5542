"""Where a rollback returns to: a journal seq between ticks, found from a seq or a step name.

``Engine.rollback`` compensates the effects recorded after that point (newest first) and appends
``RolledBack``: history is not rewritten (invariant 7).

A **rollback point** is a seq at which

- the run stood *between ticks*: the run's start, or any seq after the completion that ended a
  tick (the one that formed the next tick's state) and before the next tick's first event. Only
  there is the folded scheduler whole: its state is a tick's input, and no step of the current tick
  has left anything behind. Anywhere else (after a step's ``StepStarted`` intent, a failed attempt,
  a durable call, a wait, a sibling's completion, or inside a saga) the checkpoint would carry half
  a tick: an intent whose effect the rollback does not undo (a resume then finds it in doubt),
  calls and signals of an execution history no longer has, a completion merged into a re-run of
  its siblings;
- and every effect whose result the state there holds is still in force. The rollback leaves the
  effects before its point alone and continues from their results; an effect a saga (or an earlier
  rollback) has undone since would come back as if it stood. Which effects the state holds is read
  along the run's lineage: an earlier rollback's ``RolledBack`` cut out the events between its
  point and itself.

Any other seq is refused before anything is written, naming the run, the seq, its event and the
nearest rollback points before and after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, apply
from orchestrator.errors import RunStateError

__all__ = ["checkpoint_seq", "checkpoint_state", "between_ticks", "undone_effects"]

Event = tuple[int, str, Any]
Reduce = Callable[[dict[str, Any], Mapping[str, Any]], None]


def checkpoint_seq(run_id: str, events: list[tuple[int, str, Any]], to: int | str) -> int:
    """The journal seq a rollback returns to: a seq, or the tick start of a step's last execution."""
    last = events[-1][0] if events else 0
    if isinstance(to, bool) or not isinstance(to, (int, str)):
        raise RunStateError(f"rollback target must be a seq or a step name, got {to!r}")
    if isinstance(to, int):
        if not 1 <= to <= last:
            raise RunStateError(f"run {run_id!r} has no checkpoint at seq {to}: its journal holds seq 1..{last}")
        return to
    completions = [d for _, kind, d in events if kind == EventKind.STEP_COMPLETED and d["step"] == to]
    if not completions:
        raise RunStateError(f"run {run_id!r} has no completed step {to!r} to roll back to")
    state_at = completions[-1].get("input", {}).get("state_at")
    if state_at is None:  # the step declared reads=: find its tick's start by folding
        tick = completions[-1]["tick"]
        folded = RunState()
        for seq, kind, data in events:
            if folded.tick == tick and not folded.done and folded.seq:
                return folded.seq
            apply(folded, seq, kind, data)
        raise RunStateError(f"cannot locate the start of step {to!r}'s tick in run {run_id!r}")
    return int(state_at)


def between_ticks(folded: RunState) -> bool:
    """Whether the run stood between ticks once ``folded`` was folded: started, no saga under way,
    and nothing of the current tick journaled yet (no completion, failed attempt, intent, durable
    call, wait, received signal, timer or backoff)."""
    return bool(folded.seq) and folded.saga is None and not (
        folded.done or folded.failures or folded.in_flight or folded.calls or folded.waits or folded.received
        or folded.timers or folded.retry_at)


class _Lineage:
    """The effects whose results the state holds, as the journal is read forward, and which of them
    the whole journal says were undone since (``CompensationCompleted``)."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.undone_at = {d.get("effect"): seq for seq, kind, d in events if kind == EventKind.COMPENSATION_COMPLETED}
        self.effects: list[int] = []  #: every effect's seq, in journal order
        self.rollbacks: list[tuple[int, int]] = []  #: (RolledBack seq, the seq it returned to)
        self.live: list[int] = []

    def see(self, seq: int, kind: str, data: Mapping[str, Any]) -> None:
        if kind in (EventKind.STEP_COMPLETED, EventKind.CALL_COMPLETED) and data.get("effect"):
            self.effects.append(seq)
            self.live.append(seq)
        elif kind == EventKind.ROLLED_BACK:
            self.rollbacks.append((seq, int(data["to_seq"])))
            self.live = self._at(int(data["to_seq"]))

    def _at(self, pos: int) -> list[int]:
        """The effects the state held at ``pos``: each ``RolledBack`` at or before it starts a branch
        that continues from the point it returned to."""
        held: list[int] = []
        for rolled, to in reversed(self.rollbacks):
            if rolled <= pos:
                held += [e for e in self.effects if rolled < e <= pos]
                pos = to
        return held + [e for e in self.effects if e <= pos]

    def undone(self) -> list[int]:
        """The effects the state holds now that were compensated since."""
        return [e for e in self.live if e in self.undone_at]


def undone_effects(events: Sequence[Event], seq: int) -> list[tuple[int, int]]:
    """The effects whose results the run's state held at ``seq`` (read along its lineage, as for a
    rollback point) that the journal says were undone since: ``(effect seq, CompensationCompleted
    seq)`` pairs, oldest first. Empty when every effect that state holds is still in force. A fork
    (``orchestrator.audit.fork``) asks this of the state it would start from."""
    lineage = _Lineage(events)
    for at, kind, data in events:
        if at > seq:
            break
        lineage.see(at, kind, data)
    return [(e, lineage.undone_at[e]) for e in lineage.undone()]


def checkpoint_state(run_id: str, events: Sequence[Event], seq: int, reduce: Reduce) -> RunState:
    """The run as it was at ``seq`` (``events`` decoded, in seq order), which must be a rollback
    point (see the module docstring); otherwise a ``RunStateError`` naming the run, the seq, its
    event and the nearest rollback points before and after it."""
    folded = RunState()
    lineage = _Lineage(events)
    previous: int | None = None
    for index, (at, kind, data) in enumerate(events):
        apply(folded, at, kind, data, reduce)
        lineage.see(at, kind, data)
        point = between_ticks(folded) and not lineage.undone()
        if at < seq:
            previous = at if point else previous
            continue
        if point:
            return folded
        # Not a rollback point: say why, and where the nearest ones are (the next, by folding on).
        why = _why_not(folded, lineage, events)
        following: int | None = None
        for later, later_kind, later_data in events[index + 1:]:
            apply(folded, later, later_kind, later_data, reduce)
            lineage.see(later, later_kind, later_data)
            if between_ticks(folded) and not lineage.undone():
                following = later
                break
        points = [f"seq {p} ({_describe(events, p)})" for p in (previous, following) if p is not None]
        nearest = (f"the nearest are {' and '.join(points)}" if len(points) == 2
                   else f"the nearest is {points[0]}" if points else "this run has none")
        raise RunStateError(
            f"run {run_id!r} cannot roll back to seq {seq} ({_describe(events, seq)}): {why}. A rollback point "
            f"lies between ticks, with every effect its state holds still in force; {nearest} (a step name "
            "returns to the start of its tick). Nothing was changed")
    raise RunStateError(f"run {run_id!r} has no checkpoint at seq {seq}")


def _why_not(folded: RunState, lineage: _Lineage, events: Sequence[Event]) -> str:
    """Why the seq ``folded`` was folded to is not a rollback point, in words."""
    if folded.saga is not None:
        return f"it lies inside a saga (reason {folded.saga.get('reason')!r}) that undoes completed effects"
    begun = sorted({*folded.done, *folded.failures, *folded.in_flight, *folded.calls, *folded.retry_at,
                    *(key.split(":", 1)[0] for key in (*folded.waits, *folded.received, *folded.timers))})
    if begun:
        names = ", ".join(repr(step) for step in begun)
        steps = f"step {names}" if len(begun) == 1 else f"steps {names}"
        return (f"it lies inside tick {folded.tick}, after {steps} began and before the tick's completions were "
                "all journaled")
    undone = ", ".join(f"the effect of step {events[e - 1][2].get('step')!r} (seq {e}), undone at seq "
                       f"{lineage.undone_at[e]}" for e in lineage.undone())
    return f"its state holds what was compensated since: {undone}"


def _describe(events: Sequence[Event], seq: int) -> str:
    """An event as a rollback message names it: its kind, and its step when it has one."""
    _, kind, data = events[seq - 1]  # seqs run 1..n without gaps (``apply`` checks)
    step = data.get("step") if isinstance(data, Mapping) else None
    if kind == EventKind.RUN_STARTED:
        return "RunStarted, the run's start"
    return f"{kind} of step {step!r}" if isinstance(step, str) else kind
