"""Bulkheads: how much runs in parallel, per queue and per tool, across the whole cluster.

Settings are small frozen values, checked when they are made (a bad limit fails at start, with
the setting named, never mid-run):

```python
from orchestrator.scale import Limits, QueueLimit, Worker
limits = Limits(
    queues={"emails": QueueLimit(concurrency=20, worker_concurrency=4, rate=(100, 60.0))},
    tools={"api.openai.com": 8, "payments": 2},   # in-flight calls, by breaker/tool name
)
Worker(url, ["app.flows:signup"], concurrency=8, limits=limits).run()
```

- ``QueueLimit.concurrency``: runs of the queue leased at once, by all workers together. Enforced
  by the claim itself: a lease *is* an in-flight run, so a worker
  that dies frees its share when its leases expire, and nothing has to be kept in step.
- ``QueueLimit.worker_concurrency``: runs of the queue one worker drives at once.
- ``QueueLimit.rate``: ``(n, seconds)``: at most n runs of the queue handed to workers in any
  window of that many seconds (a sliding window kept in the database).
- ``tools``: in-flight HTTP calls per tool name, across the cluster (``orchestrator.tools.limits``:
  a worker passes them to its Orchestrator as ``tool_limits``).

Every worker serving a limited queue must be given the same limits: they are agreed through the
database, but declared in code (as DBOS declares its queues). ``orc.recover()`` and
``orc.resume()`` do not go through queue limits; tool limits apply to every run an Orchestrator
made with ``tool_limits`` drives.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.errors import ConfigurationError
from orchestrator.tools.limits import ToolLimits, check_name, positive_int

__all__ = ["QueueLimit", "Limits", "parse_count", "parse_rate"]

_log = logging.getLogger("agentsaga.limits")


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """Limits of one queue: ``concurrency`` (cluster-wide), ``worker_concurrency`` (per worker),
    ``rate`` ``(n, seconds)``. None means unlimited."""

    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate: tuple[int, float] | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            positive_int(self.concurrency, "QueueLimit.concurrency")
        if self.worker_concurrency is not None:
            positive_int(self.worker_concurrency, "QueueLimit.worker_concurrency")
        if self.rate is not None:
            if not isinstance(self.rate, tuple) or len(self.rate) != 2:
                raise ConfigurationError(f"QueueLimit.rate must be a pair (runs, seconds), got {self.rate!r}")
            n, per = self.rate
            positive_int(n, "QueueLimit.rate's run count")
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
            check_name(name, "a queue name in Limits.queues")
            if not isinstance(limit, QueueLimit):
                raise ConfigurationError(f"Limits.queues[{name!r}] must be a QueueLimit, got {limit!r}")
        if not isinstance(self.tools, Mapping):
            raise ConfigurationError(f"Limits.tools must map tool names to a number of calls, got {self.tools!r}")
        for name, n in self.tools.items():
            check_name(name, "a tool name in Limits.tools")
            positive_int(n, f"Limits.tools[{name!r}]")
        if isinstance(self.slot_ttl, bool) or not isinstance(self.slot_ttl, (int, float)) or self.slot_ttl <= 0:
            raise ConfigurationError(f"Limits.slot_ttl must be a positive number of seconds, got {self.slot_ttl!r}")
        object.__setattr__(self, "queues", dict(self.queues))
        object.__setattr__(self, "tools", dict(self.tools))

    @property
    def tool_limits(self) -> ToolLimits | None:
        """The in-flight call limits, for ``Orchestrator(tool_limits=...)`` (None when there are none)."""
        return ToolLimits(self.tools, slot_ttl=self.slot_ttl) if self.tools else None


# -- the command line's spelling ---------------------------------------------------------------------
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smh]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_count(text: str, what: str) -> tuple[str, int]:
    """``NAME=N`` -> (name, n)."""
    name, sep, value = text.rpartition("=")
    if not sep or not value.strip().isdigit():
        raise ConfigurationError(f"{what} {text!r} must look like NAME=N (e.g. emails=10)")
    return check_name(name, what), positive_int(int(value), f"{what} {text!r}")


def parse_rate(text: str, what: str) -> tuple[str, tuple[int, float]]:
    """``NAME=N/PERIOD`` (``emails=100/60s``, ``emails=10/s``, ``emails=500/1h``) -> (name, (n, seconds))."""
    name, sep, value = text.rpartition("=")
    found = _RATE.match(value) if sep else None
    if not found:
        raise ConfigurationError(f"{what} {text!r} must look like NAME=N/PERIOD (e.g. emails=100/60s, emails=10/s)")
    n = positive_int(int(found.group(1)), f"{what} {text!r}")
    per = float(found.group(2) or 1) * _UNIT[found.group(3)]
    if per <= 0:
        raise ConfigurationError(f"{what} {text!r}: the period must be positive")
    return check_name(name, what), (n, per)
