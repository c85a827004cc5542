"""Effects, compensations and circuit breakers as data, and the saga planner. Pure: no I/O.

    from compensations import Compensations, CompensationPolicy, declare_breaker

    saga = Compensations()

    @saga.compensates("book_flight")
    def cancel_flight(ctx, effect):
        ctx.http.delete(f"{API}/flights/{effect.result['id']}")

The engine (``orchestrator``) turns the journal into ``EffectRecord`` values, asks
``plan_compensations`` what to undo and in which order, and keeps breaker state in the store,
applying ``decide``/``record`` to it.
"""

from compensations._breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerConfig,
    BreakerRegistry,
    BreakerState,
    Decision,
    Recorded,
    decide,
    declare_breaker,
    default_breakers,
    record,
)
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
    "CLOSED",
    "DEFAULT_COMPENSATION_POLICY",
    "HALF_OPEN",
    "OPEN",
    "BreakerConfig",
    "BreakerConfigError",
    "BreakerRegistry",
    "BreakerState",
    "BreakerStateError",
    "CompensationDefinitionError",
    "CompensationPlan",
    "CompensationPolicy",
    "Compensations",
    "CompensationsError",
    "Decision",
    "EffectRecord",
    "PlanError",
    "PlannedCompensation",
    "Recorded",
    "decide",
    "declare_breaker",
    "default_breakers",
    "plan_compensations",
    "record",
    "resolve_check",
    "resolve_compensation",
]
