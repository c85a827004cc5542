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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from compensations import (
    DEFAULT_COMPENSATION_POLICY,
    CompensationPolicy,
    Compensations,
    EffectRecord,
    plan_compensations,
    resolve_compensation,
)
from orchestrator.engine.context import StepContext
from orchestrator.engine.fold import Reduce, RunState, register_kind

if TYPE_CHECKING:
    from orchestrator.engine.driver import Engine, Live

__all__ = ["SagaKind", "Saga", "effect_records"]


class SagaKind:
    SAGA_STARTED = "SagaStarted"
    COMPENSATION_STARTED = "CompensationStarted"
    COMPENSATION_COMPLETED = "CompensationCompleted"
    COMPENSATION_FAILED = "CompensationFailed"
    SAGA_COMPLETED = "SagaCompleted"
    SAGA_FAILED = "SagaFailed"
    SAGA_RETRIED = "SagaRetried"
    ROLLED_BACK = "RolledBack"


# -- fold ------------------------------------------------------------------------------------------
def _effect(rs: RunState, seq: int) -> dict[str, Any]:
    for effect in rs.effects:
        if effect["seq"] == seq:
            return effect
    raise ValueError(f"the journal compensates an effect at seq {seq} that it never recorded")


def _saga_started(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    rs.status = "compensating"
    rs.saga = dict(data)
    if data.get("error"):
        rs.error = dict(data["error"])


def _compensation_started(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    _effect(rs, data["effect"])["attempts"] += 1


def _compensation_completed(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    _effect(rs, data["effect"])["compensated"] = True


def _compensation_failed(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    return None


def _saga_completed(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    rs.status = data["outcome"]
    rs.saga = None


def _saga_failed(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    rs.status = "compensation_failed"
    rs.error = {"type": data["error"]["type"], "message": f"compensating {data['step']!r}: {data['error']['message']}"}


def _saga_retried(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    rs.status = "compensating"


def _rolled_back(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    restore = data["restore"]
    keep_effects, epoch = rs.effects, rs.epoch + 1
    for name in ("state", "tick", "frontier", "done", "failures", "visits", "arrivals", "state_seq",
                 "routed_errors", "in_flight"):
        setattr(rs, name, _copy(restore[name]))
    rs.effects, rs.epoch = keep_effects, epoch
    rs.status, rs.saga, rs.error = "running", None, None
    if data.get("input"):
        reduce(rs.state, data["input"])
    if data.get("next"):
        rs.frontier, rs.done, rs.failures = list(data["next"]), {}, {}
    rs.state_seq = seq


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


for _kind, _handler in {
    SagaKind.SAGA_STARTED: _saga_started,
    SagaKind.COMPENSATION_STARTED: _compensation_started,
    SagaKind.COMPENSATION_COMPLETED: _compensation_completed,
    SagaKind.COMPENSATION_FAILED: _compensation_failed,
    SagaKind.SAGA_COMPLETED: _saga_completed,
    SagaKind.SAGA_FAILED: _saga_failed,
    SagaKind.SAGA_RETRIED: _saga_retried,
    SagaKind.ROLLED_BACK: _rolled_back,
}.items():
    register_kind(_kind, _handler)


def effect_records(rs: RunState) -> list[EffectRecord]:
    return [
        EffectRecord(seq=e["seq"], step=e["step"], tick=e["tick"], branch=e["branch"], call=e["call"],
                     name=e["name"], key=e["key"], result=e["result"], compensated=e["compensated"],
                     compensation_attempts=e["attempts"], compensable=e["compensable"])
        for e in rs.effects
    ]


def has_pending_effects(rs: RunState) -> bool:
    return any(not e["compensated"] for e in rs.effects)


# -- running a saga ----------------------------------------------------------------------------------
class Saga:
    def __init__(self, engine: Engine, registry: Compensations | None) -> None:
        self.engine = engine
        self.registry = registry

    def policy(self, name: str) -> CompensationPolicy:
        return self.registry.policy_for(name) if self.registry is not None else DEFAULT_COMPENSATION_POLICY

    async def run(self, live: Live) -> None:
        """Compensate what the saga's scope holds, then end it per its reason."""
        engine = self.engine
        rs = live.rs
        saga = rs.saga or {"reason": "failure", "after_seq": 0}
        plan = plan_compensations(effect_records(rs), after_seq=saga.get("after_seq", 0))
        for item in plan.items:
            effect = item.effect
            step = live.wf.steps.get(effect.step)
            handler = resolve_compensation(step, self.registry) if step is not None else None
            if handler is None:  # the step lost its compensation since the effect was made
                continue
            if not await self._compensate_one(live, effect, handler):
                return  # SagaFailed committed: compensation_failed
        lost = [e.describe() for e in plan.uncompensable]
        # Effects whose intent is journaled but not their outcome cannot be planned: say so.
        in_doubt = [{"step": d["step"], "key": d.get("key")} for d in rs.in_flight.values() if d.get("key")]
        reason = saga.get("reason", "failure")
        if reason == "rollback":
            engine.commit(live, [(SagaKind.ROLLED_BACK, {
                "to_seq": saga["after_seq"], "restore": saga["restore"], "input": saga.get("input"),
                "next": saga.get("next"), "uncompensable": lost,
            })])
        elif reason == "cancel":
            engine.commit(live, [(SagaKind.SAGA_COMPLETED, {"outcome": "cancelled", "uncompensable": lost,
                                                            "in_doubt": in_doubt})])
        elif lost:
            names = ", ".join(f"{e['step']} (key {e['key']})" for e in lost)
            error = {"type": "orchestrator.errors.UncompensatedEffects",
                     "message": f"run failed at step {saga.get('step')!r} and these effects have no compensation "
                                f"and were NOT undone: {names}"}
            engine.commit(live, [("RunFailed", {"step": saga.get("step"), "error": error, "uncompensable": lost})])
        else:
            engine.commit(live, [(SagaKind.SAGA_COMPLETED, {"outcome": "compensated", "in_doubt": in_doubt})])

    async def _compensate_one(self, live: Live, effect: EffectRecord, handler: Any) -> bool:
        engine = self.engine
        policy = self.policy(effect.name)
        attempt = effect.compensation_attempts
        while True:
            attempt += 1
            engine.commit(live, [(SagaKind.COMPENSATION_STARTED, {
                "effect": effect.seq, "step": effect.step, "key": effect.key, "attempt": attempt})])
            undo_key, this = f"{effect.key}:compensate", attempt
            ctx = StepContext(run_id=live.run_id, workflow=live.wf.name, step=effect.step, attempt=attempt,
                              tick=effect.tick, clock=engine.cfg.clock, idempotency_key=undo_key,
                              make_tools=lambda: engine.tools.for_step(undo_key, this))
            try:
                result = handler(ctx, effect)
                if inspect.isawaitable(result):
                    result = await result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                from orchestrator.engine.journal import error_info

                retry = policy.should_retry(exc, attempt)
                delay = policy.backoff(attempt, engine.cfg.rng.random()) if retry else None
                failed = {"effect": effect.seq, "step": effect.step, "attempt": attempt, "error": error_info(exc),
                          "retry_in": round(delay, 6) if delay is not None else None, "final": not retry}
                await _close_tools(ctx, failed)
                engine.commit(live, [(SagaKind.COMPENSATION_FAILED, failed)])
                if not retry:
                    engine.commit(live, [(SagaKind.SAGA_FAILED, {
                        "effect": effect.seq, "step": effect.step, "key": effect.key, "attempts": attempt,
                        "error": error_info(exc, with_traceback=False)})])
                    return False
                await engine.cfg.sleep(delay or 0.0)
                continue
            data: dict[str, Any] = {"effect": effect.seq, "step": effect.step, "attempt": attempt}
            if result is not None:
                data["result"] = result
            trace = ctx.traces
            if trace:
                data["trace"] = trace
            await _close_tools(ctx, data)
            engine.commit(live, [(SagaKind.COMPENSATION_COMPLETED, data)])
            return True


async def _close_tools(ctx: StepContext, data: dict[str, Any]) -> None:
    """A compensation's HTTP calls are journaled with its outcome, like a step's."""
    tools = ctx.tools
    if tools is None:
        return
    if tools.calls:
        data["calls"] = list(tools.calls)
    if tools.transitions:
        data["breakers"] = list(tools.transitions)
    await tools.aclose()
