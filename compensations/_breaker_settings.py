"""Circuit breakers as data: a breaker's settings, and the registry that declares them by name.

A ``BreakerConfig`` is what a workflow file says about a breaker (thresholds, window, reset
timeout, half-open probes); ``declare_breaker`` puts one in the process-wide registry, and a step
or a call names it. How a breaker moves between closed, open and half-open is the pure machine in
``compensations.breaker_machine``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from compensations.errors import BreakerConfigError

__all__ = ["BreakerConfig", "BreakerRegistry", "default_breakers", "declare_breaker", "is_number", "MIN_SAMPLES"]

MIN_SAMPLES = 100  # outcomes kept per breaker at least (see breaker_machine)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerConfig:
    """One breaker's settings. Times are seconds; ``failure_threshold=None`` disables the count rule."""

    name: str
    failure_threshold: int | None = 5
    failure_rate: float | None = None
    window: float = 60.0
    min_calls: int = 10
    reset_timeout: float = 30.0
    half_open_max_calls: int = 1
    success_threshold: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise BreakerConfigError(f"BreakerConfig(name={self.name!r}) must be a non-empty string")
        where = f"breaker {self.name!r}: "
        for option in ("min_calls", "half_open_max_calls", "success_threshold"):
            value = getattr(self, option)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BreakerConfigError(f"{where}{option}={value!r} must be an integer >= 1")
        threshold = self.failure_threshold
        if threshold is not None and (not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1):
            raise BreakerConfigError(f"{where}failure_threshold={threshold!r} must be an integer >= 1 or None")
        rate = self.failure_rate
        if rate is not None and (not is_number(rate) or not 0 < rate <= 1):
            raise BreakerConfigError(f"{where}failure_rate={rate!r} must be a number in (0, 1] or None")
        if threshold is None and rate is None:
            raise BreakerConfigError(f"{where}failure_threshold and failure_rate are both None; it could never open")
        for option in ("window", "reset_timeout"):
            value = getattr(self, option)
            if not is_number(value) or value <= 0 or value != value or value == float("inf"):
                raise BreakerConfigError(f"{where}{option}={value!r} must be a positive number of seconds")

    @property
    def max_samples(self) -> int:
        return max(MIN_SAMPLES, self.min_calls, self.failure_threshold or 0)

    def describe(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class BreakerRegistry:
    """Breaker configurations by name; one name, one configuration."""

    def __init__(self) -> None:
        self._configs: dict[str, BreakerConfig] = {}
        self._defaults: dict[str, BreakerConfig] = {}  # config_for's undeclared names, made once each

    def declare(self, config: BreakerConfig | str, /, **settings: Any) -> BreakerConfig:
        """Declare ``config`` (or ``name, **settings``); declaring the same settings again is fine."""
        if isinstance(config, str):
            config = BreakerConfig(name=config, **settings)
        elif settings or not isinstance(config, BreakerConfig):
            raise BreakerConfigError(f"declare() takes a BreakerConfig, or a name and settings; got {config!r}")
        existing = self._configs.get(config.name)
        if existing is not None and existing != config:
            diff = ", ".join(
                f"{f.name} {getattr(existing, f.name)!r} != {getattr(config, f.name)!r}"
                for f in fields(config) if getattr(existing, f.name) != getattr(config, f.name)
            )
            raise BreakerConfigError(f"breaker {config.name!r} declared twice with different settings: {diff}")
        self._configs[config.name] = config
        return config

    def get(self, name: str) -> BreakerConfig | None:
        return self._configs.get(name)

    def config_for(self, name: str) -> BreakerConfig:
        """The declared configuration, else the defaults under that name (a step may just name one)."""
        config = self._configs.get(name) or self._defaults.get(name)
        if config is None:
            if len(self._defaults) >= 1024:  # names made up per call must not grow this without end
                self._defaults.clear()
            config = self._defaults[name] = BreakerConfig(name=name)
        return config

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._configs))

    def __contains__(self, name: object) -> bool:
        return name in self._configs


#: The process-wide registry that workflow files declare into (like the workflows they define).
default_breakers = BreakerRegistry()


def declare_breaker(name: str, /, *, registry: BreakerRegistry | None = None, **settings: Any) -> BreakerConfig:
    """Declare a breaker in ``registry`` (default: ``default_breakers``) and return its config:

        payments = declare_breaker("payments", failure_threshold=3, reset_timeout=10)
    """
    return (registry if registry is not None else default_breakers).declare(name, **settings)
