"""Test doubles for the outside world of an agent, public because users' tests need them too.

    from orchestrator.testing import BookingService, ChatServer, reply, tool_call

* ``ChatServer``: a scripted OpenAI-compatible model server on 127.0.0.1 (``reply``,
  ``tool_call``, ``tool_calls``, ``error`` and ``Reply`` script its answers).
* ``FakeClock``: an injected clock and sleep that never waits (``Orchestrator(clock=..., sleep=...)``).
* ``BookingService``: a booking service on 127.0.0.1 that honours ``Idempotency-Key`` and keeps
  a ledger of its side effects; ``python -m orchestrator.testing.booking_service`` runs it as a
  process of its own.

Both are real HTTP servers speaking to real clients, not mocks: what a test sees is what a
production run would send.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator._lazy import lazy_exports

# Imported on first use rather than here: ``python -m orchestrator.testing.booking_service``
# imports this package first, and a package that had already imported the module it is about to
# run as ``__main__`` would make runpy warn (and hold two copies of the module).
_LAZY = {
    "FakeClock": "orchestrator.testing.clock",
    "BookingService": "orchestrator.testing.booking_service",
    "ChatServer": "orchestrator.testing.chatserver",
    "Reply": "orchestrator.testing.chatserver",
    "reply": "orchestrator.testing.chatserver",
    "tool_call": "orchestrator.testing.chatserver",
    "tool_calls": "orchestrator.testing.chatserver",
    "error": "orchestrator.testing.chatserver",
}

if TYPE_CHECKING:
    from orchestrator.testing.booking_service import BookingService
    from orchestrator.testing.chatserver import ChatServer, Reply, error, reply, tool_call, tool_calls
    from orchestrator.testing.clock import FakeClock

__all__ = ["BookingService", "ChatServer", "FakeClock", "Reply", "error", "reply", "tool_call", "tool_calls"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
