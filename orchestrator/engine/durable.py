"""Durable calls inside a step, waiting for signals, and durable timers.

A step can be long: it pays for model calls, waits hours for a human, sleeps until tomorrow. These
are journaled *inside* the step, so none of it is lost or repeated when the step has to run again
(after a crash, or when a waiting run wakes up):

- ``ctx.durable_call(kind, request, perform)``: call ``i`` of a step execution is journaled as
  ``CallCompleted`` the moment it returns, in its own transaction. When the step runs again (a
  retry, a recovery, a wake-up), call ``i`` with the same (redacted) request returns the journaled
  response without performing it: a paid model call is never paid twice, not even by a retry. A different request means the code changed: it is
  performed and journaled anew. Under replay (``Orchestrator(replay=cassette)``) responses come
  from the cassette and a different request is an error that shows the difference.
- ``ctx.wait_for(name, timeout=None)``: returns the data of signal ``name``. A signal already sent
  (even before the step waited) is consumed and journaled as ``SignalReceived`` in one
  transaction. Otherwise ``WaitStarted`` is journaled, the run becomes ``waiting``, its lease is
  released, and it is parked until the signal arrives or the timeout is due; ``recover`` (or a
  worker) then runs the step again from its start, and this time ``wait_for`` returns.
- ``ctx.sleep(seconds)``: ``TimerStarted`` is journaled with the wake-up time and the run parks
  the same way; once the time has come, the step runs again and ``sleep`` returns at once.

Code before a wait runs again when the step resumes, so it should be a durable call, or cheap and
side-effect free: the same rule as for any step that is re-run after a crash.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from orchestrator.engine.events import EventKind
from orchestrator.engine.journal import ActiveRun, JournalWriter
from orchestrator.errors import WaitTimeoutError
from orchestrator.payload import codec

__all__ = ["DurableExecution", "Suspend", "FOREVER"]

#: wake_at of a run waiting with no timeout: only a signal wakes it
FOREVER = 1e18
_NOT_DONE = object()  # no journaled response for this call yet


class Suspend(BaseException):
    """Control flow, not an error: the step parks the run (user code must not swallow it)."""

    def __init__(self, kind: str, data: dict[str, Any], wake_at: float) -> None:
        self.kind = kind
        self.data = data
        self.wake_at = wake_at
        super().__init__(f"{kind} {data.get('step')}")


# -- the runtime a step's context talks to ----------------------------------------------------------
class DurableExecution:
    """One execution of a step: numbers its durable calls and timers, and journals them.

    ``signals`` is where signals wait to be consumed (``store.signals``); ``replay`` a cassette answering
    durable calls instead of the outside world (None: perform them).
    """

    def __init__(self, journal: JournalWriter, run: ActiveRun, step: str, tick: int, *, signals: Any,
                 clock: Callable[[], float], replay: Any = None,
                 check_lease: Callable[[], None] | None = None) -> None:
        self.journal = journal
        self.run = run
        self.step = step
        self.tick = tick
        self.signals = signals
        self.clock = clock
        self.replay = replay
        #: raises FencedError when another process took the run over: asked before a call leaves
        self.check_lease = check_lease
        self.visit = run.folded.visits.get(step, 0)
        self._calls = 0
        self._timers = 0

    # durable calls
    def _prepare(self, kind: str, request: Mapping[str, Any]) -> tuple[int, Any, Any]:
        """Number the call and find its journaled response: (index, journaled request, response or
        ``_NOT_DONE``). A journaled ``null`` response is a response like any other."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"durable_call kind must be a non-empty string, got {kind!r}")
        index = self._calls
        self._calls += 1
        # force=True: the event's redaction may run whatever this request holds (a response can
        # trip the pre-filter), and redaction normalises JSON text: compare like with like.
        text = self.journal.redact(codec.dumps(dict(request), what=f"request of {kind} call {index} in step "
                                                                       f"{self.step!r}"), force=True)
        journaled_request = codec.loads(text)
        prior = self.run.folded.calls.get(self.step, {}).get(str(index))
        if prior is not None and prior["kind"] == kind and prior["request"] == journaled_request:
            return index, journaled_request, prior["response"]
        if self.replay is not None:  # answered from the cassette, journaled as replayed
            response = self.replay.lookup(self.step, self.visit, index, kind, journaled_request)
            return index, journaled_request, self._record(kind, index, journaled_request, response, 0.0, True)
        return index, journaled_request, _NOT_DONE

    def _record(self, kind: str, index: int, request: Any, response: Any, ms: float, replayed: bool) -> Any:
        data: dict[str, Any] = {"step": self.step, "tick": self.tick, "index": index, "kind": kind,
                                "request": request, "response": response, "ms": round(ms, 3)}
        if replayed:
            data["replayed"] = True
        self.journal.commit(self.run, [(EventKind.CALL_COMPLETED, data)])
        return self.run.folded.calls[self.step][str(index)]["response"]

    def durable_call(self, kind: str, request: Mapping[str, Any], perform: Callable[[], Any]) -> Any:
        index, journaled, response = self._prepare(kind, request)
        if response is not _NOT_DONE:
            return response
        if self.check_lease is not None:
            self.check_lease()
        started = time.perf_counter()
        response = perform()
        if inspect.isawaitable(response):
            raise TypeError(f"durable_call in step {self.step!r} got a coroutine; use await ctx.adurable_call")
        return self._record(kind, index, journaled, response, (time.perf_counter() - started) * 1000, False)

    async def adurable_call(self, kind: str, request: Mapping[str, Any],
                            perform: Callable[[], Awaitable[Any]]) -> Any:
        index, journaled, response = self._prepare(kind, request)
        if response is not _NOT_DONE:
            return response
        if self.check_lease is not None:
            self.check_lease()
        started = time.perf_counter()
        response = perform()
        if inspect.isawaitable(response):
            response = await response
        return self._record(kind, index, journaled, response, (time.perf_counter() - started) * 1000, False)

    # signals
    def wait_for(self, name: str, timeout: float | None = None) -> Any:
        if not isinstance(name, str) or not name:
            raise ValueError(f"wait_for needs a signal name, got {name!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"wait_for timeout must be a number of seconds >= 0, got {timeout!r}")
        folded, key = self.run.folded, f"{self.step}:{name}"
        if key in folded.received:
            return folded.received[key]
        pending = self.signals.pending(self.run.run_id, name)
        if pending:
            signal_id, _, data_text, sent_at = pending[0]
            self.journal.commit(self.run, [(EventKind.SIGNAL_RECEIVED, {
                "step": self.step, "tick": self.tick, "name": name, "data": codec.loads(data_text),
                "signal": signal_id, "sent_at": sent_at})], consume_signals=[signal_id])
            return folded.received[key]
        now = self.clock()
        waiting = folded.waits.get(key)
        timeout_at = waiting["timeout_at"] if waiting else (now + timeout if timeout is not None else None)
        if timeout_at is not None and now >= timeout_at:
            raise WaitTimeoutError(f"step {self.step!r} waited for signal {name!r} until its timeout")
        raise Suspend(EventKind.WAIT_STARTED, {"step": self.step, "tick": self.tick, "name": name,
                                                 "timeout_at": timeout_at},
                      FOREVER if timeout_at is None else timeout_at)

    # timers
    def sleep(self, seconds: float) -> None:
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"ctx.sleep needs a number of seconds >= 0, got {seconds!r}")
        index = self._timers
        self._timers += 1
        now = self.clock()
        wake_at = self.run.folded.timers.get(f"{self.step}:{index}")
        if wake_at is None:
            wake_at = now + seconds
        elif now >= wake_at:
            return
        if now >= wake_at:  # a zero sleep
            return
        raise Suspend(EventKind.TIMER_STARTED, {"step": self.step, "tick": self.tick, "index": index,
                                                  "wake_at": wake_at}, wake_at)
