"""Sagas: undoing completed effects, journaled, at most once each (invariant 5).

A saga starts with ``SagaStarted`` (reason ``failure``, ``cancel`` or ``rollback``; the run's status
becomes ``compensating``) and plans the completed, not yet compensated effects newest first with
``compensations.plan_compensations``. Each compensation commits ``CompensationStarted`` before it
runs and ``CompensationCompleted`` after, so a crash mid-saga resumes it without compensating
anything twice: a completed compensation is never run again, and one that was started but not
confirmed is run again with the same idempotency key (compensations must therefore be idempotent,
as the effects they undo). A compensation that keeps failing past its policy ends the saga with
``SagaFailed`` (status ``compensation_failed``; ``orc.compensate`` / ``agentsaga compensate``
retries the remaining ones). Effects with no compensation are never skipped silently: the run ends
``failed`` with the list of what could not be undone.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable
from typing import Any

from compensations import (
    DEFAULT_COMPENSATION_POLICY,
    CompensationPolicy,
    Compensations,
    EffectRecord,
    plan_compensations,
    resolve_compensation,
)
from orchestrator.engine.context import StepContext
from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState
from orchestrator.engine.journal import ActiveRun, JournalWriter
from orchestrator.engine.retries import not_before
from orchestrator.engine.services import ToolsForSteps
from orchestrator.errors import EncodingError, PermanentToolError
from orchestrator.payload import codec
from orchestrator.payload.exceptions import error_record

__all__ = ["SagaRunner", "effect_records", "has_pending_effects", "in_doubt_error", "in_flight_doubts", "run_in_doubt"]


def effect_records(folded: RunState) -> list[EffectRecord]:
    return [
        EffectRecord(seq=e["seq"], step=e["step"], tick=e["tick"], branch=e["branch"], call=e["call"],
                     name=e["name"], key=e["key"], result=e["result"], compensated=e["compensated"],
                     compensation_attempts=e["attempts"], compensable=e["compensable"],
                     calls=tuple(e.get("calls") or ()))
        for e in folded.effects
    ]


def has_pending_effects(folded: RunState) -> bool:
    return any(not e["compensated"] for e in folded.effects)


def in_flight_doubts(folded: RunState) -> list[dict[str, Any]]:
    """The effects whose intent (``StepStarted`` with its key) is journaled but not their outcome:
    ``{"step", "key", "reason"}`` each. While the run goes on, a resume settles them; a run that ends
    with one (a cancel that met it in flight) can say only that it may have taken effect."""
    out = []
    for step, intent in folded.in_flight.items():
        key = intent.get("key")
        if not key:
            continue  # a plain step's start: it promised nothing to the outside world
        answered = sorted(position for position, call in folded.calls.get(step, {}).items() if "error" not in call)
        if answered:
            # The service's answer is journaled, the step's result is not: the effect may well stand,
            # and what it made is in that answer, not in a result a compensation could be given.
            calls = ", ".join(answered)
            why = (f"it was in flight when the run ended: its request was answered (the answer is journaled: "
                   f"CallCompleted, call {calls} of the step), but the step did not complete, so no result was "
                   "journaled for a compensation to undo it with")
        elif intent.get("key_issued"):
            why = ("it was in flight when the run ended: its idempotency key had left the process with its "
                   "request, and no outcome was journaled")
        else:
            why = ("it was in flight when the run ended: its function had started and no outcome was "
                   "journaled (its key had not left the process; a call made another way may have acted)")
        out.append({"step": step, "key": key, "reason": why})
    return out


def run_in_doubt(folded: RunState) -> list[dict[str, Any]]:
    """Every effect of an ended run that may stand without a result to undo it with: those whose
    step failed for good after its key left (``doubts``), then those still in flight."""
    doubts = [{"step": d["step"], "key": d.get("key"), "reason": d.get("reason")} for d in folded.doubts]
    return doubts + in_flight_doubts(folded)


def _listed(folded: RunState) -> dict[str, Any]:
    """What a saga that stops failing adds to its ``SagaFailed``: the effects that may stand without
    a result to undo them with (``in_doubt``), so the run's end names them as a saga that completes
    does, whether or not a later ``compensate`` ever succeeds."""
    doubts = run_in_doubt(folded)
    return {"in_doubt": doubts} if doubts else {}


def _doubt_words(doubts: list[dict[str, Any]]) -> str:
    names = ", ".join(f"{d.get('step')} (key {d.get('key')})" for d in doubts)
    return (f"these effects may have taken effect and were NOT undone (in doubt): {names}; look each one up at "
            "its service (by its key, unless its reason says the key was not sent) and undo what stands by hand (docs/sagas.md, \"In doubt after a failure\")")


def in_doubt_error(step: Any, error: dict[str, Any], doubts: list[dict[str, Any]], *,
                   compensated: bool = False) -> dict[str, Any]:
    """The run's error when it failed with effects in doubt: an ``InDoubtError`` naming the step's own
    error, and each effect and key that may stand."""
    cause = f"{error.get('type')}: {error.get('message')}" if error else "a failure"
    others = "; its other effects were compensated" if compensated else ""
    return {"type": "orchestrator.errors.InDoubtError",
            "message": f"run failed at step {step!r} ({cause}){others}; {_doubt_words(doubts)}"}


# -- running a saga ----------------------------------------------------------------------------------
class SagaRunner:
    """Runs a run's saga: its compensations, each journaled before and after, then the saga's end."""

    def __init__(self, journal: JournalWriter, compensations: Compensations | None, *, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[None]], rng: random.Random,
                 tools: ToolsForSteps | None = None, replaying: bool = False) -> None:
        self.journal = journal
        self.compensations = compensations
        self.clock = clock
        self.sleep = sleep
        self.rng = rng
        self.tools = tools
        #: driving under a cassette (``Orchestrator(replay=...)``): the recorded world is not touched,
        #: so a compensation is journaled as replayed instead of run
        self.replaying = replaying

    def policy(self, name: str) -> CompensationPolicy:
        return self.compensations.policy_for(name) if self.compensations is not None else DEFAULT_COMPENSATION_POLICY

    async def run(self, run: ActiveRun) -> None:
        """Compensate what the saga's scope holds, then end it per its reason."""
        commit = self.journal.commit
        folded = run.folded
        saga = folded.saga or {"reason": "failure", "after_seq": 0}
        plan = plan_compensations(effect_records(folded), after_seq=saga.get("after_seq", 0))
        for item in plan.items:
            effect = item.effect
            handler, missing = self._handler(run, effect)
            if handler is None:
                # The effect was recorded with a compensation that the code no longer has (renamed or
                # removed): never claim it was undone. The saga fails, naming it; once the code has
                # the compensation again, ``orc.compensate`` retries the rest.
                commit(run, [(EventKind.SAGA_FAILED, {
                    "effect": effect.seq, "step": effect.step, "key": effect.key, "attempts": 0,
                    "error": {"type": "orchestrator.errors.CompensationNotFound", "message": missing},
                    **_listed(folded)})])
                return
            if not await self._compensate_one(run, effect, handler):
                return  # SagaFailed committed: compensation_failed
        lost = [e.describe() for e in plan.uncompensable]
        # Effects that may stand but have no result to undo them with cannot be planned: say so. Those
        # whose step failed for good after its key left (``doubts``), and those whose intent is
        # journaled but not their outcome (a run cancelled with an effect in flight).
        in_doubt = run_in_doubt(folded)
        reason = saga.get("reason", "failure")
        if reason == "rollback":
            commit(run, [(EventKind.ROLLED_BACK, {
                "to_seq": saga["after_seq"], "restore": saga["restore"], "input": saga.get("input"),
                "next": saga.get("next"), "uncompensable": lost,
            })])
        elif reason == "cancel":
            commit(run, [(EventKind.SAGA_COMPLETED, {"outcome": "cancelled", "uncompensable": lost, "in_doubt": in_doubt})])
        elif lost:
            # A tool call's effect by its tool's name, in the step that called it; a step's by the step.
            names = ", ".join(f"{e['name']} (key {e['key']})" if e.get("call", -1) == -1 or e.get("name") == e["step"]
                              else f"{e['name']} in step {e['step']} (key {e['key']})" for e in lost)
            message = (f"run failed at step {saga.get('step')!r} and these effects have no compensation "
                       f"and were NOT undone: {names}")
            if in_doubt:
                message += "; " + _doubt_words(in_doubt)
            error = {"type": "orchestrator.errors.UncompensatedEffects", "message": message}
            data: dict[str, Any] = {"step": saga.get("step"), "error": error, "uncompensable": lost}
            if in_doubt:
                data["in_doubt"] = in_doubt
            commit(run, [(EventKind.RUN_FAILED, data)])
        elif in_doubt:
            # Everything that could be undone was; what may stand without a result to undo it with
            # keeps the run from claiming it was compensated.
            error = in_doubt_error(saga.get("step"), saga.get("error") or {}, in_doubt, compensated=True)
            commit(run, [(EventKind.RUN_FAILED, {"step": saga.get("step"), "error": error, "in_doubt": in_doubt})])
        else:
            commit(run, [(EventKind.SAGA_COMPLETED, {"outcome": "compensated", "in_doubt": in_doubt})])

    def _handler(self, run: ActiveRun, effect: EffectRecord) -> tuple[Any, str]:
        """The compensation of a compensable effect, or (None, why it cannot be found)."""
        step = run.workflow.steps.get(effect.step)
        if step is None:
            return None, (f"effect of step {effect.step!r} (key {effect.key!r}) has a compensation, but workflow "
                          f"{run.workflow.name!r} no longer has that step; it was NOT undone")
        try:
            handler = resolve_compensation(step, self.compensations)
        except Exception as exc:  # a registry name that no longer resolves
            return None, f"effect of step {effect.step!r} (key {effect.key!r}) was NOT undone: {exc}"
        if handler is None:
            return None, (f"effect of step {effect.step!r} (key {effect.key!r}) was recorded with a compensation, "
                          "but none is found for it now; it was NOT undone. Either it was renamed or removed from "
                          "the code, or it is registered in a Compensations registry this process was not given: "
                          "pass the registry to the Orchestrator (compensations=...), or define it at the top "
                          "level of the app module the command line imports (--app)")
        return handler, ""

    async def _compensate_one(self, run: ActiveRun, effect: EffectRecord, handler: Any) -> bool:
        commit = self.journal.commit
        policy = self.policy(effect.name)
        # The policy's attempts count from this drive of the saga: `compensate` after an outage (the
        # run compensation_failed, the earlier attempts spent) tries again with the whole policy, and
        # so waits out a breaker the outage left open, instead of failing at its first refusal.
        # Attempt numbers in the journal go on from the earlier ones.
        attempt = before = effect.compensation_attempts
        while True:
            attempt += 1
            commit(run, [(EventKind.COMPENSATION_STARTED, {
                "effect": effect.seq, "step": effect.step, "key": effect.key, "attempt": attempt})])
            if self.replaying:
                # A replay answers model and tool calls from the recording and touches nothing: undoing
                # an effect the recording made would undo it in the world a second time, under keys
                # of this run that the other side has never seen.
                commit(run, [(EventKind.COMPENSATION_COMPLETED, {
                    "effect": effect.seq, "step": effect.step, "attempt": attempt, "replayed": True})])
                return True
            ctx = StepContext(run_id=run.run_id, workflow=run.workflow.name, step=effect.step, attempt=attempt,
                              tick=effect.tick, clock=self.clock, idempotency_key=f"{effect.key}:compensate",
                              tools=self.tools)
            try:
                result = handler(ctx, effect)
                if inspect.isawaitable(result):
                    result = await result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The service answered "no" (a 4xx: the booking is not found, the request is refused):
                # asking again cannot change that, only keep the operator from seeing it, as for a step.
                tries = attempt - before
                retry = not isinstance(exc, PermanentToolError) and policy.should_retry(exc, tries)
                delay = not_before(policy.backoff(tries, self.rng.random()), exc, self.clock) if retry else None
                failed = {"effect": effect.seq, "step": effect.step, "attempt": attempt, "error": error_record(exc),
                          "retry_in": round(delay, 6) if delay is not None else None, "final": not retry}
                await _close_tools(ctx, failed)
                commit(run, [(EventKind.COMPENSATION_FAILED, failed)])
                if not retry:
                    commit(run, [(EventKind.SAGA_FAILED, {
                        "effect": effect.seq, "step": effect.step, "key": effect.key, "attempts": attempt,
                        "error": error_record(exc, with_traceback=False), **_listed(run.folded)})])
                    return False
                await self.sleep(delay or 0.0)
                continue
            data: dict[str, Any] = {"effect": effect.seq, "step": effect.step, "attempt": attempt}
            if result is not None:
                data["result"] = result
            trace = ctx.traces
            if trace:
                data["trace"] = trace
            await _close_tools(ctx, data)
            try:
                commit(run, [(EventKind.COMPENSATION_COMPLETED, data)])
            except EncodingError:
                # The undo happened: it must be journaled as done, or every resume would undo it
                # again (invariant 5) and the run would stay compensating. What cannot be journaled
                # of what it returned or traced is replaced by why.
                commit(run, [(EventKind.COMPENSATION_COMPLETED, _journalable(data, effect.step))])
            return True


def _journalable(data: dict[str, Any], step: str) -> dict[str, Any]:
    """``data`` with each of its ``result`` and ``trace`` that cannot be journaled replaced by a
    ``<name>_unjournaled`` note giving the EncodingError."""
    out = dict(data)
    for part in ("result", "trace"):
        if part in out:
            try:
                codec.dumps(out[part], what=f"the {part} of the compensation of step {step!r}")
            except EncodingError as exc:
                del out[part]
                out[f"{part}_unjournaled"] = str(exc)
    return out


async def _close_tools(ctx: StepContext, data: dict[str, Any]) -> None:
    """A compensation's HTTP calls are journaled with its outcome, like a step's."""
    tools = ctx.used_tools
    if tools is None:
        return
    if tools.calls:
        data["calls"] = list(tools.calls)
    if tools.transitions:
        data["breakers"] = list(tools.transitions)
    await tools.aclose()
