"""The tools steps use to reach the outside world: one ``ToolBox`` per Orchestrator, and the
``StepTools`` of each step attempt.

``ToolBox`` holds what every step shares: the pooled HTTP clients (one sync, one async per event
loop: ``orchestrator.tools.clients``), the redactor, the store-backed
circuit breakers with their declared settings, cluster-wide call limits, and the journal's body
bound. ``StepTools`` is what one attempt did to the outside world: the HTTP requests it made
(``calls``) and the breaker transitions it caused (``transitions``), journaled with the attempt's
outcome. ``ctx.http`` is an ``HttpTool`` bound to the attempt: its idempotency key, its breakers
and, inside a step, its durable calls (a re-run step reuses journaled responses); that
``HttpTool`` is the one layer between ``ctx.http`` and httpx.

Every request carries the step's idempotency key, as a stable function of its position: request
``i`` of a step execution (``i`` counts every durable call of the execution: model calls, tool
calls, HTTP requests) sends ``ctx.idempotency_key`` for ``i == 0`` and ``f"{key}:{i}"`` after, the
same on every retry and recovery, whichever earlier requests were answered from the journal. A
request made inside another durable call (``ctx.http`` in a tool of the tool loop) has a dotted
position, ``"1.0"`` for the first inside call 1, and sends ``f"{key}:1.0"``, as stable.
Outside a durable execution (a compensation, an effect tool's own requests) requests are numbered
in the order they are sent. An explicit ``Idempotency-Key`` header wins.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from compensations import BreakerConfig, BreakerRegistry, default_breakers
from orchestrator.engine.context import call_position
from orchestrator.engine.services import DurableCalls
from orchestrator.errors import PermanentToolError
from orchestrator.payload.redact import Redactor
from orchestrator.tools.breakers import StoreBreakers

if TYPE_CHECKING:  # httpx is imported when a step first makes a call, not by every process
    from orchestrator.tools.http import AsyncHttpTool, HttpTool

__all__ = ["ToolBox", "StepTools"]


class ToolBox:
    """Shared by all steps of an Orchestrator (see the module docstring)."""

    def __init__(self, *, breakers: StoreBreakers, breaker_settings: BreakerRegistry | None = None,
                 redactor: Redactor | None = None, clock: Callable[[], float], max_body: int = 8192,
                 call_limits: Any = None) -> None:
        self.breakers = breakers
        self.breaker_settings = breaker_settings or default_breakers
        self.redactor = redactor or Redactor()
        self.clock = clock
        self.max_body = max_body
        #: cluster-wide limits on in-flight calls per tool (``orchestrator.tools.limits.CallLimits``), or None
        self.call_limits = call_limits
        self._client: Any = None
        self._aclients: Any = None  # orchestrator.tools.clients.LoopClients, made on first use
        self._lock = threading.Lock()
        #: whether ``warm()`` ran (the engine asks before each timed attempt: a plain read)
        self.warmed = False

    def warm(self) -> None:
        """Make what a step's first HTTP call would otherwise make, once per ToolBox: import httpx and
        the HTTP tool, build the process's SSL context (loading the CA bundle) and the shared sync
        client. Blocking: the engine runs it on a thread before it starts the timer of an attempt of
        a step with a timeout, so an attempt is never charged for it (on a loaded machine it has
        taken longer than a step's timeout). An async client is bound to its event loop and is
        made there on first use; with the SSL context made, that costs a fraction of a millisecond.

        A failure here is left to the step's own first call, which meets it again and journals it."""
        if self.warmed:
            return
        try:
            import orchestrator.tools.http  # noqa: F401 (httpx, the wire transport, the tool itself)
            from orchestrator.tools.clients import ssl_context

            ssl_context()
            self.client  # noqa: B018 (built under the lock, shared by the sync steps)
        finally:
            self.warmed = True

    @property
    def client(self) -> Any:
        """One sync httpx client for all steps (connection pooling; building one costs milliseconds)."""
        with self._lock:  # sync steps run on threads: two may make the first call at once
            if self._client is None:
                import httpx

                from orchestrator.tools.clients import client_options

                self._client = httpx.Client(**client_options())
            return self._client

    def async_client(self) -> Any:
        """The running event loop's httpx.AsyncClient, shared by every async step on that loop
        (``ctx.ahttp``, ``AsyncLLM``): one pool of kept-alive connections per loop."""
        return self._loop_clients().get()

    def async_pair(self) -> tuple[Any, Any]:
        """``async_client()`` and the transport under it (``orchestrator.tools.wire.WireTransport``),
        for ``AsyncLLM``'s calls, which skip the client's layer; the transport is None when requests
        go through a proxy."""
        return self._loop_clients().pair()

    def _loop_clients(self) -> Any:
        aclients = self._aclients
        if aclients is not None:  # (set once, under the lock; cleared only by close())
            return aclients
        with self._lock:
            if self._aclients is None:
                from orchestrator.tools.clients import LoopClients

                self._aclients = LoopClients()
            return self._aclients

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            aclients, self._aclients = self._aclients, None
            self.warmed = False  # (a later call makes a new client)
        if client is not None:
            client.close()
        if aclients is not None:
            aclients.close()
        if self.call_limits is not None:
            self.call_limits.close()

    def for_step(self, *, key: str | None, attempt: int, durable: DurableCalls | None,
                 on_key: Callable[[], None] | None = None,
                 before_send: Callable[[], None] | None = None) -> StepTools:
        return StepTools(self, key=key, attempt=attempt, durable=durable, on_key=on_key, before_send=before_send)

    def breaker_config(self, breaker: str | BreakerConfig) -> BreakerConfig:
        return self.breaker_settings.config_for(breaker) if isinstance(breaker, str) else breaker


class StepTools:
    """The tools of one step attempt, and what they recorded (see the module docstring)."""

    def __init__(self, box: ToolBox, *, key: str | None, attempt: int, durable: DurableCalls | None,
                 on_key: Callable[[], None] | None = None, before_send: Callable[[], None] | None = None) -> None:
        self.box = box
        self.key = key
        self.attempt = attempt
        self.durable = durable
        #: told before the key first leaves the process (an effect journals it)
        self.on_key = on_key
        #: asked before each request is sent (raises for an abandoned attempt)
        self.before_send = before_send
        self.calls: list[dict[str, Any]] = []
        self.transitions: list[dict[str, Any]] = []
        self._made = 0
        self._http: HttpTool | None = None
        self._ahttp: AsyncHttpTool | None = None

    def with_key(self, key: str) -> StepTools:
        """Tools of the same attempt sending another idempotency key (an effect tool of the tool loop,
        itself a durable call: its requests are plain calls), recorded apart for the caller to merge."""
        return StepTools(self.box, key=key, attempt=self.attempt, durable=None, on_key=self.on_key,
                         before_send=self.before_send)

    @property
    def redactor(self) -> Redactor:
        return self.box.redactor

    def breaker_hooks(self, config_for: Callable[[str], BreakerConfig] | None = None) -> tuple[Any, Any]:
        """``(before(name), after(name, ok))`` over the shared breakers, recording transitions here."""
        return self.box.breakers.hooks(config_for or self.box.breaker_settings, self.transitions.append)

    def _next_key(self) -> str | None:
        if self.key is None:
            return None
        position = call_position(self.durable) if self.durable is not None else None
        if position is None:
            position = self._made
            self._made += 1
        if self.on_key is not None:
            self.on_key()
        return self.key if position == 0 else f"{self.key}:{position}"

    def _keep(self, record: dict[str, Any]) -> None:
        """Keep a request's record for the attempt's journal event. A request made as a durable call
        (``ctx.http`` in a step) is journaled as that call too (``CallCompleted``/``CallFailed``): its
        record carries the call's position (``index``), so a reader pairs the two and shows the
        request once (``orchestrator.audit.summary``)."""
        if self.durable is not None:
            position = call_position(self.durable)
            if position is not None:
                record["index"] = position
        self.calls.append(record)

    def _options(self, is_async: bool) -> dict[str, Any]:
        box = self.box
        # ctx.ahttp: breaker reads off the event loop, shared by the requests in flight
        hooks = box.breakers.ahooks(box.breaker_settings, self.transitions.append) if is_async \
            else self.breaker_hooks()
        if box.call_limits is not None:  # hold one of the tool's slots from before the call to after it
            hooks = box.call_limits.wrap(hooks, is_async=is_async)
        return {
            "journal": self._keep,
            "idempotency_key": self._next_key,
            "breaker": hooks,
            "redactor": box.redactor,
            "max_body": box.max_body,
            "attempt": lambda: self.attempt,
            "clock": box.clock,
            "durable": self.durable,
            "before_send": self.before_send,
        }

    @property
    def http(self) -> HttpTool:
        """``ctx.http``: synchronous HTTP calls (see ``orchestrator.tools.http``)."""
        if self._http is None:
            from orchestrator.tools.http import HttpTool

            self._http = HttpTool(client=self.box.client, **self._options(is_async=False))
        return self._http

    @property
    def ahttp(self) -> AsyncHttpTool:
        """``ctx.ahttp``: asynchronous HTTP calls."""
        if self._ahttp is None:
            from orchestrator.tools.http import AsyncHttpTool

            try:
                asyncio.get_running_loop()
            except RuntimeError:  # not on a loop (a sync step): a client of its own, closed by aclose()
                self._ahttp = AsyncHttpTool(**self._options(is_async=True))
            else:
                self._ahttp = AsyncHttpTool(client=self.box.async_client(), **self._options(is_async=True))
        return self._ahttp

    async def guard(self, breaker: str | BreakerConfig, call: Callable[[], Awaitable[Any]]) -> Any:
        """A step with ``breaker=``: fail fast while its breaker is open; feed it the outcome."""
        breakers = self.box.breakers
        config = self.box.breaker_config(breaker)
        transition = breakers.before_call(config)  # raises CircuitOpenError when open
        if transition is not None:
            self.transitions.append(transition)
        try:
            result = await call()
        except Exception as exc:
            # A permanent tool error means the tool answered: the caller was wrong, not the tool.
            transition = breakers.after_call(config, isinstance(exc, PermanentToolError))
            if transition is not None:
                self.transitions.append(transition)
            raise
        transition = breakers.after_call(config, True)
        if transition is not None:
            self.transitions.append(transition)
        return result

    async def aclose(self) -> None:
        if self._ahttp is not None:
            await self._ahttp.aclose()
