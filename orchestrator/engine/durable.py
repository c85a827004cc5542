"""Durable calls inside a step, waiting for signals, and durable timers.

A step can be long: it pays for model calls, waits hours for a human, sleeps until tomorrow. These
are journaled *inside* the step, so none of it is lost or repeated when the step has to run again
(after a crash, or when a waiting run wakes up):

- ``ctx.durable_call(kind, request, perform)``: call ``i`` of a step execution is journaled as
  ``CallCompleted`` the moment it returns, in its own transaction. When the step runs again (a
  retry, a recovery, a wake-up), call ``i`` with the same (redacted) request returns the journaled
  response without performing it: a paid model call is never paid twice, not even by a retry. A
  different request means the code changed: ``CallChangedError``, or with ``if_changed="perform"``
  it is performed and journaled anew. Under replay (``Orchestrator(replay=cassette)``) responses
  come from the cassette and a different request is an error that shows the difference.
- Calls made while another call is performed (a tool that asks a model, ``ctx.http`` inside a
  tool) are numbered under it: ``"1.0"``, ``"1.1"`` inside call ``1`` (``context.CallScope``).
  When call ``1`` is answered from the journal its inner calls are not made, and the calls after
  it keep their numbers; when it is performed again (it had not completed), its inner calls are
  answered from the journal in turn. Top-level calls are numbered ``0, 1, 2...`` as they always
  were, so journals and cassettes written before nesting existed replay unchanged.
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

import asyncio
import difflib
import inspect
import json
import math
import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from orchestrator.engine.context import CALL_SCOPE, CallScope
from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import wait_key
from orchestrator.engine.journal import ActiveRun, Encoded, JournalWriter
from orchestrator.engine.names import name_problem, shown
from orchestrator.engine.raised_again import failure_fields, recorded_error
from orchestrator.engine.services import NotJournaled
from orchestrator.errors import CallChangedError, EncodingError, WaitTimeoutError
from orchestrator.payload import codec
from orchestrator.payload.exceptions import error_record
from orchestrator.payload.redact import same_request
from store import FencedError, RunNotFoundError

__all__ = ["FOREVER", "CallGuard", "DurableExecution", "Suspend", "check_lease"]

#: wake_at of a run waiting with no timeout: only a signal wakes it
FOREVER = 1e18
#: where a call (or a timer) is in its step execution: ``3``, or ``"3.1"`` inside call 3 (``CallScope``)
Position = int | str
_NOT_DONE = object()  # no journaled response for this call yet



class Suspend(BaseException):
    """Control flow, not an error: the step parks the run (user code must not swallow it)."""

    def __init__(self, kind: str, data: dict[str, Any], wake_at: float) -> None:
        self.kind = kind
        self.data = data
        self.wake_at = wake_at
        super().__init__(f"{kind} {data.get('step')}")


# -- the guard: may this attempt still act for its run? -----------------------------------------------
def lease_verdict(run: ActiveRun, current: int | None, store: Any) -> BaseException | None:
    """None if ``run.token`` is the run's ``current`` lease token (None: the run is gone), else the error
    the caller gets (invariant 6)."""
    if current is None:
        return RunNotFoundError(f"no run {run.run_id!r} in {store.url}", run_id=run.run_id)
    if current != run.token:
        return FencedError(f"run {run.run_id!r}: the lease was taken over (token {run.token} is no longer "
                           f"current, {current} is); no further call leaves this process",
                           run_id=run.run_id, token=run.token, current_token=current)
    return None


def check_lease(store: Any, run: ActiveRun) -> None:
    """Before a call leaves the process: is this process still the run's owner? A process whose lease
    was taken over learns it here, not only at its next write (invariant 6). One store read, on the
    caller's thread: for sync paths (async calls batch theirs, see ``_GuardLane``)."""
    error = lease_verdict(run, store.get_run(run.run_id).lease_token, store)
    if error is not None:
        raise error


