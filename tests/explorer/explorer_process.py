"""The explorer's simulated process: the crash points it passes, and the ``Plan`` that says where it dies.

A *process* here is one ``Orchestrator`` with a store of its own (its own connections) and a
``Process`` object that counts the crash points it passes: before and after every durable write at
the store boundary (explorer_store.py), and around every outgoing HTTP request (explorer_calls.py).

A ``Plan`` says what happens at point ``k``: the process *dies* (``ProcessDied``, a
``BaseException`` no user code catches; every later write, request or ledger entry of that
process, from any thread it left behind, raises it again: it is fenced off for good), it is
SIGKILLed (the child of the SIGKILL sample), or a store write *faults* once (``raise``: the
write fails and nothing is written; ``lost``: the write commits but its caller hears an error)
while the process lives on.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

T0 = 1_800_000_000.0
#: The explorer's lease: long, so that no heartbeat is needed while a run is driven (heartbeats are
#: hourly); a successor that recovers instead of resuming moves the clock past it.
LEASE_TTL = 7200.0

#: The simulated process the current thread (or task) belongs to; copied into step threads.
CURRENT: ContextVar[Process | None] = ContextVar("explorer_process", default=None)


class ProcessDied(BaseException):
    """The simulated death of a process at a crash point: nothing after it runs in that process."""


@dataclass(frozen=True)
class Plan:
    """What happens at crash point ``at``: ``crash`` (die) or ``kill`` (SIGKILL); or at the ``at``-th
    store write: ``raise`` (it fails, nothing written) or ``lost`` (it commits, its caller hears it failed).

    With ``target`` instead of ``at`` (the runs of a group, whose points interleave as the scheduler
    lets them), the moment is named, not counted: the ``nth`` point that answers to ``target``, such
    as ``before r2 StepCompleted:reserve`` (the write that carries that append of run r2, grouped
    with other runs' or alone) or ``send POST /cars?run=r2``. Group writes have two more faults:
    ``item`` (the targeted run's appends in the batch get an error verdict, the others commit) and
    ``fence`` (another process takes the targeted run's lease over just before the write); and
    ``behind``: the group write is held until another append of the targeted run has been queued
    behind it in the group committer, then fails whole (that later append must not be written)."""

    at: int | None = None
    what: str = "crash"
    target: str | None = None
    nth: int = 1

    def __post_init__(self) -> None:
        if self.what not in ("crash", "kill", "raise", "lost", "item", "fence", "behind"):
            raise ValueError(f"Plan.what must be crash, kill, raise, lost, item, fence or behind, got {self.what!r}")


class Process:
    """One simulated process: the crash points it passed, in order, and whether it is dead."""

    def __init__(self, name: str, plan: Plan = Plan()) -> None:
        self.name = name
        self.plan = plan
        self.points: list[str] = []
        self.dead: str | None = None
        self.faulted: str | None = None
        #: store writes begun (what a fault's ``at`` counts)
        self.writes = 0
        self.store: Any = None
        #: labels name the run each point belongs to (a group of runs driven together)
        self.tag_runs = False
        #: the keys of every point passed, in order (what a targeted plan is matched against)
        self.keys: list[tuple[str, ...]] = []
        self._hits = 0
        #: the seqs, per run tag, of the append a fault hit (what must, or must not, have been written)
        self.fault_items: dict[str, list[int]] = {}
        #: a one-run fault (``item``, ``fence``) that met a write other than an append failed it whole
        self.fault_whole = False
        #: appends handed to the group committer, per run tag (see ``watch_committer``)
        self.queued: Counter[str] = Counter()
        self.queued_changed = threading.Condition()
        #: whether a ``behind`` fault saw a later append of its run queued before it failed the write
        self.behind: bool | None = None
        #: told of each request about to leave (after its ``send`` point): ``(process, method, url, key)``
        self.on_send: Any = None
        #: seconds of the event loop's clock that making the process's SSL context (its first HTTP
        #: client) costs, as on a loaded machine (explorer_calls), and whether it was made
        self.first_context_cost = 0.0
        self.context_made = False
        self._lock = threading.Lock()

    def fence(self) -> None:
        if self.dead is not None:
            raise ProcessDied(f"process {self.name} died at {self.dead}: nothing it runs acts any more")

    def point(self, label: str, keys: tuple[str, ...] | None = None) -> int:
        """Pass one crash point (``keys``: the names a targeted plan may give it, by default its label);
        dies here when the plan says so. Returns the point's number."""
        with self._lock:
            self.fence()
            self.points.append(label)
            keys = keys or (label,)
            self.keys.append(keys)
            k = len(self.points)
            if self.plan.target is not None and self.plan.target in keys and self.plan.what in ("crash", "kill"):
                self._hits += 1
                hit = self._hits == self.plan.nth
            else:
                hit = k == self.plan.at
            if hit and self.plan.what in ("crash", "kill"):
                self.dead = f"point {k} ({label})"
                if self.plan.what == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise ProcessDied(f"process {self.name} died at point {k}: {label}")
            return k

    def fault_here(self, k: int) -> str | None:
        """The fault planned for the store write at point ``k`` (``raise`` / ``lost``), once. A fault's
        ``at`` counts store writes, not crash points (their number does not depend on how threads
        interleave with outgoing calls)."""
        with self._lock:
            self.writes += 1
            if self.plan.what in ("crash", "kill") or self.faulted is not None:
                return None
            if self.plan.target is not None:
                if self.plan.target not in self.keys[k - 1]:
                    return None
                self._hits += 1
                hit = self._hits == self.plan.nth
            else:
                hit = self.writes == self.plan.at
            if hit:
                self.faulted = f"write {self.writes}, point {k} ({self.points[k - 1]})"
                return self.plan.what
        return None
