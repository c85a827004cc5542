"""How compensations are retried: a small frozen value, read as data in a workflow file.

A compensation must not be given up lightly (giving up leaves the world half-changed and the run
``compensation_failed``), so the default retries more patiently than a step's default: five
attempts, backing off from half a second to at most thirty. Exceptions listed in ``permanent``
(e.g. "booking not found" from the service) fail the compensation at once: retrying cannot help
and only delays the operator seeing it. The engine never retries a refusal from the outside world
(``PermanentToolError``, a 4xx from ``ctx.http``), whatever the policy says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compensations.errors import CompensationDefinitionError
from workflows import Retry

__all__ = ["CompensationPolicy", "DEFAULT_COMPENSATION_POLICY"]


def _types(value: object) -> tuple[type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, (tuple, list, frozenset, set)):
        raise CompensationDefinitionError(
            f"CompensationPolicy(permanent=...) must be an exception type or a tuple of them, got {value!r}"
        )
    for t in value:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise CompensationDefinitionError(f"CompensationPolicy(permanent=...) must hold exception types, got {t!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompensationPolicy:
    """Retry policy for compensations, and which failures are permanent."""

    retry: Retry = field(default_factory=lambda: Retry(attempts=5, initial=0.5, max_backoff=30.0))
    permanent: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.retry, Retry):
            raise CompensationDefinitionError(f"CompensationPolicy(retry=...) must be a Retry(...), got {self.retry!r}")
        object.__setattr__(self, "permanent", _types(self.permanent))

    def is_permanent(self, error: BaseException) -> bool:
        return isinstance(error, self.permanent)

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether to try again after failed attempt number ``attempt`` (1-based) raised ``error``."""
        if self.is_permanent(error) or attempt >= self.retry.attempts:
            return False
        return self.retry.should_retry(error)

    def backoff(self, attempt: int, u: float) -> float:
        """Seconds to wait after failed attempt ``attempt``; ``u`` in [0, 1) from the engine's random source."""
        return self.retry.backoff(attempt, u)

    def describe(self) -> dict[str, Any]:
        return {"retry": self.retry.describe(), "permanent": [t.__qualname__ for t in self.permanent]}


DEFAULT_COMPENSATION_POLICY = CompensationPolicy()
