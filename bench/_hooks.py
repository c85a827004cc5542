"""What every engine's step does, identically, so the workloads differ only in the engine.

A step turns ``n`` into ``{"n": n + 1, "pad": PAD}``: about 60 bytes as JSON with the default pad,
about 1 KB with ``set_pad(1000)``. In crash and resume runs a ``Hook`` is installed: it kills the
process with SIGKILL when step ``kill_at`` begins (so exactly ``kill_at - 1`` steps have returned),
notes when the first step of a process begins (the "first new step" after a resume), and appends
each finished step's number to a ledger file outside every database, so the parent can count steps
that ran twice. With no hook installed a step costs one attribute read more than a bare function.
"""

from __future__ import annotations

import os
import signal
import time

PAD = "x" * 40
HOOK: "Hook | None" = None


def set_pad(length: int) -> None:
    global PAD
    PAD = "x" * length


class Hook:
    def __init__(self, *, kill_at: int | None = None, ledger: str | None = None) -> None:
        self.kill_at = kill_at
        self.first_wall: float | None = None
        self.first_perf: float | None = None
        self.executed = 0
        # O_APPEND + os.write: the line is in the kernel before the step returns, so SIGKILL loses
        # nothing that the step finished (no fsync: the machine does not crash, only the process).
        self._fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if ledger else None

    def begin(self, n: int) -> None:
        if self.first_perf is None:
            self.first_perf = time.perf_counter()
            self.first_wall = time.time()
        if n == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def end(self, n: int) -> None:
        self.executed += 1
        if self._fd is not None:
            os.write(self._fd, b"%d\n" % n)


def step_body(n: int) -> dict:
    """The trivial step: returns the next counter value and the pad."""
    hook = HOOK
    if hook is not None:
        hook.begin(n + 1)
    out = {"n": n + 1, "pad": PAD}
    if hook is not None:
        hook.end(n + 1)
    return out


def read_ledger(path: str) -> list[int]:
    try:
        with open(path) as fh:
            return [int(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []
