"""SIGTERM and SIGINT while ``agentsaga worker`` starts: an orderly exit, not death by the signal.

A worker takes minutes to be useful to nobody and seconds to start: importing the engine, the
app's modules (which may load a model), opening the database (which may retry a server that is
restarting). An orchestrator (systemd, Kubernetes, a supervisor) may send SIGTERM at any of those
moments. Until the worker exists, ``catch_while_starting`` makes either signal raise
``StopRequested``, which ends start-up wherever it is; ``agentsaga`` then says so and exits 0.
Nothing was claimed yet, so no lease is held. Once it exists, ``hand_to(worker.stop)`` makes the
same handlers stop the worker (stop claiming, drain, hand back; a second signal skips the drain),
with no moment between the two where a signal would kill the process. The handlers are installed
before the engine is imported, so only the interpreter's own start and ``import orchestrator`` (a
few tens of milliseconds, before anything is opened) come before them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["StopRequested", "catch_while_starting", "hand_to", "restore"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(BaseException):
    """SIGTERM or SIGINT arrived while the worker was starting. A ``BaseException``, like
    ``KeyboardInterrupt``: no ``except Exception`` on the way (an app's import, a retry loop)
    may swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


def _raise(signum: int, frame: Any) -> None:
    raise StopRequested(signum)


def catch_while_starting() -> dict[int, Any]:
    """From now until ``hand_to``, SIGTERM / SIGINT raise ``StopRequested``; returns the handlers
    they had (for ``restore``). Only the main thread may set handlers: elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, _raise)
    return previous


def hand_to(stop: Callable[[], None]) -> bool:
    """From now on SIGTERM / SIGINT call ``stop`` (the worker's ``stop``) instead of raising.
    False, changing nothing, when ``catch_while_starting`` is not in force (the worker was started
    some other way): the worker then installs its own handlers (``Worker.run``)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if any(signal.getsignal(sig) is not _raise for sig in _SIGNALS):
        return False
    for sig in _SIGNALS:
        signal.signal(sig, lambda signum, frame: stop())
    return True


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers ``catch_while_starting`` found."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
