"""Policies as small, frozen values: they read as data in a workflow file.

Delays are computed here as pure functions of (attempt, a random number in [0, 1)); the engine
supplies the random number from its injected source, so a replay or a test sees exact delays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from workflows.errors import DefinitionError

__all__ = ["END", "Retry", "NO_RETRY"]


class _End:
    """The sentinel a router returns (or an edge targets) to end a branch."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"

    def __reduce__(self) -> str:
        return "END"


END: Final = _End()
#: How END is written in the journal and in graph descriptions.
END_NAME: Final = "__end__"


def _seconds(value: object) -> bool:
    """A finite number (not a bool): NaN or infinity would reach the journal as a delay JSON cannot hold."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _exception_types(value: object, option: str) -> tuple[type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    if isinstance(value, (str, bytes)):  # a name is not a type (and would be read letter by letter)
        raise DefinitionError(f"Retry({option}=...) must be an exception type or a tuple of them, got {value!r}; "
                              "pass the class itself")
    try:
        types = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise DefinitionError(f"Retry({option}=...) must be an exception type or a tuple of them, got {value!r}") from None
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise DefinitionError(f"Retry({option}=...) must hold exception types, got {t!r}")
    return types


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """How a failing step is retried: exponential backoff with additive jitter.

    The delay before attempt ``n + 1`` is ``min(max_backoff, initial * multiplier ** (n - 1))``
    plus ``jitter * u`` seconds, with ``u`` uniform in [0, 1). An exception is retried when it is an
    instance of ``retry_on`` and not of ``give_up_on``.
    """

    attempts: int = 3
    initial: float = 0.5
    max_backoff: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.25
    retry_on: tuple[type[BaseException], ...] = field(default=(Exception,))
    give_up_on: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.jitter is False:  # "no jitter", as a flag
            object.__setattr__(self, "jitter", 0.0)
        elif self.jitter is True:
            raise DefinitionError(
                "Retry(jitter=True) says no amount: give the most seconds of jitter to add, "
                "e.g. jitter=0.25 (or jitter=False for none)"
            )
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise DefinitionError(f"Retry(attempts={self.attempts!r}) must be an integer >= 1")
        for name in ("initial", "max_backoff", "jitter"):
            value = getattr(self, name)
            if not _seconds(value) or value < 0:
                raise DefinitionError(f"Retry({name}={value!r}) must be a finite number >= 0")
        if not _seconds(self.multiplier) or self.multiplier < 1:
            raise DefinitionError(f"Retry(multiplier={self.multiplier!r}) must be a finite number >= 1")
        if self.max_backoff < self.initial:
            raise DefinitionError(
                f"Retry(max_backoff={self.max_backoff!r}) must not be below initial={self.initial!r}"
            )
        object.__setattr__(self, "retry_on", _exception_types(self.retry_on, "retry_on"))
        object.__setattr__(self, "give_up_on", _exception_types(self.give_up_on, "give_up_on"))

    def backoff(self, attempt: int, u: float) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff, self.initial * self.multiplier ** max(0, attempt - 1))
        return base + self.jitter * u

    def should_retry(self, error: BaseException) -> bool:
        if not isinstance(error, self.retry_on) or isinstance(error, self.give_up_on):
            return False
        # A durable call's failure raised again from the journal as a CallFailedError (its class could
        # not be made again): given up on when its recorded type names a give_up_on class, as the
        # error it stands for was (a declined charge is not retried because it came back renamed).
        named = getattr(error, "type_name", None)
        return not (isinstance(named, str) and any(_names(named, t) for t in self.give_up_on))

    def describe(self) -> dict[str, object]:
        return {
            "attempts": self.attempts,
            "initial": self.initial,
            "max_backoff": self.max_backoff,
            "multiplier": self.multiplier,
            "jitter": self.jitter,
            "retry_on": [t.__qualname__ for t in self.retry_on],
            "give_up_on": [t.__qualname__ for t in self.give_up_on],
        }


def _names(recorded: str, cls: type[BaseException]) -> bool:
    """Whether ``recorded`` (a type as a journal names it: ``module.Qual``, or ``Qual`` for a class
    of ``__main__`` or a builtin) is ``cls``, whichever module the class was loaded as since."""
    return recorded in (cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}") or \
        recorded.endswith(f".{cls.__qualname__}")


#: The default: a step runs once; a failure goes to its failure route or fails the run.
NO_RETRY: Final = Retry(attempts=1, initial=0.0, max_backoff=0.0, jitter=0.0)
