"""Errors raised while declaring effects, compensations and breakers, or planning a saga.

    CompensationsError               base of everything in this package
     ├── CompensationDefinitionError a compensation, check hook or policy is declared wrongly
     │                               (also a ``workflows.DefinitionError``: raised at definition)
     ├── BreakerConfigError          a breaker's settings are invalid, or one name has two configurations
     │                               (also a ``workflows.DefinitionError``)
     ├── PlanError                   the effects handed to the planner contradict each other
     └── BreakerStateError           a stored breaker state is not one this code can read
"""

from __future__ import annotations

from workflows.errors import DefinitionError

__all__ = [
    "CompensationsError",
    "CompensationDefinitionError",
    "BreakerConfigError",
    "PlanError",
    "BreakerStateError",
]


class CompensationsError(Exception):
    """Base class for this package's errors."""


class CompensationDefinitionError(CompensationsError, DefinitionError):
    """A compensation, check hook or compensation policy is declared wrongly; the message names it."""


class BreakerConfigError(CompensationsError, DefinitionError):
    """A breaker's settings are invalid, or one breaker name is declared with two configurations."""


class PlanError(CompensationsError):
    """The effects given to the planner contradict each other (e.g. two share an idempotency key)."""


class BreakerStateError(CompensationsError):
    """A breaker state read back from the store is malformed or from a newer version of this code."""
