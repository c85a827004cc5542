"""The cyclic garbage collector while runs are driven.

A run in flight holds a few dozen container objects for each step it is running (the step's
coroutines, its context, the event on its way to the journal, the call's connection), for as long as
the step waits on the outside world: tens of milliseconds at least. With hundreds of runs at once in
one process, almost everything the collector finds in its youngest generation is still alive: each
collection walks it, promotes it, and the older generations fill with objects that reference counting
frees anyway once their step is done, until a full collection walks the whole heap. Measured at 1,000
concurrent runs of 8 steps (``bench/agents.py``), the collector took a fifth of the wall time of the
model-call op and found next to nothing to collect.

So while at least one run is driven in this process, the youngest generation's threshold is raised
to ``young`` net allocations (``gc.set_threshold``), if it was lower; when the last drive of the
process ends, the thresholds found before are put back, unless something else changed them
meanwhile (then they are left as that code set them). Cyclic garbage is still collected, in batches
of that size: the cost is at most that many more young container objects alive at a time.
``Orchestrator(gc_young=None)`` leaves the collector alone.
"""

from __future__ import annotations

import gc
import os
import threading

__all__ = ["COLLECTOR", "Collector"]


class Collector:
    """Counts the drives of this process (all Orchestrators share one) and sets the collector's
    thresholds for as long as there is one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drives = 0
        self._before: tuple[int, ...] | None = None  # the thresholds to put back
        self._ours: tuple[int, ...] | None = None    # the thresholds this set

    def enter(self, young: int | None) -> None:
        """A drive starts; ``young`` None: this drive asks nothing of the collector."""
        if young is None:
            return
        with self._lock:
            self._drives += 1
            now = gc.get_threshold()
            if self._ours is None and now[0] < young:
                self._before, self._ours = now, (young, *now[1:])
                gc.set_threshold(*self._ours)

    def leave(self, young: int | None) -> None:
        """A drive that entered with the same ``young`` ended."""
        if young is None:
            return
        with self._lock:
            self._drives -= 1
            if self._drives or self._ours is None:
                return
            if gc.get_threshold() == self._ours:
                gc.set_threshold(*self._before)  # type: ignore[misc]
            self._before = self._ours = None

    def forget(self) -> None:
        """In a forked child: no drive of the parent goes on here, so the thresholds are put back as
        the last drive's end would have put them."""
        self._lock = threading.Lock()
        self._drives = 0
        if self._ours is not None and gc.get_threshold() == self._ours:
            gc.set_threshold(*self._before)  # type: ignore[misc]
        self._before = self._ours = None


#: the process's one collector policy
COLLECTOR = Collector()
os.register_at_fork(after_in_child=COLLECTOR.forget)
