"""Circuit breakers shared by every process through the store.

The state machine is ``compensations``' pure ``decide``/``record``; this module only keeps its
state in the store's ``agentsaga_breakers`` row: read ``(state, version)``, apply the machine,
write with compare-and-set on the version. A lost race means another process changed the breaker
in between, so the step is re-read and re-applied to *its* state (never to a stale copy): two
workers can never both trip the breaker, nor both take a single half-open probe slot.

Reads are unconditional, writes happen only when the machine changed something: a closed,
count-only breaker in front of a healthy tool costs one indexed read per call and no write.

Store calls are synchronous (like the rest of the store). An async caller uses ``ahooks``: the
read runs in a thread, and it is *shared*. On one event loop, the callers asking for a breaker's
state while a read of it is under way wait for the next read, which all of them then share, so a
thousand concurrent calls through one healthy breaker cost a few reads, not two thousand thread
hops. Every caller still decides on a read that began after it asked, as a read of its own would
have: an open breaker written by another process is honoured exactly as with ``before_call``.
Only when the machine changes the state (a failure, a probe, a transition) does the caller go the
compare-and-set way, in a thread, re-reading as a lost race does.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from compensations import BreakerConfig, BreakerRegistry
from compensations.breaker_machine import BreakerState, decide, record
from orchestrator.errors import CircuitOpenError, OrchestratorError

__all__ = ["StoreBreakers", "BreakerStore", "AsyncGate"]

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
        # per event loop, per breaker name: the shared reads of ``ahooks``
        self._reads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _SharedRead]] = \
            weakref.WeakKeyDictionary()
        self._reads_lock = threading.Lock()

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

    def ahooks(
        self,
        configs: BreakerRegistry | Callable[[str], BreakerConfig],
        on_transition: Callable[[Transition], Any] | None = None,
        *,
        max_age: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> tuple[Callable[[str], Awaitable[None]], Callable[[str, bool], Awaitable[None]]]:
        """``hooks`` for async callers (``AsyncHttpTool(breaker=...)``): the same decisions, never a
        blocking call on the event loop, and the state reads shared (see the module docstring).

        ``max_age`` (seconds of ``monotonic``): a read that began at most this long before a call
        asked may decide it, so under load a healthy breaker costs a read per ``max_age``, not one
        per call. A change made by another process is then honoured within ``max_age``; a change
        this process makes (a failure, a probe) is always decided on a fresh read. 0: every call
        waits for a read that began after it asked."""
        gate = self.gate(configs, on_transition, max_age=max_age, monotonic=monotonic)
        return gate.before, gate.after

    def gate(
        self,
        configs: BreakerRegistry | Callable[[str], BreakerConfig],
        on_transition: Callable[[Transition], Any] | None = None,
        *,
        max_age: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> AsyncGate:
        """What ``ahooks`` returns the methods of, for a caller that asks it directly: ``admit(name)``
        and ``settle(name, ok)`` decide at once where a recent read allows (returning None) and
        return an awaitable only when they must wait, so a healthy breaker costs a call no coroutine."""
        config_for = configs.config_for if isinstance(configs, BreakerRegistry) else configs
        return AsyncGate(self, config_for, on_transition, max_age, monotonic)

    def _shared(self, name: str) -> _SharedRead:
        loop = asyncio.get_running_loop()
        with self._reads_lock:
            reads = self._reads.get(loop)
            if reads is None:
                reads = self._reads[loop] = {}
            shared = reads.get(name)
            if shared is None:
                shared = reads[name] = _SharedRead(loop, lambda: self._store.breakers.get(name))
        return shared

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


class AsyncGate:
    """A breaker gate for async callers: what ``StoreBreakers.gate`` returns and ``ahooks`` returns the
    methods of (an object, not closures: a model call makes one, and it is held while the call is out)."""

    __slots__ = ("breakers", "config_for", "on_transition", "max_age", "monotonic")

    def __init__(self, breakers: StoreBreakers, config_for: Callable[[str], BreakerConfig],
                 on_transition: Callable[[Transition], Any] | None, max_age: float,
                 monotonic: Callable[[], float]) -> None:
        self.breakers, self.config_for, self.on_transition = breakers, config_for, on_transition
        self.max_age, self.monotonic = max_age, monotonic

    def _report(self, transition: Transition | None) -> None:
        if transition is not None and self.on_transition is not None:
            self.on_transition(transition)

    def admit(self, name: str) -> Awaitable[None] | None:
        """``before``, deciding at once where it can: None when the call was admitted on a read
        recent enough (``max_age``) with nothing to write; raises ``CircuitOpenError`` when that read
        says open; else the awaitable that decides (a read to wait for, or a change to write).
        A model call asks twice per request: a coroutine for each would be most of its cost."""
        config = self.config_for(name)
        shared = self.breakers._shared(config.name)
        current = shared.known(self.max_age, self.monotonic)
        if current is None:
            return self._before(config, shared)
        return self._admit(config, current)

    def settle(self, name: str, ok: bool) -> Awaitable[None] | None:
        """``after``, deciding at once where it can (as ``admit``): None when recorded."""
        config = self.config_for(name)
        shared = self.breakers._shared(config.name)
        current = shared.known(self.max_age, self.monotonic)
        if current is None:
            return self._after(config, shared, ok)
        return self._record(config, current, ok)

    async def before(self, name: str) -> None:
        pending = self.admit(name)
        if pending is not None:
            await pending

    async def after(self, name: str, ok: bool) -> None:
        pending = self.settle(name, ok)
        if pending is not None:
            await pending

    def _admit(self, config: BreakerConfig, current: BreakerState) -> Awaitable[None] | None:
        breakers = self.breakers
        now = breakers._clock()
        allowed, new, retry_at, transition = decide(config, current, now)
        if new != current:
            return self._write(breakers.before_call, config)  # a change: compare-and-set
        if not allowed:  # nothing to write: decided on a read recent enough (see max_age)
            raise breakers._open_error(config, current, now, retry_at)
        self._report(transition)
        return None

    def _record(self, config: BreakerConfig, current: BreakerState, ok: bool) -> Awaitable[None] | None:
        new, transition = record(config, current, self.breakers._clock(), ok)
        if new != current:
            return self._write(self.breakers.after_call, config, ok)
        self._report(transition)
        return None

    async def _before(self, config: BreakerConfig, shared: _SharedRead) -> None:
        pending = self._admit(config, await asyncio.shield(shared.request(self.monotonic)))
        if pending is not None:
            await pending

    async def _after(self, config: BreakerConfig, shared: _SharedRead, ok: bool) -> None:
        pending = self._record(config, await asyncio.shield(shared.request(self.monotonic)), ok)
        if pending is not None:
            await pending

    async def _write(self, change: Callable[..., Transition | None], config: BreakerConfig, *args: Any) -> None:
        try:
            self._report(await asyncio.to_thread(change, config, *args))
        finally:
            self.breakers._shared(config.name).written(self.monotonic())


class _SharedRead:
    """One breaker row's reads on one event loop, shared by the callers that ask while one is under way.

    ``request()`` gives a future for the result of a read that *begins after the call*: the read
    starting now if none is running, else the next one, which begins when the running one ends and
    serves everybody who asked meanwhile. Used from the loop's thread only.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, read: Callable[[], tuple[str | None, int]]) -> None:
        self._loop = loop
        self._read = read
        self._queued: asyncio.Future[BreakerState] | None = None  # for the next read to begin
        self._busy = False
        self._parsed: tuple[str | None, BreakerState] = (None, BreakerState())
        self._last: tuple[float, BreakerState] | None = None  # when the newest finished read began, its state
        self._clock: Callable[[], float] = time.monotonic
        self._written = float("-inf")  # when this process last changed the row

    def written(self, now: float) -> None:
        """This process changed the row: no read that began before now stands for it any more."""
        self._written = now
        self._last = None

    def known(self, max_age: float, monotonic: Callable[[], float]) -> BreakerState | None:
        """The newest read's state if it began at most ``max_age`` ago, else None. Past half that
        age a read is begun ahead, which nobody waits for: under a steady flow of calls the state
        is then refreshed before it expires, and callers decide at once instead of each of them
        waiting for a read (the rule is the same: a read that began at most ``max_age`` before)."""
        last = self._last
        if last is None or max_age <= 0:
            return None
        age = monotonic() - last[0]
        if age > max_age:
            return None
        if age > max_age / 2 and not self._busy:
            self.request(monotonic)
        return last[1]

    def request(self, monotonic: Callable[[], float] = time.monotonic) -> asyncio.Future[BreakerState]:
        self._clock = monotonic
        future = self._queued
        if future is None:
            future = self._queued = self._loop.create_future()
        if not self._busy:
            self._begin()
        return future

    def _begin(self) -> None:
        future, self._queued = self._queued, None
        assert future is not None
        self._busy = True
        began = self._clock()
        reading = self._loop.run_in_executor(None, self._read)

        def done(reading: asyncio.Future[tuple[str | None, int]]) -> None:
            self._busy = False
            if not future.done():
                try:
                    text, _version = reading.result()
                    if text != self._parsed[0]:
                        self._parsed = (text, BreakerState.from_json(text))
                    if began >= self._written and (self._last is None or began >= self._last[0]):
                        self._last = (began, self._parsed[1])
                    future.set_result(self._parsed[1])
                except BaseException as exc:  # noqa: BLE001 (handed to every waiter)
                    future.set_exception(exc)
                    future.exception()  # retrieved: waiters that were cancelled must not log it
            if self._queued is not None:
                self._begin()

        reading.add_done_callback(done)
