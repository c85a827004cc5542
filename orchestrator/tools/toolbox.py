"""What a step's context hands out for the outside world: ``ctx.http`` / ``ctx.ahttp``.

Each step execution gets its own tool instance, so every request it makes is collected for that
step's journal event (``calls``), and breaker transitions it causes are collected too
(``breakers``). An effect step's requests carry its idempotency key: the first request sends
``ctx.idempotency_key`` itself, the n-th (n >= 1) sends ``f"{key}:{n}"``, so a step that makes
several calls gives each a stable key of its own across retries and recoveries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compensations import BreakerRegistry, default_breakers
from typing import TYPE_CHECKING

from orchestrator.tools.breakers import StoreBreakers
from orchestrator.payload.redact import Redactor

if TYPE_CHECKING:  # httpx is imported when a step first makes a call, not by every process
    from orchestrator.tools.http import AsyncHttpTool, HttpTool

__all__ = ["Tools", "StepTools"]


class Tools:
    """Shared by all steps of an Orchestrator: the redactor, breakers and HTTP options."""

    def __init__(self, *, breakers: StoreBreakers, registry: BreakerRegistry | None, redactor: Redactor,
                 clock: Callable[[], float], max_body: int = 8192) -> None:
        self.breakers = breakers
        self.registry = registry or default_breakers
        self.redactor = redactor
        self.clock = clock
        self.max_body = max_body
        self._client: Any = None
        #: cluster-wide limits on in-flight calls per tool (orchestrator.scale.limits.CallLimits), or None
        self.call_limits: Any = None

    @property
    def client(self) -> Any:
        """One sync httpx client for all steps (connection pooling; building one costs milliseconds)."""
        if self._client is None:
            import httpx

            from orchestrator.tools.http import DEFAULT_TIMEOUT

            self._client = httpx.Client(timeout=DEFAULT_TIMEOUT)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def for_step(self, key: str | None, attempt: int) -> StepTools:
        return StepTools(self, key, attempt)


class StepTools:
    """The tools of one step attempt, and what they recorded."""

    def __init__(self, tools: Tools, key: str | None, attempt: int) -> None:
        self.tools = tools
        self.key = key
        self.attempt = attempt
        self.calls: list[dict[str, Any]] = []
        self.transitions: list[dict[str, Any]] = []
        self._made = 0
        self._http: HttpTool | None = None
        self.durable_http: Any = None  # what ctx.http hands out (see orchestrator/tools/durable_http.py)
        self.durable_ahttp: Any = None
        self._ahttp: AsyncHttpTool | None = None

    def _next_key(self) -> str | None:
        if self.key is None:
            return None
        n = self._made
        self._made += 1
        return self.key if n == 0 else f"{self.key}:{n}"

    def _options(self, is_async: bool = False) -> dict[str, Any]:
        t = self.tools
        hooks = t.breakers.hooks(t.registry, self.transitions.append)
        if t.call_limits is not None:  # hold one of the tool's slots from before the call to after it
            hooks = t.call_limits.wrap(hooks, is_async=is_async)
        return {
            "journal": self.calls.append,
            "idempotency_key": self._next_key,
            "breaker": hooks,
            "redactor": t.redactor,
            "max_body": t.max_body,
            "attempt": lambda: self.attempt,
            "clock": t.clock,
        }

    @property
    def http(self) -> HttpTool:
        if self._http is None:
            from orchestrator.tools.http import HttpTool

            self._http = HttpTool(client=self.tools.client, **self._options())
        return self._http

    @property
    def ahttp(self) -> AsyncHttpTool:
        if self._ahttp is None:
            from orchestrator.tools.http import AsyncHttpTool

            self._ahttp = AsyncHttpTool(**self._options(is_async=True))
        return self._ahttp

    async def aclose(self) -> None:
        if self._ahttp is not None:
            await self._ahttp.aclose()
