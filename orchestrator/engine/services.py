"""What the engine asks of the outside world, as protocols: the engine knows no HTTP.

The Orchestrator hands the engine an object that makes a step attempt's tools (``ctx.http``,
``ctx.ahttp``, step breakers); ``orchestrator.tools.ToolBox`` is the one it uses. Keeping this a
protocol is what lets ``engine/`` import nothing above it (see the import contracts in
pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["StepTools", "ToolsForSteps", "DurableCalls", "NotJournaled"]


class NotJournaled(Exception):  # noqa: N818 (an outcome, not an error)
    """Raised by a durable call's ``perform`` to hand its outcome (``value``) back to its caller
    without journaling it: the call succeeded, but what it returned is not to be kept (an HTTP
    response larger than the journal keeps). The call journals nothing, neither its completion nor
    a failure, so when the step runs again the call is made again at the same position (an HTTP
    request with the same idempotency key), and the calls after it keep their numbers."""

    def __init__(self, value: Any, why: str) -> None:
        self.value = value
        super().__init__(why)


class DurableCalls(Protocol):
    """A step execution's durable calls (``ctx.durable_call`` / ``ctx.adurable_call``)."""

    def durable_call(self, kind: str, request: Any, perform: Callable[[], Any], *, if_changed: str = "raise",
                     effect: Any = None) -> Any: ...

    async def adurable_call(self, kind: str, request: Any, perform: Callable[[], Awaitable[Any]], *,
                            if_changed: str = "raise", effect: Any = None) -> Any: ...


class StepTools(Protocol):
    """The tools of one step attempt, and what they recorded for its journal event."""

    #: one record per HTTP request the attempt made (journaled with the attempt's outcome)
    calls: list[dict[str, Any]]
    #: breaker transitions the attempt caused (journaled likewise)
    transitions: list[dict[str, Any]]

    @property
    def http(self) -> Any: ...

    @property
    def ahttp(self) -> Any: ...

    async def guard(self, breaker: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``call`` behind the step's circuit breaker (a name or a BreakerConfig)."""
        ...

    async def aclose(self) -> None: ...


class ToolsForSteps(Protocol):
    """Makes each step attempt's tools; closed with the Orchestrator."""

    #: whether ``warm()`` has run (then a step's first call makes nothing the process shares)
    warmed: bool

    def warm(self) -> None:
        """Make now what the first call of any step would otherwise make, once: the shared clients
        (importing the HTTP library, loading the CA bundle into the SSL context). Blocking, and safe
        to call from several threads at once; the engine calls it off the event loop before the timer
        of an attempt of a step with a timeout, so that one-time cost is never charged to an attempt."""
        ...

    def for_step(self, *, key: str | None, attempt: int, durable: DurableCalls | None,
                 on_key: Callable[[], None] | None = None,
                 before_send: Callable[[], None] | None = None) -> StepTools:
        """``on_key`` is told before the key leaves the process; ``before_send`` is asked before each send."""
        ...

    def close(self) -> None: ...
