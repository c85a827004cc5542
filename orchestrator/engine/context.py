"""``StepContext``: what a step gets besides the state.

Time and randomness come from the Orchestrator's injected clock and random source, so tests
(freezegun, a fake clock) and replays see exact values.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from orchestrator.engine.services import DurableCalls, StepTools, ToolsForSteps

__all__ = ["CALL_SCOPE", "CallScope", "StepContext", "call_position", "current_step", "position_parts", "running"]

_log = logging.getLogger("agentsaga.step")

# The step whose function is running in this task or thread. For integrations that are called
# without the step's context in hand (an agent framework's durability capability, called from
# inside ``agent.run``), so the user does not have to thread ``ctx`` through a library that does not
# know about it. Set by the step runner only around the step function itself: a compensation, a
# check hook or code outside any step sees None.
# A weak reference: a context copied while the step runs (every callback asyncio registers, such as
# a connection's reader, keeps a copy for as long as it lives) must not keep the step alive.
_CURRENT: ContextVar["weakref.ref[StepContext] | None"] = ContextVar("agentsaga_current_step", default=None)


class CallScope:
    """A durable call being performed: whose it is (``owner``, the step attempt's durable calls),
    where it is (``position``), and what was made inside it so far.

    A call's position is its number in the step execution (an ``int``, as journals have always
    held it) or, for a call made while another one is performed, the enclosing call's position and
    its own number inside that call, dotted: ``"1.0"`` and ``"1.1"`` are the first two calls made
    inside call ``1``, ``"1.0.0"`` the first inside ``"1.0"``. A call answered from the journal is
    not performed, so the calls inside it are not made: numbering them under it keeps every later
    call's position what it was when they were journaled. Carried by a context variable, so each
    task (``asyncio.gather``) or thread given a copy of the context numbers under its own call.
    The owner is held weakly, as the current step is: a context copied while the call runs (a
    connection opened inside it keeps one) must not keep the step attempt alive.
    """

    __slots__ = ("_owner", "position", "calls", "timers", "waits", "replacing")

    def __init__(self, owner: object, position: int | str, replacing: bool) -> None:
        self._owner = weakref.ref(owner)
        self.position = position
        self.calls = 0
        self.timers = 0
        #: how many times each signal name was waited for inside this call
        self.waits: dict[str, int] = {}
        #: performed again because its request changed (``if_changed="perform"``): what was journaled
        #: inside it belongs to the request it replaces
        self.replacing = replacing

    def of(self, owner: object) -> bool:
        """Whether this is a call of ``owner`` (one step attempt's durable calls)."""
        return self._owner() is owner

    def next_call(self) -> str:
        n = self.calls
        self.calls += 1
        return f"{self.position}.{n}"

    def next_timer(self) -> str:
        n = self.timers
        self.timers += 1
        return f"{self.position}.{n}"

    def next_wait(self, name: str) -> str:
        """The number of the next wait for signal ``name`` inside this call: ``"1.0"`` for the first
        inside call ``1``, then ``"1.1"``, ... (counted per name, as top-level waits are)."""
        n = self.waits.get(name, 0)
        self.waits[name] = n + 1
        return f"{self.position}.{n}"


#: The durable call being performed in this task or thread, or None.
CALL_SCOPE: ContextVar[CallScope | None] = ContextVar("agentsaga_call", default=None)


def call_position(owner: object | None = None) -> int | str | None:
    """The position of the durable call being performed here (see ``CallScope``), or None outside
    one. What the call sends (an HTTP request's idempotency key) is a stable function of it. With
    ``owner``, only a call of those durable calls counts."""
    scope = CALL_SCOPE.get()
    if scope is None or (owner is not None and not scope.of(owner)):
        return None
    return scope.position


def position_parts(position: int | str) -> tuple[int, ...]:
    """``"1.10.2"`` -> ``(1, 10, 2)``; a top-level ``3`` (or ``"3"``) -> ``(3,)``. Sorting by it puts a
    call's inner calls right after it, in order (``1``, ``1.0``, ``1.1``, ``2``)."""
    return tuple(int(part) for part in str(position).split("."))


def current_step() -> "StepContext | None":
    """The ``StepContext`` of the step running in this task or thread, or None outside a step."""
    ref = _CURRENT.get()
    return ref() if ref is not None else None


class running:
    """``with running(ctx):`` makes ``ctx`` the current step for the code inside (what the step
    runner does). A class rather than a generator: it is held by every step while it waits."""

    __slots__ = ("ctx", "token")

    def __init__(self, ctx: "StepContext") -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        self.token = _CURRENT.set(weakref.ref(self.ctx))

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self.token)


