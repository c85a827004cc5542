"""The engine: drives one run tick by tick, journaling as it goes.

Per step the cost aims at one commit (docs/guarantees.md, "cost model"): a plain step's start is
written together with its completion (one transaction holding the output, the trace, the timings
and the routing decision); only effects, and steps that ask for it with ``durable_start=True``,
commit a ``StepStarted`` before they run (invariant 4). Events are applied to the live ``RunState``
through the same ``apply`` that ``fold`` uses, from the decoded journal text, so the state in
memory is exactly what a recovery would rebuild.

Failed attempts are journaled one by one (``StepFailed`` with the delay before the next attempt),
so the attempt count survives a crash. Retries use tenacity with the Orchestrator's injected sleep
and random source; a step that runs once (the default policy) skips tenacity entirely, which keeps
the common path short.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_base

from orchestrator.payload import codec
from orchestrator.engine.context import StepContext
from orchestrator.engine.durable import StepRuntime, Suspend
from orchestrator.engine.events import TERMINAL_STATUSES
from orchestrator.engine.events import EventKind as K
from orchestrator.engine.fold import RunState, apply
from orchestrator.tools.breakers import StoreBreakers
from orchestrator.engine.journal import (
    SNAPSHOT_SCHEMA,
    JournalRedactor,
    error_info,
    make_snapshot,
    restore_run,
    snapshot_problem,
)
from orchestrator.engine.leases import Heartbeat
from orchestrator.payload.redact import Redactor
from orchestrator.tools.toolbox import StepTools, Tools
from orchestrator.engine.saga import Saga, SagaKind, has_pending_effects
from compensations import Compensations, resolve_check, resolve_compensation
from orchestrator.errors import (
    EncodingError,
    InDoubtError,
    LoopLimitError,
    PermanentToolError,
    RetryableToolError,
    StepTimeoutError,
)
from store import FencedError, NewEvent, Store, StoreError
from workflows import Retry, Workflow
from workflows.errors import RoutingError

__all__ = ["Engine", "Live", "EngineConfig", "SNAPSHOT_SCHEMA", "error_info", "snapshot_problem"]

_log = logging.getLogger("agentsaga.engine")

#: Layout version of a snapshot's JSON; a snapshot of another version is skipped, never trusted.
#: Errors a retry cannot fix, whatever the step's policy says: the tool answered "no", the effect is
#: in doubt, or the output cannot be journaled.
_NEVER_RETRY = (PermanentToolError, InDoubtError, EncodingError)


@dataclass(slots=True)
class EngineConfig:
    snapshot_every: int
    keep_snapshots: int
    lease_ttl: float
    owner: str
    clock: Callable[[], float]
    sleep: Callable[[float], Awaitable[None]]
    rng: random.Random


class Live:
    """A run being driven by this process: its workflow, lease token and folded state."""

    __slots__ = ("run_id", "wf", "token", "rs", "last_snapshot_seq", "lock")

    def __init__(self, run_id: str, wf: Workflow, token: int, rs: RunState, last_snapshot_seq: int) -> None:
        self.run_id = run_id
        self.wf = wf
        self.token = token
        self.rs = rs
        self.last_snapshot_seq = last_snapshot_seq
        self.lock = threading.RLock()  # one writer at a time per run (see Engine.commit)


class _GaveUp(Exception):
    """A step failed for good (retries exhausted or a permanent error) and has no failure route."""

    def __init__(self, step: str, error: dict[str, Any]) -> None:
        self.step = step
        self.error = error
        super().__init__(f"step {step!r} failed: {error['type']}: {error['message']}")


class _Permanent(Exception):
    """Wraps an error that retrying cannot fix (bad output, routing, loop bound)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        super().__init__(str(error))


class _PolicyWait(wait_base):
    """tenacity wait strategy reading the step's Retry policy and the injected random source.

    ``offset`` is the number of attempts journaled before this process took over, so the backoff
    continues where a crashed process left it.
    """

    def __init__(self, policy: Retry, offset: int, rng: random.Random) -> None:
        self.policy = policy
        self.offset = offset
        self.rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = self.policy.backoff(self.offset + retry_state.attempt_number, self.rng.random())
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, RetryableToolError) and error.retry_after is not None:
            delay = max(delay, error.retry_after)  # the server said when: never call back sooner
        return delay


