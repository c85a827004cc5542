"""Declaring compensations and check hooks: on the step, or in a registry keyed by tool name.

Two ways read naturally in a workflow file, and both are supported:

    # on the step, when the step *is* the effect
    @trip.step(effect=True, compensate=cancel_flight)
    def book_flight(ctx, state): ...

    # in a registry, when one tool is called from several steps (or several times in one step)
    saga = Compensations()

    @saga.compensates("charge_card")
    def refund(ctx, effect): ...

    @saga.check("charge_card")
    def was_charged(ctx, effect): ...

A step may also name a registry entry: ``@trip.step(effect=True, compensate="refund_card")``.
``resolve_compensation`` is the single rule the engine uses to pick one.

A compensation and a check hook are called as ``fn(ctx, effect)`` (sync or async), where
``effect`` is the ``EffectRecord`` being undone or checked. Their meaning for the engine (what a
check hook returns, how a compensation's failure is retried) is documented with the engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compensations._policy import DEFAULT_COMPENSATION_POLICY, CompensationPolicy
from compensations.errors import CompensationDefinitionError
from workflows import Step

__all__ = ["Compensations", "resolve_compensation", "resolve_check"]

Handler = Callable[..., Any]


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise CompensationDefinitionError(f"{what} needs a non-empty tool or effect name, got {name!r}")
    return name


def _check_handler(fn: object, what: str) -> Handler:
    if not callable(fn):
        raise CompensationDefinitionError(f"{what} must be callable as fn(ctx, effect), got {fn!r}")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise CompensationDefinitionError(
            f"{what}: {getattr(fn, '__qualname__', fn)!r} must accept two arguments (ctx, effect)"
        ) from None
    except ValueError:
        pass  # no introspectable signature (some builtins): trust the caller
    return fn  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _Entry:
    fn: Handler
    policy: CompensationPolicy


class Compensations:
    """A registry of compensations and check hooks, keyed by tool or effect name."""

    def __init__(self, *, policy: CompensationPolicy = DEFAULT_COMPENSATION_POLICY) -> None:
        if not isinstance(policy, CompensationPolicy):
            raise CompensationDefinitionError(f"Compensations(policy=...) must be a CompensationPolicy, got {policy!r}")
        self.policy = policy
        self._compensations: dict[str, _Entry] = {}
        self._checks: dict[str, Handler] = {}

    def compensates(self, name: str, fn: Handler | None = None, /, *,
                    policy: CompensationPolicy | None = None) -> Any:
        """Register ``fn(ctx, effect)`` as what undoes the effect ``name``; usable as a decorator."""
        _check_name(name, "compensates()")
        if policy is not None and not isinstance(policy, CompensationPolicy):
            raise CompensationDefinitionError(
                f"compensation for {name!r}: policy must be a CompensationPolicy, got {policy!r}"
            )

        def register(func: Handler) -> Handler:
            _check_handler(func, f"compensation for {name!r}")
            if name in self._compensations:
                existing = self._compensations[name].fn
                raise CompensationDefinitionError(
                    f"a compensation for {name!r} is already registered "
                    f"({getattr(existing, '__qualname__', existing)!r}); one effect has one compensation"
                )
            self._compensations[name] = _Entry(func, policy or self.policy)
            return func

        return register(fn) if fn is not None else register

    def check(self, name: str, fn: Handler | None = None, /) -> Any:
        """Register ``fn(ctx, effect)`` as the check hook for the effect ``name``; usable as a decorator."""
        _check_name(name, "check()")

        def register(func: Handler) -> Handler:
            _check_handler(func, f"check hook for {name!r}")
            if name in self._checks:
                raise CompensationDefinitionError(f"a check hook for {name!r} is already registered")
            self._checks[name] = func
            return func

        return register(fn) if fn is not None else register

    def get(self, name: str) -> Handler | None:
        """The compensation registered for ``name``, or None."""
        entry = self._compensations.get(name)
        return entry.fn if entry else None

    def get_check(self, name: str) -> Handler | None:
        """The check hook registered for ``name``, or None."""
        return self._checks.get(name)

    def policy_for(self, name: str) -> CompensationPolicy:
        """The policy for the compensation of ``name`` (its own, else the registry's)."""
        entry = self._compensations.get(name)
        return entry.policy if entry else self.policy

    def names(self) -> tuple[str, ...]:
        """Names with a registered compensation, sorted."""
        return tuple(sorted(self._compensations))

    def __contains__(self, name: object) -> bool:
        return name in self._compensations

    def __repr__(self) -> str:
        return f"Compensations({', '.join(self.names()) or 'empty'})"


def resolve_compensation(step: Step, registry: Compensations | None) -> Handler | None:
    """The compensation for a whole-step effect: the step's own ``compensate`` (a callable, or a
    string naming a registry entry), else the registry's entry for the step's name, else None."""
    own = step.compensate
    if callable(own):
        return own
    if isinstance(own, str):
        found = registry.get(own) if registry is not None else None
        if found is None:
            known = ", ".join(registry.names()) if registry is not None and registry.names() else "none"
            raise CompensationDefinitionError(
                f"step {step.name!r}: compensate={own!r} names no registered compensation (registered: {known})",
                step=step.name,
            )
        return found
    if own is not None:
        raise CompensationDefinitionError(
            f"step {step.name!r}: compensate must be a callable or a registry name, got {own!r}", step=step.name
        )
    return registry.get(step.name) if registry is not None else None


def resolve_check(step: Step, registry: Compensations | None) -> Handler | None:
    """The check hook for a whole-step effect: the step's own ``check``, else the registry's."""
    if step.check is not None:
        return step.check
    return registry.get_check(step.name) if registry is not None else None
