"""The sync API's bridge: run one of the Orchestrator's coroutines to its end from plain code."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, refused inside a running event loop (use the a-prefixed twin there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        in_loop = False
    else:
        in_loop = True
    if in_loop:
        coro.close()
        raise RuntimeError("called the sync Orchestrator API inside a running event loop (an async function, a "
                           "notebook); use the a-prefixed twin there: await orc.arun(...), await orc.aresume(...)")
    # Outside the except block: an error from the run is not chained to "no running event loop".
    return asyncio.run(coro)