class _Abandoned:
    """Whether one step attempt was abandoned (it timed out, or it was cancelled), and the check its
    outgoing calls make."""

    __slots__ = ("step", "attempt", "revoked", "cancelled")

    def __init__(self, step: str, attempt: int) -> None:
        self.step, self.attempt, self.revoked, self.cancelled = step, attempt, False, False

    def guard(self) -> None:
        if self.cancelled:
            import asyncio

            # A BaseException, as a cancellation is: a step's ``except Exception`` does not take it
            # for a failure of its call and go on.
            raise asyncio.CancelledError(f"step {self.step!r} attempt {self.attempt} was cancelled: nothing it does "
                                         "after that reaches the journal or leaves the process through ctx")
        if self.revoked:
            from orchestrator.errors import StepTimeoutError

            raise StepTimeoutError(f"step {self.step!r} attempt {self.attempt} timed out and was abandoned: nothing it "
                                   "does after that reaches the journal or leaves the process")


class StepContext:
    """Passed to every step as ``ctx``.

    - ``ctx.run_id``, ``ctx.workflow``, ``ctx.step``, ``ctx.attempt`` (1-based), ``ctx.tick``
    - ``ctx.trace(message, **data)``: a reasoning-trace entry, journaled with the step's output
    - ``ctx.now()``: the current time from the injected clock (an aware UTC datetime)
    - ``ctx.failure``: when this step was reached through a failure route, the error that led here
    - ``ctx.idempotency_key``: for an effect (and a compensation), a key stable across retries and
      recoveries: send it to the outside world so a re-sent call is recognised (None otherwise)
    - ``ctx.http`` / ``ctx.ahttp``: HTTP tool calls (sync / async, httpx underneath), each response
      journaled as it arrives (never sent twice by a re-run step, replayable), redacted, guarded by
      circuit breakers, sending the idempotency key for effects
    - ``ctx.durable_call(kind, request, perform)`` / ``await ctx.adurable_call(...)``: a call journaled
      the moment it returns and never performed twice for the same request (model calls); calls
      made while one is performed are numbered under it (``ctx.call_position``)
    - ``ctx.wait_for(name, timeout=None)``: the data of a signal, parking the run until it arrives
    - ``ctx.sleep(seconds)``: a durable timer that survives restarts
    - ``ctx.log``: a logger that tags records with the run and step
    - ``ctx.tools``: this attempt's tools, for integrations (model clients) that make calls of their own
    """

    # __weakref__: an integration may keep per-execution state keyed by the context (weakly, so it
    # goes with the step execution).
    __slots__ = ("run_id", "workflow", "step", "attempt", "tick", "failure", "_key", "_on_key", "_log", "_trace",
                 "_clock", "_t0", "_tools", "_make_tools", "_durable", "_abandoned", "__weakref__")

    def __init__(
        self,
        *,
        run_id: str,
        workflow: str,
        step: str,
        attempt: int,
        tick: int,
        clock: Callable[[], float],
        failure: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        tools: ToolsForSteps | None = None,
        durable: Callable[[StepContext], DurableCalls] | None = None,
        on_key: Callable[[], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.step = step
        self.attempt = attempt
        self.tick = tick
        self.failure = failure
        self._key = idempotency_key
        #: told when the key may leave the process (read, or sent by ctx.http): an effect journals it
        self._on_key = on_key
        # What the tools and durable calls this context makes are handed (``guard``, the key's hook)
        # holds no reference back to it: each step's context is freed when the step ends, not left
        # to the garbage collector as a cycle with the run it reaches.
        self._abandoned = _Abandoned(step, attempt)
        self._log: logging.LoggerAdapter[logging.Logger] | None = None
        self._tools: StepTools | None = None  # made on first use of ctx.http / ctx.ahttp / ctx.tools
        self._make_tools = tools
        # Made on first use too: most steps never wait or make durable calls. A compensation or a
        # check hook has none: its HTTP calls are plain calls.
        self._durable: Any = durable
        self._trace: list[dict[str, Any]] = []
        self._clock = clock
        self._t0 = time.perf_counter()

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry the run id and step (built on first use)."""
        if self._log is None:
            self._log = logging.LoggerAdapter(_log, {"run_id": self.run_id, "step": self.step})
        return self._log

    def trace(self, message: str, **data: Any) -> None:
        """Record why the step did what it did; journaled with the step's output."""
        entry: dict[str, Any] = {"msg": str(message), "ms": round((time.perf_counter() - self._t0) * 1000, 3)}
        if data:
            entry["data"] = data
        self._trace.append(entry)

    @property
    def idempotency_key(self) -> str | None:
        """This step execution's key: ``run:step:tick`` (``:r{epoch}`` after a rollback), the same on every
        retry and recovery of the execution. Reading it counts as sending it (see docs/sagas.md); an
        abandoned attempt of an effect step (timed out, cancelled) is refused it, as its calls are."""
        if self._key is not None and self._on_key is not None:
            self._abandoned.guard()
            self._on_key()
        return self._key

    def key_sent(self) -> None:
        """Tell the engine the key is about to leave the process (what ``ctx.http`` does)."""
        if self._key is not None and self._on_key is not None:
            self._abandoned.guard()
            self._on_key()

    def revoke(self) -> None:
        """This attempt was abandoned (it timed out): nothing it does may reach the journal or leave
        the process any more (see ``guard``)."""
        self._abandoned.revoked = True

    def cancel(self) -> None:
        """This attempt was cancelled (the task driving the run was): like ``revoke``, but what its
        calls raise from now on is ``asyncio.CancelledError``. For a sync step still running on a
        thread; an async step's cancellation already stopped it."""
        self._abandoned.cancelled = True

    @property
    def cancelled(self) -> bool:
        """Whether this attempt was cancelled (``cancel``)."""
        return self._abandoned.cancelled

    @property
    def guard(self) -> Callable[[], None]:
        """``guard()`` raises ``StepTimeoutError`` if this attempt was abandoned after its timeout,
        ``asyncio.CancelledError`` if it was cancelled."""
        return self._abandoned.guard

    @property
    def tools(self) -> StepTools:
        """This attempt's tools (what ``ctx.http`` and model clients use; their calls are journaled with it)."""
        if self._tools is None:
            if self._make_tools is None:
                raise RuntimeError(f"step {self.step!r}: tools (ctx.http, model calls) are only available inside a "
                                   "step run by an Orchestrator")
            durable = self._durable_calls() if self._durable is not None else None
            self._tools = self._make_tools.for_step(
                key=self._key, attempt=self.attempt, durable=durable,
                on_key=self._on_key if self._key is not None else None, before_send=self.guard)
        return self._tools

    @property
    def used_tools(self) -> StepTools | None:
        """The tools this attempt made, if it used any (for its journal event)."""
        return self._tools

    @property
    def http(self) -> Any:
        """Synchronous HTTP tool calls (``ctx.http.post(url, json=...)``), each response journaled."""
        return self.tools.http

    @property
    def ahttp(self) -> Any:
        """Async HTTP tool calls (``await ctx.ahttp.post(url, json=...)``), each response journaled."""
        return self.tools.ahttp

    def _durable_calls(self, what: str = "durable_call") -> Any:
        durable = self._durable
        if durable is None:
            raise RuntimeError(f"ctx.{what} is only available inside a step run by an Orchestrator")
        if callable(durable):  # built on first use
            durable = self._durable = durable(self)
        return durable

    def durable_call(self, kind: str, request: Any, perform: Any, *, if_changed: str = "raise",
                     effect: Any = None) -> Any:
        """Perform ``perform()`` once per step execution and request; journal its JSON response.

        A call that raised is journaled too and raised again (not performed) if this attempt runs
        again after a crash; a later attempt performs it anew. A request that differs from the one
        journaled at the same position raises ``CallChangedError`` unless ``if_changed="perform"``.
        ``effect(response)`` may return ``{"name", "key", "result"}``: the call then counts as an
        effect of its own, undone by the step's compensation if the run fails."""
        return self._durable_calls("durable_call").durable_call(kind, request, perform, if_changed=if_changed,
                                                                 effect=effect)

    def adurable_call(self, kind: str, request: Any, perform: Any, *, if_changed: str = "raise",
                      effect: Any = None) -> Awaitable[Any]:
        """The async twin of ``durable_call``: ``perform`` returns an awaitable; await the result.
        (It hands back the durable call's own coroutine rather than wrapping it in one more: each
        time a call wakes up, every coroutine around it is resumed.)"""
        return self._durable_calls("adurable_call").adurable_call(kind, request, perform,
                                                                  if_changed=if_changed, effect=effect)

    @property
    def call_position(self) -> int | str | None:
        """The position of this step's durable call being performed here (``2``, or ``"1.0"`` inside
        call 1; see ``CallScope``), or None when no call of this step is being performed: what a
        call made inside another one can build a stable name or key from."""
        durable = self._durable
        if durable is None or callable(durable):  # no durable call made yet
            return None
        return call_position(durable)

    def wait_for(self, name: str, timeout: float | None = None) -> Any:
        """Return signal ``name``'s data; until it is sent, the run waits (status ``waiting``)."""
        return self._durable_calls("wait_for").wait_for(name, timeout)

    def sleep(self, seconds: float) -> None:
        """Sleep durably: the run parks and wakes after ``seconds``, even across restarts."""
        self._durable_calls("sleep").sleep(seconds)

    def now(self) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(self._clock(), tz=_dt.timezone.utc)

    @property
    def traces(self) -> list[dict[str, Any]]:
        return list(self._trace)

    def __repr__(self) -> str:
        return f"<StepContext run={self.run_id!r} step={self.step!r} attempt={self.attempt}>"
