"""The engine's settings (``EngineConfig``) and this process's name in leases, apart from the engine
itself: the Orchestrator checks its settings when it is made, and builds the engine on first use."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["DEFAULT_GC_YOUNG", "EngineConfig", "default_owner"]

#: the collector's youngest-generation threshold while runs are driven (``engine/collector.py``; the
#: interpreter's default is 700)
DEFAULT_GC_YOUNG = 10_000


def default_owner() -> str:
    """This process's name in leases: ``host:pid:random`` (the pid tells a dead owner on this host)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's settings and injected time, sleep and randomness (see ``Orchestrator``)."""

    owner: str
    snapshot_every: int = 100
    keep_snapshots: int = 3
    #: incremental snapshots, a full one every N (None: all full), for workflows without a policy
    incremental_snapshots: int | None = 10
    lease_ttl: float = 30.0
    #: how often held leases are renewed (None: lease_ttl / 3)
    heartbeat: float | None = None
    allow_graph_change: bool = False
    #: the HMAC key savepoints are signed with, and that a savepoint must be signed with to be restored
    signing_key: bytes | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)
    #: the collector's youngest-generation threshold while runs are driven (None: leave it alone)
    gc_young: int | None = DEFAULT_GC_YOUNG
