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
``Compensations.combine(a, b)`` makes one registry of several (an app whose modules each hold one).
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


def _describe(fn: Handler) -> str:
    """A handler for a message: its name and, when Python knows it, where it is defined."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(name)
    return f"{name!r} ({code.co_filename}:{code.co_firstlineno})"


def _same_definition(a: Handler, b: Handler) -> bool:
    """Whether two handlers are one function: the same object, or the same top-level ``def`` (its
    name, file and line; no closure, which could hold different values) executed twice, as when one
    file is imported under two module names."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_b is None or getattr(a, "__closure__", None) or getattr(b, "__closure__", None):
        return False
    try:
        same_defaults = (a.__defaults__ == b.__defaults__  # type: ignore[attr-defined]
                         and a.__kwdefaults__ == b.__kwdefaults__)  # type: ignore[attr-defined]
    except Exception:  # a default whose == raises: not provably the same
        return False
    return (same_defaults and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
            and (code_a.co_filename, code_a.co_firstlineno) == (code_b.co_filename, code_b.co_firstlineno))


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

    @classmethod
    def combine(cls, *registries: Compensations, policy: CompensationPolicy | None = None) -> Compensations:
        """A new registry holding the entries of ``registries`` (say, one per module of an app).

        Each compensation keeps the policy it was registered with. A name registered in several of
        them with the same function (and policy) is one entry: the same object, or the same
        definition imported twice (one file loaded as the app and imported by another module of it);
        with different functions, or with two policies, it is a ``CompensationDefinitionError`` naming
        both definitions, and so are two different check hooks for one name. ``policy`` is the default for effects in none of them (a
        step's own ``compensate=``): by default the one the registries share, else
        ``DEFAULT_COMPENSATION_POLICY``."""
        for registry in registries:
            if not isinstance(registry, Compensations):
                raise CompensationDefinitionError(f"Compensations.combine() takes Compensations registries, "
                                                  f"got {registry!r}")
        if policy is None:
            shared = registries[0].policy if registries else DEFAULT_COMPENSATION_POLICY
            policy = shared if all(r.policy == shared for r in registries) else DEFAULT_COMPENSATION_POLICY
        combined = cls(policy=policy)
        for registry in registries:
            for name, entry in registry._compensations.items():
                seen = combined._compensations.setdefault(name, entry)
                if not _same_definition(seen.fn, entry.fn):
                    raise CompensationDefinitionError(
                        f"two compensations for {name!r}: {_describe(seen.fn)} and {_describe(entry.fn)}; "
                        "one effect has one compensation: keep one of them"
                    )
                if seen.policy != entry.policy:
                    raise CompensationDefinitionError(
                        f"the compensation for {name!r} ({_describe(entry.fn)}) is registered with two different "
                        "policies; register it once"
                    )
            for name, fn in registry._checks.items():
                seen_check = combined._checks.setdefault(name, fn)
                if not _same_definition(seen_check, fn):
                    raise CompensationDefinitionError(
                        f"two check hooks for {name!r}: {_describe(seen_check)} and {_describe(fn)}; "
                        "one effect has one check hook"
                    )
        return combined

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
