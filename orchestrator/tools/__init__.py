"""The outside world from inside a step: the HTTP tool behind ``ctx.http``, circuit breakers shared
through the store, and cluster-wide limits on in-flight calls.

httpx is imported when a step first makes a call (or when ``HttpTool`` is first named here), not by
every process that imports the engine: a process that only resumes or reads runs never pays for it.
"""

from typing import Any

from orchestrator.tools.breakers import StoreBreakers
from orchestrator.tools.limits import CallLimits, ToolLimits
from orchestrator.tools.toolbox import StepTools, ToolBox

__all__ = [
    "HttpTool",
    "AsyncHttpTool",
    "parse_retry_after",
    "StoreBreakers",
    "ToolLimits",
    "CallLimits",
    "ToolBox",
    "StepTools",
]

_ON_FIRST_USE = {"HttpTool", "AsyncHttpTool", "parse_retry_after"}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'orchestrator.tools' has no attribute {name!r}")
    from orchestrator.tools import http

    value = getattr(http, name)
    globals()[name] = value
    return value