class Engine:
    def __init__(self, store: Store, config: EngineConfig, *, registry: Compensations | None = None,
                 tools: Tools | None = None) -> None:
        self.store = store
        self.cfg = config
        self.registry = registry
        self.tools = tools or Tools(breakers=StoreBreakers(store, config.clock), registry=None, redactor=Redactor(),
                                    clock=config.clock)
        self._redactor = JournalRedactor(self.tools.redactor)
        self.heartbeat = Heartbeat(store, ttl=config.lease_ttl, clock=config.clock)
        self.saga = Saga(self, registry)
        #: called as on_event(run_id, events) after each commit (the CLI's progress lines); None: off
        self.on_event: Callable[[str, list[NewEvent]], None] | None = None
        self.replay: Any = None  # a Cassette when replaying recorded responses

    # -- journal ---------------------------------------------------------------------------------
    def commit(self, live: Live, batch: list[tuple[str, dict[str, Any]]], *, trigger: str | None = None,
               consume_signals: list[int] | None = None) -> None:
        # Parallel sync steps run on threads and may journal durable calls from there: one writer
        # at a time per run keeps seq numbers and the folded state consistent. Per run, not per
        # process, so a worker driving several runs on threads commits them concurrently.
        with live.lock:
            self._commit(live, batch, trigger=trigger, consume_signals=consume_signals)

    def _commit(self, live: Live, batch: list[tuple[str, dict[str, Any]]], *, trigger: str | None,
                consume_signals: list[int] | None) -> None:
        """Append ``batch`` in one transaction and fold it into the live state.

        When the batch empties the frontier, ``RunCompleted`` joins the same transaction; a terminal
        event sets the run's status and releases the lease in it too. A snapshot is written in the
        same transaction every ``snapshot_every`` events and at the end of the run.
        """
        cfg = self.cfg
        texts = [(kind, self.redact(codec.dumps(data, what=f"{kind} event"))) for kind, data in batch]
        now = cfg.clock()
        rs = live.rs
        reduce = live.wf.reduce
        before = rs.status
        events: list[NewEvent] = []
        for kind, text in texts:
            seq = rs.seq + 1
            apply(rs, seq, kind, codec.loads(text), reduce)
            events.append(NewEvent(seq=seq, kind=kind, data=text, at=now))
        status: str | None = None
        error: str | None = None
        if rs.status == "running" and not rs.frontier:
            seq = rs.seq + 1
            apply(rs, seq, K.RUN_COMPLETED, {}, reduce)
            events.append(NewEvent(seq=seq, kind=K.RUN_COMPLETED, data="{}", at=now))
        if rs.status != before:
            status = rs.status  # the run row follows the journal's status in the same transaction
        if rs.status in TERMINAL_STATUSES:
            status = rs.status
            trigger = trigger or "final"
            if rs.error:
                error = f"{rs.error.get('type')}: {rs.error.get('message')}"
        snapshot = None
        if trigger is not None or rs.seq - live.last_snapshot_seq >= cfg.snapshot_every:
            snapshot = self.make_snapshot(rs, trigger or "periodic", now)
        self.store.append(
            live.run_id,
            events,
            token=live.token,
            now=now,
            status=status,
            error=error,
            finished=status in TERMINAL_STATUSES,
            snapshot=snapshot,
            keep_snapshots=cfg.keep_snapshots if snapshot is not None else None,
            release_lease=status in TERMINAL_STATUSES,
            consume_signals=consume_signals or (),
        )
        if snapshot is not None:
            live.last_snapshot_seq = snapshot.seq
        if self.on_event is not None:
            self.on_event(live.run_id, events)

    def redact(self, text: str, *, force: bool = False) -> str:
        """Invariant 9: nothing secret reaches the journal (see ``_journal.JournalRedactor``)."""
        return self._redactor.redact(text, force=force)

    make_snapshot = staticmethod(make_snapshot)

    def restore(self, run_id: str, wf: Workflow) -> tuple[RunState, int, list[tuple[int, str]]]:
        """Newest snapshot that verifies + the events after it: (state, snapshot seq, rejected)."""
        return restore_run(self.store, run_id, wf.reduce)

    # -- driving ---------------------------------------------------------------------------------
    async def drive(self, live: Live) -> RunState:
        """Run ticks until the run ends. Raises store errors (fenced, unavailable) to the caller."""
        hb = self.heartbeat
        hb.hold(live.run_id, live.token)
        try:
            while live.rs.status in ("running", "compensating"):
                if hb.lost(live.run_id):
                    raise FencedError(f"lease on run {live.run_id!r} was taken over; abandoning it")
                if live.rs.status == "compensating":
                    await self.saga.run(live)
                    continue
                pending = live.rs.pending
                if not pending:  # a frontier that emptied without its RunCompleted being written
                    self.commit(live, [])
                    continue
                if len(pending) == 1:
                    outcomes: list[BaseException | None] = []
                    try:
                        await self.run_step(live, pending[0], offload=False)
                        outcomes.append(None)
                    except (_GaveUp, Suspend) as stopped:
                        outcomes.append(stopped)
                else:
                    results = await asyncio.gather(
                        *(self.run_step(live, name, offload=True) for name in pending), return_exceptions=True
                    )
                    outcomes = list(results)
                    # Anything but a step giving up or waiting (fencing, the store, cancellation)
                    # stops the drive.
                    for outcome in outcomes:
                        if isinstance(outcome, BaseException) and not isinstance(outcome, (_GaveUp, Suspend)):
                            raise outcome
                failures = [o for o in outcomes if isinstance(o, _GaveUp)]
                if failures:
                    await self.on_run_failure(live, failures)
                    continue
                waits = [o for o in outcomes if isinstance(o, Suspend)]
                if waits:
                    self.park(live, min(w.wake_at for w in waits))
                    break
        finally:
            hb.drop(live.run_id)
        return live.rs

    def park(self, live: Live, wake_at: float) -> None:
        """The run waits: claims skip it until ``wake_at`` (or a signal wakes it); the lease goes."""
        self.store.wakeups.park(live.run_id, token=live.token, wake_at=wake_at, now=self.cfg.clock())
        self.store.leases.release(live.run_id, token=live.token, now=self.cfg.clock())

    async def on_run_failure(self, live: Live, failures: list[_GaveUp]) -> None:
        """A step gave up with no failure route: the run fails (the saga layer compensates first)."""
        first = failures[0]
        if has_pending_effects(live.rs):
            self.commit(live, [(SagaKind.SAGA_STARTED, {"reason": "failure", "after_seq": 0, "step": first.step,
                                                         "error": _summary(first.error)})])
            return  # drive() runs the saga next, so a crash from here on resumes it
        self.commit(live, [(K.RUN_FAILED, {"step": first.step, "error": _summary(first.error)})])

    def input_ref(self, live: Live, name: str) -> dict[str, Any]:
        step = live.wf.steps[name]
        if step.reads is not None:
            state = live.rs.state
            return {"reads": {k: state.get(k) for k in step.reads}}
        return {"state_at": live.rs.state_seq}

    async def run_step(self, live: Live, name: str, *, offload: bool) -> None:
        """Execute one step of the current tick to completion, a failure route, or giving up."""
        wf = live.wf
        step = wf.steps[name]
        rs = live.rs
        tick = rs.tick
        prior = rs.failures.get(name, 0)
        bound = step.max_visits or wf.max_visits
        if rs.visits.get(name, 0) >= bound:
            where = "its max_visits" if step.max_visits else f"workflow {wf.name!r} max_visits"
            self.fail_step(live, name, prior + 1, LoopLimitError(f"step {name!r} would run more than {bound} times ({where})"))
            return
        view = wf.view(rs.state)
        input_ref = self.input_ref(live, name)
        key = self.idempotency_key(live, name) if step.effect else None
        clock = self.cfg.clock
        failure = rs.routed_errors.get(name)
        if step.effect and name in rs.in_flight:
            # Invariant 4: the intent is journaled but not the outcome. Never a blind duplicate.
            settled = await self.reconcile(live, name, view, key)
            if settled:
                return
        if step.journals_start:
            started: dict[str, Any] = {"step": name, "tick": tick, "attempt": prior + 1, "input": input_ref}
            if key is not None:
                started["key"] = key
            self.commit(live, [(K.STEP_STARTED, started)])
        attempt = prior
        holder: list[StepContext] = []

        async def attempt_once() -> Any:
            nonlocal attempt
            attempt += 1
            this = attempt
            ctx = StepContext(run_id=live.run_id, workflow=wf.name, step=name, attempt=attempt, tick=tick,
                              clock=clock, failure=failure, idempotency_key=key,
                              make_tools=lambda: self.tools.for_step(key, this),
                              runtime=lambda: StepRuntime(self, live, name, tick))
            holder[:] = [ctx]
            try:
                if step.breaker is None:
                    return await self.call(step, ctx, view, offload)
                return await self.guarded_call(step, ctx, view, offload)
            finally:
                if ctx.tools is not None:
                    await ctx.tools.aclose()

        started = time.perf_counter()
        policy = step.retry
        remaining = policy.attempts - prior
        try:
            if remaining <= 1:
                result = await attempt_once()
            else:
                async def journal_retry(state: RetryCallState) -> None:
                    exc = state.outcome.exception() if state.outcome else None
                    delay = state.upcoming_sleep
                    data = {
                        "step": name, "tick": tick, "attempt": attempt,
                        "error": error_info(exc) if exc else {"type": "unknown", "message": ""},
                        "retry_in": round(delay, 6), "final": False,
                    }
                    _add_records(data, holder)
                    self.commit(live, [(K.STEP_FAILED, data)])

                retrying = AsyncRetrying(
                    sleep=self.cfg.sleep,
                    stop=stop_after_attempt(remaining),
                    wait=_PolicyWait(policy, prior, self.cfg.rng),
                    retry=retry_if_exception(lambda e: isinstance(e, Exception) and not isinstance(e, _NEVER_RETRY)
                                             and policy.should_retry(e)),
                    before_sleep=journal_retry,
                    reraise=True,
                )
                result = await retrying(attempt_once)
        except Suspend as suspend:
            # The step waits for a signal or a timer: journal that (the run becomes waiting).
            # Journaled on every suspension (also when a woken step waits again), so the journal alone
            # says the run is waiting (invariant 2); the timeout or wake-up time is kept from the first.
            self.commit(live, [(suspend.kind, dict(suspend.data))])
            raise
        except (StoreError, asyncio.CancelledError):
            raise  # the journal is unreachable or the lease is gone: stop, do not record a failure
        except Exception as exc:
            self.fail_step(live, name, attempt, exc, records=holder)
            return
        ms = round((time.perf_counter() - started) * 1000, 3)
        ctx = holder[0]
        try:
            update = wf.normalise_update(name, result)
            next_steps = self.route(live, name, update)
        except _Permanent as permanent:
            self.fail_step(live, name, attempt, permanent.error)
            return
        except Exception as exc:
            self.fail_step(live, name, attempt, exc)
            return
        data: dict[str, Any] = {"step": name, "tick": tick, "attempt": attempt, "input": input_ref,
                                "update": update, "next": next_steps, "ms": ms, "lease": live.token}
        traces = ctx.traces
        if traces:
            data["trace"] = traces
        _add_records(data, holder)
        joins = wf.join_targets(name)
        if joins:
            data["join"] = joins
        if step.effect:
            data["effect"] = True
            data["key"] = key
            data["compensable"] = resolve_compensation(step, self.registry) is not None
        try:
            self.commit(live, [(K.STEP_COMPLETED, data)])
        except EncodingError:
            # Say which part of the step's output is at fault, then fail the step for good.
            try:
                codec.dumps(update, what=f"output of step {name!r}")
                codec.dumps(traces, what=f"trace of step {name!r}")
                raise
            except EncodingError as precise:
                self.fail_step(live, name, attempt, precise)

    def idempotency_key(self, live: Live, name: str) -> str:
        """(run, step, tick[, rollback epoch]): stable across retries and recoveries of one execution,
        different for each loop iteration and after a rollback."""
        base = f"{live.run_id}:{name}:{live.rs.tick}"
        return base if live.rs.epoch == 0 else f"{base}:{live.rs.epoch}"

    async def reconcile(self, live: Live, name: str, view: Any, key: str | None) -> bool:
        """Settle an effect left in doubt by a crash. True when it was found done (and journaled).

        With a check hook, ask it: it returns the step's update if the effect happened, None if not
        (then the step is re-sent with the same key). Without one, a step that declares its key
        honoured (``resend=True``, the default) is re-sent with the same key; ``resend=False``
        fails the step with ``InDoubtError``.
        """
        step = live.wf.steps[name]
        check = resolve_check(step, self.registry)
        if check is not None:
            ctx = StepContext(run_id=live.run_id, workflow=live.wf.name, step=name, attempt=live.rs.failures.get(name, 0) + 1,
                              tick=live.rs.tick, clock=self.cfg.clock, idempotency_key=key)
            found = check(ctx, view)
            if inspect.isawaitable(found):
                found = await found
            if found is None:
                return False
            update = live.wf.normalise_update(name, found)
            data: dict[str, Any] = {
                "step": name, "tick": live.rs.tick, "attempt": ctx.attempt, "input": self.input_ref(live, name),
                "update": update, "next": self.route(live, name, update), "ms": 0.0, "reconciled": "check",
                "effect": True, "key": key, "compensable": resolve_compensation(step, self.registry) is not None,
            }
            joins = live.wf.join_targets(name)
            if joins:
                data["join"] = joins
            self.commit(live, [(K.STEP_COMPLETED, data)])
            return True
        if step.resend is False:
            self.fail_step(live, name, live.rs.failures.get(name, 0) + 1, InDoubtError(
                f"effect step {name!r} (key {key!r}) may or may not have happened: it has no check hook and "
                "resend=False, so it is not sent again"))
            return True
        return False

    def route(self, live: Live, name: str, update: dict[str, Any]) -> list[str]:
        """Where the step goes next, decided now and journaled with its completion (invariant 3)."""
        wf = live.wf
        if name not in wf.routes and wf.state_model is None:
            return wf.successors(name, None)
        after = dict(live.rs.state)
        # The router sees the update as returned; whether it can be journaled is checked at commit.
        wf.reduce(after, update)
        if wf.state_model is not None:
            try:
                wf.check_state(name, after)
            except Exception as exc:
                raise _Permanent(TypeError(f"step {name!r} produced an invalid state: {exc}")) from exc
        if name not in wf.routes:
            return wf.successors(name, None)
        try:
            return wf.successors(name, wf.view(after))
        except RoutingError as exc:
            raise _Permanent(exc) from exc
        except Exception as exc:
            raise _Permanent(RoutingError(f"router of step {name!r} raised {type(exc).__name__}: {exc}", step=name)) from exc

    def fail_step(self, live: Live, name: str, attempt: int, exc: BaseException,
                  records: list[StepContext] | None = None) -> None:
        """Journal a final failure; follow the failure route if the step has one, else give up."""
        step = live.wf.steps[name]
        info = error_info(exc)
        data: dict[str, Any] = {"step": name, "tick": live.rs.tick, "attempt": max(attempt, 1), "error": info,
                                "retry_in": None, "final": True}
        if records:
            _add_records(data, records)
        if step.on_failure:
            data["route"] = step.on_failure
            self.commit(live, [(K.STEP_FAILED, data)])
            return
        self.commit(live, [(K.STEP_FAILED, data)])
        raise _GaveUp(name, info)

    async def guarded_call(self, step: Any, ctx: StepContext, view: Any, offload: bool) -> Any:
        """A step with ``breaker=``: fail fast while its breaker is open; feed it the outcome."""
        breakers = self.tools.breakers
        tools: StepTools = ctx._step_tools("breaker")
        config = self.tools.registry.config_for(step.breaker) if isinstance(step.breaker, str) else step.breaker
        transition = breakers.before_call(config)  # raises CircuitOpenError when open
        if transition is not None:
            tools.transitions.append(transition)
        try:
            result = await self.call(step, ctx, view, offload)
        except Exception as exc:
            # A permanent tool error means the tool answered: the caller was wrong, not the tool.
            transition = breakers.after_call(config, isinstance(exc, PermanentToolError))
            if transition is not None:
                tools.transitions.append(transition)
            raise
        transition = breakers.after_call(config, True)
        if transition is not None:
            tools.transitions.append(transition)
        return result

    async def call(self, step: Any, ctx: StepContext, view: Any, offload: bool) -> Any:
        """Call the step function: async on the loop; sync inline, or on a thread when running in
        parallel or under a timeout (a thread cannot be stopped: a timed-out sync step is abandoned,
        its result ignored)."""
        timeout = step.timeout
        if step.is_async:
            if timeout is None:
                return await step.fn(ctx, view)
            return await _with_timeout(step.fn(ctx, view), timeout, step.name)
        if timeout is None and not offload:
            return step.fn(ctx, view)
        job = asyncio.to_thread(step.fn, ctx, view)
        if timeout is None:
            return await job
        return await _with_timeout(job, timeout, step.name)


async def _with_timeout(awaitable: Awaitable[Any], timeout: float, name: str) -> Any:
    try:
        async with asyncio.timeout(timeout) as scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            raise StepTimeoutError(f"step {name!r} timed out after {timeout:g}s") from None
        raise


def _add_records(data: dict[str, Any], holder: list[StepContext]) -> None:
    """The attempt's tool calls and breaker transitions go into its journal event."""
    if not holder or holder[0].tools is None:
        return
    tools = holder[0].tools
    if tools.calls:
        data["calls"] = list(tools.calls)
    if tools.transitions:
        data["breakers"] = list(tools.transitions)


def _summary(error: dict[str, Any]) -> dict[str, Any]:
    return {"type": error.get("type"), "message": error.get("message")}

