"""In-flight call limits per tool, across the whole cluster: a slot per call, kept in the store.

``ToolLimits(calls={"api.openai.com": 8, "payments": 2})`` given to ``Orchestrator(tool_limits=...)``
(a ``Worker`` passes its ``Limits.tools``) makes every ``ctx.http`` call to a limited tool (by its
breaker name: the host, ``host:port``, or the ``breaker=`` a call names) hold a *slot* (a row with
an expiry) from just before it is sent until its answer is in; slots are renewed while held, so a
process that dies frees its slots within ``slot_ttl``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ConfigurationError
from store import Store, StoreError

__all__ = ["ToolLimits", "CallLimits", "check_name", "positive_int"]

_log = logging.getLogger("agentsaga.limits")
_NAME = re.compile(r"^[^\s=]{1,200}$")


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(f"{what} must be a non-empty name of at most 200 characters without spaces "
                                 f"or '=', got {value!r}")
    return value


@dataclass(frozen=True)
class ToolLimits:
    """In-flight calls allowed per tool name, and how long a dead process's slot lingers."""

    calls: Mapping[str, int] = field(default_factory=dict)
    slot_ttl: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.calls, Mapping):
            raise ConfigurationError(f"tool limits must map tool names to a number of calls, got {self.calls!r}")
        for name, n in self.calls.items():
            check_name(name, "a tool name in the tool limits")
            positive_int(n, f"the tool limit of {name!r}")
        if isinstance(self.slot_ttl, bool) or not isinstance(self.slot_ttl, (int, float)) or self.slot_ttl <= 0:
            raise ConfigurationError(f"slot_ttl must be a positive number of seconds, got {self.slot_ttl!r}")
        object.__setattr__(self, "calls", dict(self.calls))


# -- slots around tool calls --------------------------------------------------------------------------
class _Held:
    __slots__ = ("name", "idx", "holder", "since")

    def __init__(self, name: str, idx: int, holder: str, since: float) -> None:
        self.name, self.idx, self.holder, self.since = name, idx, holder, since


class _Pair:
    """The (before, after) hooks of one tool instance and the slots they hold. When the tool is
    dropped (the step attempt ended) any slot still held is released: a call interrupted by a
    cancellation or a step timeout never reaches ``after``."""

    def __init__(self, limits: CallLimits) -> None:
        self.held: dict[str, list[_Held]] = {}
        weakref.finalize(self, CallLimits._release_all, limits, self.held)


class CallLimits:
    """Slots for in-flight calls per tool name, shared through the store (``store.slots``).

    Waiting for a slot polls with a short backoff (10 ms growing to 250 ms): a caller that waits is
    busy by definition, and a slot frees when another call *returns*, which no notification would
    announce sooner than the caller's next look. Held slots are renewed every ``ttl / 3`` seconds by
    one daemon thread, which sleeps while nothing is held. A slot held longer than ``max_hold`` is no
    longer renewed (a leak guard: it then expires).
    """

    def __init__(self, store: Store, limits: Mapping[str, int], *, owner: str, clock: Callable[[], float],
                 ttl: float = 30.0, max_hold: float | None = None) -> None:
        self.store = store
        self.limits = dict(limits)
        self.owner = owner
        self.clock = clock
        self.ttl = float(ttl)
        self.max_hold = float(max_hold) if max_hold is not None else 4 * self.ttl
        self._held: dict[tuple[str, int, str], _Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- acquiring ------------------------------------------------------------------------------
    def try_acquire(self, name: str) -> _Held | None:
        holder = f"{self.owner}:{uuid.uuid4().hex[:12]}"
        idx = self.store.slots.acquire(name, limit=self.limits[name], holder=holder, ttl=self.ttl, now=self.clock())
        if idx is None:
            return None
        held = _Held(name, idx, holder, time.monotonic())
        with self._lock:
            self._held[(name, idx, holder)] = held
            self._ensure_renewer()
        return held

    def acquire(self, name: str) -> _Held:
        delay, waited, warned = 0.01, 0.0, False
        while True:
            held = self.try_acquire(name)
            if held is not None:
                return held
            time.sleep(delay)
            waited += delay
            delay = min(delay * 1.5, 0.25)
            warned = warned or self._warn_long_wait(name, waited)

    async def aacquire(self, name: str) -> _Held:
        delay, waited, warned = 0.01, 0.0, False
        while True:
            held = self.try_acquire(name)
            if held is not None:
                return held
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 1.5, 0.25)
            warned = warned or self._warn_long_wait(name, waited)

    def _warn_long_wait(self, name: str, waited: float) -> bool:
        if waited < 30:
            return False
        _log.warning("waited %.0fs for a slot of tool %r (limit %d in flight)", waited, name, self.limits[name])
        return True

    def release(self, held: _Held) -> None:
        with self._lock:
            self._held.pop((held.name, held.idx, held.holder), None)
        try:
            self.store.slots.release(held.name, held.idx, holder=held.holder)
        except StoreError as exc:  # it expires on its own within ttl
            _log.warning("could not release slot %d of tool %r: %s", held.idx, held.name, exc)

    def _release_all(self, held: dict[str, list[_Held]]) -> None:
        for items in held.values():
            while items:
                self.release(items.pop())

    # -- hooks around each call -----------------------------------------------------------------
    def wrap(self, hooks: tuple[Callable[..., Any], Callable[..., Any]], *, is_async: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """Breaker hooks ``(before, after)`` that also hold a slot of a limited tool for each call.
        The breaker is asked first: an open breaker fails fast and takes no slot."""
        before, after = hooks
        pair = _Pair(self)
        held = pair.held

        def after_call(name: str, ok: bool) -> Any:
            items = held.get(name)
            if items:
                self.release(items.pop())
            return after(name, ok)

        if is_async:
            async def abefore(name: str) -> None:
                admitted = before(name)
                if inspect.isawaitable(admitted):  # async breaker hooks (StoreBreakers.ahooks)
                    await admitted
                if name in self.limits:
                    held.setdefault(name, []).append(await self.aacquire(name))

            abefore.pair = pair  # type: ignore[attr-defined]  # lives as long as the tool's hooks
            return abefore, after_call

        def sbefore(name: str) -> None:
            before(name)
            if name in self.limits:
                held.setdefault(name, []).append(self.acquire(name))

        sbefore.pair = pair  # type: ignore[attr-defined]
        return sbefore, after_call

    # -- renewal --------------------------------------------------------------------------------
    def _ensure_renewer(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._renew_loop, name="agentsaga-slots", daemon=True)
            self._thread.start()
        self._wake.set()

    def _renew_loop(self) -> None:
        interval = max(self.ttl / 3.0, 0.05)
        while not self._closed:
            with self._lock:
                idle = not self._held
            if idle:
                self._wake.wait()  # nothing held: sleep until something is
                self._wake.clear()
                continue
            time.sleep(interval)
            self.renew_all()

    def renew_all(self) -> None:
        now_mono = time.monotonic()
        with self._lock:
            held = list(self._held.values())
        for h in held:
            if now_mono - h.since > self.max_hold:
                continue
            try:
                if not self.store.slots.renew(h.name, h.idx, holder=h.holder, ttl=self.ttl, now=self.clock()):
                    _log.warning("slot %d of tool %r expired while held (the process stalled?)", h.idx, h.name)
            except StoreError as exc:
                _log.warning("could not renew slot %d of tool %r: %s", h.idx, h.name, exc)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
