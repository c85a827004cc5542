"""Effects, compensations and circuit breakers as data, and the saga planner. Pure: no I/O.

    from compensations import Compensations, CompensationPolicy, declare_breaker

    saga = Compensations()

    @saga.compensates("book_flight")
    def cancel_flight(ctx, effect):
        ctx.http.delete(f"{API}/flights/{effect.result['id']}")

The engine (``orchestrator``) turns the journal into ``EffectRecord`` values, asks
``plan_compensations`` what to undo and in which order, and keeps breaker state in the store,
moving it with the pure machine of ``compensations.breaker_machine``.
"""

from compensations._breaker_settings import BreakerConfig, BreakerRegistry, declare_breaker, default_breakers
from compensations._plan import CompensationPlan, EffectRecord, PlannedCompensation, plan_compensations
from compensations._policy import DEFAULT_COMPENSATION_POLICY, CompensationPolicy
from compensations._registry import Compensations, resolve_check, resolve_compensation
from compensations.errors import (
    BreakerConfigError,
    BreakerStateError,
    CompensationDefinitionError,
    CompensationsError,
    PlanError,
)

__all__ = [
    "DEFAULT_COMPENSATION_POLICY",
    "BreakerConfig",
    "BreakerConfigError",
    "BreakerRegistry",
    "BreakerStateError",
    "CompensationDefinitionError",
    "CompensationPlan",
    "CompensationPolicy",
    "Compensations",
    "CompensationsError",
    "EffectRecord",
    "PlanError",
    "PlannedCompensation",
    "declare_breaker",
    "default_breakers",
    "plan_compensations",
    "resolve_check",
    "resolve_compensation",
]
