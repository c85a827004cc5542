"""Bulkheads: how much runs in parallel, per queue and per tool, across the whole cluster.

Settings are small frozen values, checked when they are made (a bad limit fails at start, with
the setting named, never mid-run):

```python
from orchestrator import Limits, QueueLimit
limits = Limits(
    queues={"emails": QueueLimit(concurrency=20, worker_concurrency=4, rate=(100, 60.0))},
    tools={"api.openai.com": 8, "payments": 2},   # in-flight calls, by breaker/tool name
)
Worker(url, ["app.flows:signup"], concurrency=8, limits=limits).run()
```

- ``QueueLimit.concurrency``: runs of the queue leased at once, by all workers together. Enforced
  by the claim itself (``store.queues.claim_from``): a lease *is* an in-flight run, so a worker
  that dies frees its share when its leases expire, and nothing has to be kept in step.
- ``QueueLimit.worker_concurrency``: runs of the queue one worker drives at once.
- ``QueueLimit.rate``: ``(n, seconds)``: at most n runs of the queue handed to workers in any
  window of that many seconds (a sliding window kept in the database).
- ``tools``: in-flight HTTP calls per tool name (the breaker name ``ctx.http`` uses: the host,
  ``host:port``, or the ``breaker=`` a call names), across the cluster. Each call holds a *slot*
  (a row with an expiry) from just before it is sent until its answer is in; slots are renewed
  while held, so a process that dies frees its slots within ``slot_ttl``.

Every worker serving a limited queue must be given the same limits: they are agreed through the
database, but declared in code (as DBOS declares its queues). ``orc.recover()`` and
``orc.resume()`` do not go through queue limits; tool limits apply wherever ``CallLimits`` is
installed (``Limits.install(orc)``, which a ``Worker`` does for you).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConfigurationError
from store import StoreError

if TYPE_CHECKING:
    from orchestrator._orchestrator import Orchestrator
    from store import Store

__all__ = ["QueueLimit", "Limits", "CallLimits", "parse_count", "parse_rate"]

_log = logging.getLogger("agentsaga.limits")
_NAME = re.compile(r"^[^\s=]{1,200}$")


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(f"{what} must be a non-empty name of at most 200 characters without spaces "
                                 f"or '=', got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """Limits of one queue: ``concurrency`` (cluster-wide), ``worker_concurrency`` (per worker),
    ``rate`` ``(n, seconds)``. None means unlimited."""

    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate: tuple[int, float] | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            _positive_int(self.concurrency, "QueueLimit.concurrency")
        if self.worker_concurrency is not None:
            _positive_int(self.worker_concurrency, "QueueLimit.worker_concurrency")
        if self.rate is not None:
            if not isinstance(self.rate, tuple) or len(self.rate) != 2:
                raise ConfigurationError(f"QueueLimit.rate must be a pair (runs, seconds), got {self.rate!r}")
            n, per = self.rate
            _positive_int(n, "QueueLimit.rate's run count")
            if isinstance(per, bool) or not isinstance(per, (int, float)) or not math.isfinite(per) or per <= 0:
                raise ConfigurationError(f"QueueLimit.rate's period must be a positive number of seconds, got {per!r}")
            object.__setattr__(self, "rate", (n, float(per)))

    @property
    def shared(self) -> bool:
        """True when the limit is agreed with other workers through the database."""
        return self.concurrency is not None or self.rate is not None


@dataclass(frozen=True)
class Limits:
    """Queue limits by queue name, and in-flight call limits by tool name (see the module doc)."""

    queues: Mapping[str, QueueLimit] = field(default_factory=dict)
    tools: Mapping[str, int] = field(default_factory=dict)
    slot_ttl: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.queues, Mapping):
            raise ConfigurationError(f"Limits.queues must map queue names to QueueLimit, got {self.queues!r}")
        for name, limit in self.queues.items():
            _name(name, "a queue name in Limits.queues")
            if not isinstance(limit, QueueLimit):
                raise ConfigurationError(f"Limits.queues[{name!r}] must be a QueueLimit, got {limit!r}")
        if not isinstance(self.tools, Mapping):
            raise ConfigurationError(f"Limits.tools must map tool names to a number of calls, got {self.tools!r}")
        for name, n in self.tools.items():
            _name(name, "a tool name in Limits.tools")
            _positive_int(n, f"Limits.tools[{name!r}]")
        if isinstance(self.slot_ttl, bool) or not isinstance(self.slot_ttl, (int, float)) or self.slot_ttl <= 0:
            raise ConfigurationError(f"Limits.slot_ttl must be a positive number of seconds, got {self.slot_ttl!r}")
        object.__setattr__(self, "queues", dict(self.queues))
        object.__setattr__(self, "tools", dict(self.tools))

    def install(self, orc: Orchestrator) -> CallLimits | None:
        """Make ``orc``'s ``ctx.http`` calls hold a slot per call of a limited tool."""
        if not self.tools:
            return None
        calls = CallLimits(orc.store, self.tools, owner=orc.owner, clock=orc.engine.cfg.clock, ttl=self.slot_ttl)
        orc.engine.tools.call_limits = calls
        return calls


# -- the command line's spelling ---------------------------------------------------------------------
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smh]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_count(text: str, what: str) -> tuple[str, int]:
    """``NAME=N`` -> (name, n)."""
    name, sep, value = text.rpartition("=")
    if not sep or not value.strip().isdigit():
        raise ConfigurationError(f"{what} {text!r} must look like NAME=N (e.g. emails=10)")
    return _name(name, what), _positive_int(int(value), f"{what} {text!r}")


def parse_rate(text: str, what: str) -> tuple[str, tuple[int, float]]:
    """``NAME=N/PERIOD`` (``emails=100/60s``, ``emails=10/s``, ``emails=500/1h``) -> (name, (n, seconds))."""
    name, sep, value = text.rpartition("=")
    found = _RATE.match(value) if sep else None
    if not found:
        raise ConfigurationError(f"{what} {text!r} must look like NAME=N/PERIOD (e.g. emails=100/60s, emails=10/s)")
    n = _positive_int(int(found.group(1)), f"{what} {text!r}")
    per = float(found.group(2) or 1) * _UNIT[found.group(3)]
    if per <= 0:
        raise ConfigurationError(f"{what} {text!r}: the period must be positive")
    return _name(name, what), (n, per)


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
    """Slots for in-flight calls per tool name, shared through the store (``store.slots.acquire``).

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
                before(name)
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
