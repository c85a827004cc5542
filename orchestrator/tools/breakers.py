"""Circuit breakers shared by every process through the store.

The state machine is ``compensations``' pure ``decide``/``record``; this module only keeps its
state in the store's ``agentsaga_breakers`` row: read ``(state, version)``, apply the machine,
write with compare-and-set on the version. A lost race means another process changed the breaker
in between, so the step is re-read and re-applied to *its* state (never to a stale copy): two
workers can never both trip the breaker, nor both take a single half-open probe slot.

Reads are unconditional, writes happen only when the machine changed something: a closed,
count-only breaker in front of a healthy tool costs one indexed read per call and no write.

Store calls are synchronous (like the rest of the store); an async caller runs them in a thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from compensations import BreakerConfig, BreakerRegistry
from compensations.breaker_machine import BreakerState, decide, record
from orchestrator.errors import CircuitOpenError, OrchestratorError

__all__ = ["StoreBreakers", "BreakerStore"]

Transition = dict[str, Any]
_MAX_RACES = 100  # lost compare-and-sets in a row before giving up (each one means someone progressed)


class BreakerRows(Protocol):
    """The store part this module needs, ``store.breakers`` (see docs/internals-store.md)."""

    def get(self, name: str) -> tuple[str | None, int]: ...

    def compare_and_set(self, name: str, *, state: str, expected_version: int, now: float) -> bool: ...


class BreakerStore(Protocol):
    """A store with a ``breakers`` part."""

    @property
    def breakers(self) -> BreakerRows: ...


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="seconds")


class StoreBreakers:
    """``before_call``/``after_call`` around each guarded call; ``clock`` is the engine's injected clock."""

    def __init__(self, store: BreakerStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    def state(self, name: str) -> BreakerState:
        """The breaker's current state as stored (a closed breaker if never written)."""
        return BreakerState.from_json(self._store.breakers.get(name)[0])

    def before_call(self, config: BreakerConfig) -> Transition | None:
        """Admit a call, or raise ``CircuitOpenError`` naming the breaker and when it will probe.

        Returns the transition the admission caused (open -> half_open), for the run's journal.
        """
        for _ in range(_MAX_RACES):
            text, version = self._store.breakers.get(config.name)
            current = BreakerState.from_json(text)
            now = self._clock()
            allowed, new, retry_at, transition = decide(config, current, now)
            if new != current and not self._store.breakers.compare_and_set(
                config.name, state=new.to_json(), expected_version=version, now=now
            ):
                continue  # someone else changed it: decide again on what they wrote
            if allowed:
                return transition
            raise self._open_error(config, current, now, retry_at)
        raise self._contended(config)

    def after_call(self, config: BreakerConfig, ok: bool) -> Transition | None:
        """Record a call's outcome; returns the transition it caused (closed/half_open -> open, ...)."""
        for _ in range(_MAX_RACES):
            text, version = self._store.breakers.get(config.name)
            current = BreakerState.from_json(text)
            now = self._clock()
            new, transition = record(config, current, now, ok)
            if new == current or self._store.breakers.compare_and_set(
                config.name, state=new.to_json(), expected_version=version, now=now
            ):
                return transition
        raise self._contended(config)

    def hooks(
        self,
        configs: BreakerRegistry | Callable[[str], BreakerConfig],
        on_transition: Callable[[Transition], Any] | None = None,
    ) -> tuple[Callable[[str], None], Callable[[str, bool], None]]:
        """``(before, after)`` callables taking a breaker *name*, as ``HttpTool(breaker=...)`` expects.

        ``configs`` maps a name to its configuration (a ``BreakerRegistry`` gives the declared one,
        else the defaults); ``on_transition`` receives each transition (e.g. to journal it).
        """
        config_for = configs.config_for if isinstance(configs, BreakerRegistry) else configs

        def before(name: str) -> None:
            transition = self.before_call(config_for(name))
            if transition is not None and on_transition is not None:
                on_transition(transition)

        def after(name: str, ok: bool) -> None:
            transition = self.after_call(config_for(name), ok)
            if transition is not None and on_transition is not None:
                on_transition(transition)

        return before, after

    @staticmethod
    def _open_error(config: BreakerConfig, state: BreakerState, now: float, retry_at: float | None) -> CircuitOpenError:
        wait = max(0.0, (retry_at or now) - now)
        if state.state == "half_open":
            why = f"is half-open and its {config.half_open_max_calls} probe slot(s) are taken"
        else:
            why = "is open"
        when = f"; next probe allowed in {math.ceil(wait)}s (at {_when(retry_at)})" if retry_at is not None else ""
        return CircuitOpenError(f"circuit breaker {config.name!r} {why}: failing fast{when}",
                                tool=config.name, retry_at=retry_at)

    @staticmethod
    def _contended(config: BreakerConfig) -> OrchestratorError:
        return OrchestratorError(
            f"circuit breaker {config.name!r}: its state changed under us {_MAX_RACES} times in a row; gave up"
        )