class CallGuard:
    """What is asked before a durable call leaves the process, in its two parts:

    - ``attempt()``: in memory, free: raises if this attempt was abandoned (it timed out);
    - the lease, ``(store, run)``: is ``run.token`` still the run's current token? A store read. Async
      calls hand this part to a ``_GuardLane``, which reads the tokens of every run whose call is
      waiting there in one statement (``store.leases.tokens``).

    Calling the guard asks both, synchronously (``check_lease``'s read on the caller's thread)."""

    __slots__ = ("attempt", "run", "store")

    def __init__(self, attempt: Callable[[], None], store: Any, run: ActiveRun) -> None:
        self.attempt = attempt
        self.store = store
        self.run = run

    def __call__(self) -> None:
        self.attempt()
        check_lease(self.store, self.run)


# -- the runtime a step's context talks to ----------------------------------------------------------
class DurableExecution:
    """One attempt of a step: numbers its durable calls and timers, and journals them.

    ``signals`` is where signals wait to be consumed (``store.signals``); ``replay`` a cassette
    answering durable calls instead of the outside world (None: perform them); ``guard`` is asked
    before a call leaves the process, whole (it raises when this process lost the run's lease, or the
    attempt timed out and was abandoned), and its in-memory part before anything is journaled (the
    append itself is fenced by the lease token, see ``_completed``).
    """

    def __init__(self, journal: JournalWriter, run: ActiveRun, step: str, tick: int, *, signals: Any,
                 clock: Callable[[], float], replay: Any = None, attempt: int = 1,
                 guard: CallGuard | None = None, compensable: bool = False) -> None:
        self.journal = journal
        self.run = run
        self.step = step
        self.tick = tick
        self.signals = signals
        self.clock = clock
        self.replay = replay
        self.attempt = attempt
        self.guard = guard
        #: whether effects of this step's calls have a compensation (the step's)
        self.compensable = compensable
        self.visit = run.folded.visits.get(step, 0)
        self._calls = 0
        self._timers = 0
        #: how many times each signal name was waited for in this step execution
        self._waits: dict[str, int] = {}

    # durable calls
    def _position(self) -> tuple[Position, bool]:
        """The next call's position, and whether it is made inside a call performed again because its
        request changed. Inside a call of this attempt being performed, the next number under it;
        else the next top-level number. A call of another execution (a run driven from inside a
        call, say) does not count: its positions are its own."""
        scope = CALL_SCOPE.get()
        if scope is not None and scope.of(self):
            return scope.next_call(), scope.replacing
        index = self._calls
        self._calls += 1
        return index, False

    def _prepare(self, kind: str, request: Mapping[str, Any], if_changed: str) -> tuple[Position, str, Any, bool, bool]:
        """Number the call and find its journaled outcome: (position, the request's journal text,
        response or ``_NOT_DONE``, whether it replaces a changed request, whether the calls made
        inside it replace theirs). A journaled ``null`` response is a response like any other; a
        journaled failure of this attempt is raised again."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"durable_call kind must be a non-empty string, got {kind!r}")
        if if_changed not in ("raise", "perform"):
            raise ValueError(f"durable_call if_changed must be 'raise' or 'perform', got {if_changed!r}")
        if not isinstance(request, Mapping):
            raise TypeError(f"durable_call request in step {self.step!r} must be a JSON object (a dict), got "
                            f"{type(request).__name__}; wrap it, e.g. {{'messages': [...]}}")
        position, inside_replaced = self._position()
        # Redacted as the event will be: redaction changes nothing but secrets (whether the pre-filter
        # fires on this request or, later, on the whole event), so this is what the journal will hold
        # (and, put in place, what its event holds: ``JournalWriter.with_parts``). Decoded only to be
        # compared with a journaled call or a cassette's.
        text = self.journal.redact(codec.dumps(dict(request), what=f"request of {kind} {_call(position)} in step "
                                                                       f"{self.step!r}"))
        prior = self.run.folded.calls.get(self.step, {}).get(str(position))
        if prior is not None:
            journaled_request = codec.loads(text)
            if prior["kind"] == kind and same_request(prior["request"], journaled_request):
                if "error" not in prior:
                    return position, text, prior["response"], False, inside_replaced
                if prior.get("attempt") == self.attempt:
                    # This attempt's call failed before a crash: its outcome is decided, raise it again
                    # rather than sending it twice (a retry, a later attempt, performs it anew).
                    raise recorded_error(prior["error"], self.step, _call(position), homes=self._homes())
                return position, text, _NOT_DONE, False, inside_replaced
            # A call inside one performed again for a changed request belongs to that request: it
            # may change with it (the enclosing call's if_changed="perform" covers what it makes).
            if if_changed == "raise" and not inside_replaced:
                raise CallChangedError(_changed(self.step, position, prior, kind, journaled_request))
            return position, text, _NOT_DONE, True, True
        if self.replay is not None:  # answered from the cassette, journaled as replayed
            response = self.replay.lookup(self.step, self.visit, position, kind, codec.loads(text))
            return position, text, self._record(kind, position, text, response, 0.0, replayed=True), False, False
        return position, text, _NOT_DONE, False, inside_replaced

    def _homes(self) -> tuple[str, ...]:
        """The module of this step's function: where a class journaled by its bare name is also
        looked for when its failure is raised again (``raised_again.recorded_error``)."""
        spec = self.run.workflow.steps.get(self.step)
        home = getattr(getattr(spec, "fn", None), "__module__", None)
        return (home,) if isinstance(home, str) else ()

    def _record(self, kind: str, position: Position, request: str, response: Any, ms: float, *,
                replayed: bool = False, replaced: bool = False, effect: Any = None) -> Any:
        try:
            self.journal.commit(self.run, [(EventKind.CALL_COMPLETED, self._completed(
                kind, position, request, response, ms, replayed, replaced, effect))])
        except EncodingError as exc:
            raise self._unjournaled(kind, position, response, exc) from None
        return self.run.folded.calls[self.step][str(position)]["response"]

    async def _arecord(self, kind: str, position: Position, request: str, response: Any, ms: float, *,
                       replaced: bool = False, effect: Any = None) -> Any:
        try:
            data = self._completed(kind, position, request, response, ms, False, replaced, effect)
            await self.journal.acommit(self.run, [(EventKind.CALL_COMPLETED, data)])
        except EncodingError as exc:
            raise self._unjournaled(kind, position, response, exc) from None
        return self.run.folded.calls[self.step][str(position)]["response"]

    def _unjournaled(self, kind: str, position: Position, response: Any, exc: EncodingError) -> EncodingError:
        """The error for a call that was made but whose outcome cannot be journaled: naming the call
        and the path in its response (not the event's), and saying it was made. EncodingError is never
        retried, so the call is not made a second time."""
        try:
            codec.dumps(response, what=f"response of {kind} call {position} in step {self.step!r}")
        except EncodingError as precise:
            exc = precise
        return EncodingError(f"{exc} (the call was made; the step fails rather than make it again)",
                             path=exc.path, type_name=exc.type_name)

    def _completed(self, kind: str, position: Position, request: str, response: Any, ms: float, replayed: bool,
                   replaced: bool, effect: Any) -> dict[str, Any] | Encoded:
        """The ``CallCompleted`` event (``request``: its journal text, from ``_prepare``; ``index``: the
        call's position, an int or, inside another call, its dotted path). An abandoned
        attempt records nothing: the in-memory part of the guard is asked first. The lease is not
        read again here: the append that journals this event carries the run's lease token and is
        refused by the store, in the same transaction, when the token is stale (store/_journal.py:
        ``append_one``'s INSERT ... SELECT matches only the current token; ``append_tx`` and a group
        commit read the token under the run row's lock), so a fenced attempt records nothing either
        (invariant 6) without a read of its own."""
        if self.guard is not None:
            self.guard.attempt()
        data: dict[str, Any] = {"step": self.step, "tick": self.tick, "index": position, "kind": kind,
                                "response": response, "ms": round(ms, 3)}
        if replayed:
            data["replayed"] = True
        if replaced:
            data["replaced"] = True
        if effect is not None:
            made = effect(response)
            if made:
                data["effect"] = {"compensable": self.compensable, **made}
        # The request was encoded and redacted when the call was numbered: its text goes in as it is.
        return self.journal.with_parts(EventKind.CALL_COMPLETED, data, {"request": request})

    def _record_failure(self, kind: str, position: Position, request: str, exc: Exception, ms: float) -> None:
        if self.guard is not None:
            try:
                self.guard()
            except BaseException:
                return  # a fenced or abandoned attempt records nothing
        error = {**error_record(exc, with_traceback=False), **failure_fields(exc)}
        self.journal.commit(self.run, [(EventKind.CALL_FAILED, self.journal.with_parts(EventKind.CALL_FAILED, {
            "step": self.step, "tick": self.tick, "index": position, "kind": kind, "error": error,
            "attempt": self.attempt, "ms": round(ms, 3)}, {"request": request}))])

    def durable_call(self, kind: str, request: Mapping[str, Any], perform: Callable[[], Any], *,
                     if_changed: str = "raise", effect: Callable[[Any], dict[str, Any] | None] | None = None) -> Any:
        position, text, response, replaced, replacing = self._prepare(kind, request, if_changed)
        if response is not _NOT_DONE:
            return response
        if self.guard is not None:
            self.guard()
        started = time.perf_counter()
        scope = CALL_SCOPE.set(CallScope(self, position, replacing))
        try:
            response = perform()
        except NotJournaled:
            raise  # made, and handed back live: nothing to journal (made again if the step runs again)
        except Exception as exc:
            self._record_failure(kind, position, text, exc, (time.perf_counter() - started) * 1000)
            raise
        finally:
            CALL_SCOPE.reset(scope)
        if inspect.isawaitable(response):
            raise TypeError(f"durable_call in step {self.step!r} got a coroutine; use await ctx.adurable_call")
        return self._record(kind, position, text, response, (time.perf_counter() - started) * 1000,
                            replaced=replaced, effect=effect)

    async def adurable_call(self, kind: str, request: Mapping[str, Any], perform: Callable[[], Awaitable[Any]], *,
                            if_changed: str = "raise",
                            effect: Callable[[Any], dict[str, Any] | None] | None = None) -> Any:
        # Numbered before the first await: calls started together (asyncio.gather) take their
        # positions in the order they were started, whichever finishes first.
        position, text, response, replaced, replacing = self._prepare(kind, request, if_changed)
        if response is not _NOT_DONE:
            return response
        if self.guard is not None:
            await self._aguard(self.guard)
        started = time.perf_counter()
        scope = CALL_SCOPE.set(CallScope(self, position, replacing))
        try:
            response = perform()
            if inspect.isawaitable(response):
                response = await response
        except NotJournaled:
            raise  # made, and handed back live: nothing to journal (made again if the step runs again)
        except Exception as exc:
            self._record_failure(kind, position, text, exc, (time.perf_counter() - started) * 1000)
            raise
        finally:
            CALL_SCOPE.reset(scope)
        return await self._arecord(kind, position, text, response, (time.perf_counter() - started) * 1000,
                                    replaced=replaced, effect=effect)

    async def _aguard(self, guard: CallGuard) -> None:
        """The guard for an async call. The in-memory part on the loop; the lease off it, since it
        reads the store, and a read on the loop would stop every other run for a round trip. The
        lane reads the leases of all calls waiting there at once; the read starts after this guard
        was queued, so a takeover committed before the call asked fences it."""
        guard.attempt()
        await (_SQLITE_GUARDS if guard.store.dialect == "sqlite" else _GUARDS).check(guard)
        guard.attempt()  # abandoned while its lease was read: still nothing leaves

    # signals
    def wait_for(self, name: str, timeout: float | None = None) -> Any:
        if (problem := name_problem(name)) is not None:
            raise ValueError(f"wait_for's signal name must be {problem}, got {shown(name)}")
        if timeout is not None and not _seconds(timeout):
            raise ValueError(f"wait_for timeout must be a finite number of seconds >= 0 (None: no timeout), "
                             f"got {timeout!r}")
        if self.guard is not None:
            # An abandoned attempt (timed out, cancelled) takes no signal and journals nothing: the
            # attempt that replaced it waits for the same one.
            self.guard.attempt()
        # The n-th wait for this name in the step execution (a loop waiting for each next message):
        # each is answered by a signal of its own, and journaled with its number (none for the first,
        # as journals written before waits were numbered hold them). A wait inside a durable call is
        # numbered under it, as its timers are: when that call is answered from the journal the wait
        # is not reached, and a later wait for the same name keeps its number (and its signal).
        scope = CALL_SCOPE.get()
        index: Position
        if scope is not None and scope.of(self):
            index = scope.next_wait(name)
        else:
            index = self._waits.get(name, 0)
            self._waits[name] = index + 1
        numbered = {"index": index} if index else {}
        folded, key = self.run.folded, wait_key(self.step, name, index)
        if key in folded.received:
            return folded.received[key]
        waiting = folded.waits.get(key)
        if waiting is not None and waiting.get("timed_out"):
            # Told before (and maybe acted on: escalated, waited again): told again, and a signal sent
            # since answers a later wait, not this one.
            raise self._timed_out(name, waiting["timeout_at"])
        pending = self.signals.pending(self.run.run_id, name)
        if pending:
            signal_id, _, data_text, sent_at = pending[0]
            self.journal.commit(self.run, [(EventKind.SIGNAL_RECEIVED, {
                "step": self.step, "tick": self.tick, "name": name, **numbered, "data": codec.loads(data_text),
                "signal": signal_id, "sent_at": sent_at})], consume_signals=[signal_id])
            return folded.received[key]
        now = self.clock()
        timeout_at = waiting["timeout_at"] if waiting else (now + timeout if timeout is not None else None)
        if timeout_at is not None and now >= timeout_at:
            # Journaled before the step is told, as a received signal is: what the step does about it
            # (page someone, wait again) is then what it does every time it runs again.
            self.journal.commit(self.run, [(EventKind.WAIT_TIMED_OUT, {
                "step": self.step, "tick": self.tick, "name": name, **numbered, "timeout_at": timeout_at})])
            raise self._timed_out(name, timeout_at)
        raise Suspend(EventKind.WAIT_STARTED, {"step": self.step, "tick": self.tick, "name": name, **numbered,
                                                 "timeout_at": timeout_at},
                      FOREVER if timeout_at is None else timeout_at)

    def _timed_out(self, name: str, timeout_at: float) -> WaitTimeoutError:
        try:
            at = datetime.fromtimestamp(timeout_at, timezone.utc).isoformat(timespec="seconds")
        except (OverflowError, ValueError, OSError):  # a clock or timeout beyond the calendar's years
            at = f"epoch {timeout_at:g}"
        return WaitTimeoutError(f"step {self.step!r} waited for signal {name!r} until its timeout ({at}) "
                                "passed; catch WaitTimeoutError in the step to go on without it",
                                step=self.step, signal=name, timeout_at=timeout_at)

    # timers
    def sleep(self, seconds: float) -> None:
        if not _seconds(seconds):
            raise ValueError(f"ctx.sleep needs a finite number of seconds >= 0, got {seconds!r}")
        if self.guard is not None:
            self.guard.attempt()  # an abandoned attempt parks nothing
        # A timer inside a durable call is numbered under it, as a call would be: when that call is
        # answered from the journal the timer is not reached, and later timers keep their numbers.
        scope = CALL_SCOPE.get()
        if scope is not None and scope.of(self):
            index: Position = scope.next_timer()
        else:
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


class _GuardLane:
    """Checks async calls' leases on a few threads of its own and hands the verdicts back in batches.

    A thread hop per guard through the loop's default executor costs the event loop more than the
    guard's own read (a concurrent future, its asyncio twin and a wake-up each). Here a guard costs
    the loop one future and a queue put; a worker takes every guard queued, reads the current lease
    tokens of all their runs in one statement per store, then wakes each loop once for all of its
    verdicts. Each caller still waits for its own verdict, so nothing leaves the process before its
    lease was found current by a read that started after it asked.
    """

    def __init__(self, workers: int = 2) -> None:
        self._queue: queue.SimpleQueue[tuple[CallGuard, asyncio.AbstractEventLoop, asyncio.Future]] = \
            queue.SimpleQueue()
        self._workers = workers
        self._started = 0
        self._lock = threading.Lock()

    def check(self, guard: CallGuard) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._started < self._workers:
            with self._lock:
                while self._started < self._workers:
                    self._started += 1
                    threading.Thread(target=self._work, name=f"agentsaga-guard-{self._started}", daemon=True).start()
        self._queue.put((guard, loop, future))
        return future

    def _work(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            verdicts: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, BaseException | None]]] = {}
            for (_, loop, future), error in zip(batch, _lease_verdicts([guard for guard, _, _ in batch])):
                verdicts.setdefault(loop, []).append((future, error))
            for loop, settled in verdicts.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # the loop was closed meanwhile: nobody is waiting any more
                    pass

    def forget_threads(self) -> None:
        """In a forked child: the parent's workers do not exist here; start anew on first use."""
        self._queue = queue.SimpleQueue()
        self._started = 0
        self._lock = threading.Lock()


def _lease_verdicts(guards: list[CallGuard]) -> list[BaseException | None]:
    """Each guard's verdict on its lease, in order: one read of the current tokens per store for
    all the runs of ``guards``. A read that fails is every one of its callers' error."""
    by_store: dict[int, list[int]] = {}
    for i, guard in enumerate(guards):
        by_store.setdefault(id(guard.store), []).append(i)
    verdicts: list[BaseException | None] = [None] * len(guards)
    for indexes in by_store.values():
        store = guards[indexes[0]].store
        try:
            current = store.leases.tokens([guards[i].run.run_id for i in indexes])
        except BaseException as exc:  # noqa: BLE001 (handed to each caller)
            for i in indexes:
                verdicts[i] = exc
            continue
        for i in indexes:
            run = guards[i].run
            verdicts[i] = lease_verdict(run, current.get(run.run_id), store)
    return verdicts


def _settle(settled: list[tuple[asyncio.Future, BaseException | None]]) -> None:
    for future, error in settled:
        if future.done():  # the caller was cancelled
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


#: a guard's read is a round trip to a server (Postgres): more of them at once; SQLite reads are local
#: and take the interpreter's lock longer, so fewer threads there keep more of it for the event loop
_GUARDS = _GuardLane(workers=4)
_SQLITE_GUARDS = _GuardLane(workers=2)
for _lane in (_GUARDS, _SQLITE_GUARDS):
    os.register_at_fork(after_in_child=_lane.forget_threads)

def _call(position: Position, kind: str | None = None) -> str:
    """How a message names a call: ``call 2 (llm)``, or ``call 1.0 (llm, inside call 1)``."""
    text = str(position)
    about = [kind] if kind else []
    if "." in text:
        about.append(f"inside call {text.rsplit('.', 1)[0]}")
    return f"call {text} ({', '.join(about)})" if about else f"call {text}"


def _changed(step: str, position: Position, prior: Mapping[str, Any], kind: str, request: Any) -> str:
    before = prior["request"] if prior["kind"] == kind else {"kind": prior["kind"], "request": prior["request"]}
    after = request if prior["kind"] == kind else {"kind": kind, "request": request}
    diff = [line for line in difflib.unified_diff(
        json.dumps(before, indent=1, sort_keys=True, default=str).splitlines(),
        json.dumps(after, indent=1, sort_keys=True, default=str).splitlines(),
        "journaled", "now", lineterm="", n=1)][:40]
    return (f"{_call(position, kind)} of step {step!r} was journaled with a different request: the code changed "
            "since it ran, and performing it again could pay twice. Pass if_changed='perform' to that call to "
            "perform the new request (journaled as replacing the old one), or restore the code.\n"
            + "\n".join(diff))


def _seconds(value: Any) -> bool:
    """Whether ``value`` is a duration a timer can be journaled with: a finite number >= 0 (not a
    bool). NaN or infinity would reach the journal as a wake-up time JSON cannot hold."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and value >= 0)
