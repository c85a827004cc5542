"""The saga planner: which completed effects to undo, and in which order. Pure and deterministic.

Input: the run's completed effects as ``EffectRecord`` values (the engine builds them from the
journal). Output: a ``CompensationPlan``, newest effect first.

Rules, in the order they apply:

1. **Scope.** Only effects whose completion was journaled after ``after_seq`` are considered
   (``after_seq=0``: the whole run, for a saga on failure; a checkpoint's seq: a rollback, which
   leaves the effects before the checkpoint untouched).
2. **At most once (invariant 5).** Effects already marked ``compensated`` are skipped. An effect
   whose compensation was started but not confirmed (a crash mid-compensation) is planned again,
   carrying its ``compensation_attempts``, so the engine can keep counting; compensations are
   therefore expected to be idempotent (the engine hands them the effect's idempotency key).
3. **Order.** Newest first by the *graph's* clock, not the wall clock or the journal's seq:
   ``tick`` descending, then ``branch`` (the step's index in its tick's frontier) descending, then
   ``call`` (the call's position inside the step) descending. Parallel branches of one tick finish
   in whatever order the scheduler let them, so their completion seqs differ from run to run;
   ordering by frontier index makes the plan the same on every replay and every machine. A call
   made inside another call has a dotted position (``"1.0"`` inside call ``1``) and completed
   before the call around it: it is undone after that call and before the calls that came before
   it (``2``, ``1``, ``1.1``, ``1.0``, ``0``). A whole-step effect has ``call == -1`` and is undone
   after the calls made inside that step. The completion ``seq`` breaks any remaining tie, newest
   first, so the order is total.
4. **Nothing silently skipped.** An effect without a compensation goes to ``uncompensable``, in the
   same newest-first order; the engine fails the run and lists them.

Two pending effects with the same idempotency key would be the same effect planned twice; that is
a ``PlanError`` rather than a guess at which one to keep.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from compensations.errors import PlanError

__all__ = ["EffectRecord", "PlannedCompensation", "CompensationPlan", "plan_compensations"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectRecord:
    """One completed effect as the journal knows it."""

    seq: int  #: journal seq of the effect's completion
    step: str  #: the step that made it
    tick: int  #: the tick the step ran in
    branch: int  #: the step's index in its tick's frontier
    #: the call's position inside the step (its index; ``"1.0"`` for a call made inside call 1), or -1
    #: for a whole-step effect
    call: int | str
    name: str  #: tool or effect name (the step name for a whole-step effect)
    key: str  #: idempotency key
    result: Any = None  #: the effect's journaled result (JSON value)
    args: Any = None  #: the effect's journaled arguments (JSON value), if any
    compensated: bool = False
    compensation_attempts: int = 0
    compensable: bool = True  #: a compensation is registered for it
    #: for a whole-step effect, the effects its calls made (tools), undone with it by its compensation
    calls: tuple[Any, ...] = ()

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for journal events and error messages (no result or args)."""
        return {
            "seq": self.seq, "step": self.step, "tick": self.tick, "branch": self.branch,
            "call": self.call, "name": self.name, "key": self.key,
        }

    def label(self) -> str:
        where = f"{self.step}" if self.call == -1 else f"{self.step} call {self.call}"
        return f"{self.name!r} ({where}, tick {self.tick}, key {self.key!r})"


@dataclass(frozen=True, slots=True)
class PlannedCompensation:
    """One compensation to run: the effect and the name of the handler that undoes it."""

    effect: EffectRecord
    handler_name: str | None = None


@dataclass(frozen=True, slots=True)
class CompensationPlan:
    """Compensations to run in ``items`` order, and the effects nothing can undo."""

    items: tuple[PlannedCompensation, ...]
    uncompensable: tuple[EffectRecord, ...]

    @property
    def empty(self) -> bool:
        return not self.items and not self.uncompensable

    def describe(self) -> dict[str, Any]:
        """JSON-able, for a ``CompensationStarted``-style journal event or an operator's view."""
        return {
            "compensate": [dict(p.effect.describe(), handler=p.handler_name) for p in self.items],
            "uncompensable": [e.describe() for e in self.uncompensable],
        }


def _newest_first(effect: EffectRecord) -> tuple[int, int, tuple[int, ...], int]:
    # Negated so one ascending sort gives every component descending.
    return (-effect.tick, -effect.branch, _call_order(effect.call), -effect.seq)


def _call_order(call: int | str) -> tuple[int, ...]:
    """Newest call first, ascending: a whole-step effect (-1) last; a call before the calls made
    inside it (they completed before it), those newest first too."""
    if call == -1:
        return (1,)
    # The sentinel stands for the call's own completion, after every call inside it.
    return tuple(-int(part) for part in str(call).split(".")) + (-sys.maxsize,)


def plan_compensations(
    effects: Iterable[EffectRecord],
    *,
    after_seq: int = 0,
    handler_name: Callable[[EffectRecord], str | None] | None = None,
) -> CompensationPlan:
    """Order the completed, not yet compensated effects after ``after_seq``, newest first.

    ``handler_name`` (optional) names each effect's compensation for the journal, e.g.
    ``lambda e: registry_entry_name(e.name)``; without it the planned items carry ``None``.
    """
    if not isinstance(after_seq, int) or isinstance(after_seq, bool) or after_seq < 0:
        raise PlanError(f"after_seq must be an integer >= 0, got {after_seq!r}")
    pending: list[EffectRecord] = []
    seen: dict[str, EffectRecord] = {}
    for effect in effects:
        if not isinstance(effect, EffectRecord):
            raise PlanError(f"plan_compensations takes EffectRecord values, got {effect!r}")
        if effect.seq <= after_seq or effect.compensated:
            continue
        other = seen.get(effect.key)
        if other is not None:
            raise PlanError(
                f"effects {other.label()} (seq {other.seq}) and {effect.label()} (seq {effect.seq}) "
                f"share idempotency key {effect.key!r}; compensating both would undo one effect twice"
            )
        seen[effect.key] = effect
        pending.append(effect)
    pending.sort(key=_newest_first)
    items = tuple(
        PlannedCompensation(e, handler_name(e) if handler_name else None) for e in pending if e.compensable
    )
    return CompensationPlan(items=items, uncompensable=tuple(e for e in pending if not e.compensable))
