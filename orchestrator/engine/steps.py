"""Running one step of a tick: its attempts, its journal events, its routing decision.

Per step the cost aims at one commit (docs/guarantees.md, "cost model"): a plain step's start is
written together with its completion (one transaction holding the output, the trace, the timings
and the routing decision); only effects, and steps that ask for it with ``durable_start=True``,
commit a ``StepStarted`` before they run (invariant 4: intent before effect). Routing is decided
when the step completes and journaled with it (invariant 3). A step that fails for good is
journaled as such and either follows its failure route or gives up (``GaveUp``), and the driver
then fails the run or starts its saga.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from compensations import Compensations, resolve_check, resolve_compensation
from orchestrator.engine.context import StepContext, running
from orchestrator.engine.durable import CallGuard, DurableExecution, Suspend
from orchestrator.engine.code_changes import step_code
from orchestrator.engine.events import EventKind
from orchestrator.engine.journal import PURE_REDUCERS, ActiveRun, JournalWriter, StepThreads, UpdateRefused
from orchestrator.engine.retries import StopAttempts, attempts, with_timeout
from orchestrator.engine.services import ToolsForSteps
from orchestrator.engine.views import CowDict, copy_json
from orchestrator.errors import EncodingError, InDoubtError, LoopLimitError, StepTimeoutError, ToolError
from orchestrator.payload import codec
from orchestrator.payload.exceptions import error_record
from store import Store, StoreError
from workflows import reducers
from workflows.errors import RoutingError

__all__ = ["StepRunner", "GaveUp", "cancelling", "refused"]

_log = logging.getLogger("agentsaga.engine")

#: 4xx answers that do not say the request was refused for good: the service may act on it yet.
_UNDECIDED_4XX = frozenset({408, 409, 425, 429})


def refused(exc: BaseException, ctx: StepContext | None) -> bool:
    """Whether an attempt that failed with ``exc`` was refused outright by the service it called: the
    error is a tool error with a 4xx answer (not 408, 409, 425 or 429), and none of the attempt's
    requests was answered with success. A refusal (a declined card) means the effect did not happen."""
    status = getattr(exc, "status", None)
    if not isinstance(exc, ToolError) or not isinstance(status, int) or not 400 <= status < 500 \
            or status in _UNDECIDED_4XX:
        return False
    tools = ctx.used_tools if ctx is not None else None
    for call in (tools.calls if tools is not None else ()):
        answered = call.get("status") if isinstance(call, dict) else None
        if isinstance(answered, int) and answered < 400:
            return False  # an earlier request of the attempt went through
    return True


class _Settled(StopAttempts):
    """An in-doubt attempt was settled (found done) while retrying: no further attempt."""


class GaveUp(StopAttempts):
    """A step failed for good (retries exhausted or a permanent error) and has no failure route.

    ``event`` is its final ``StepFailed``, not yet journaled: the driver commits it together with
    the run's failure (or its saga's start), so a crash can never leave a step that gave up in the
    frontier to be run again (a decision once journaled is never re-made)."""

    def __init__(self, step: str, error: dict[str, Any], event: dict[str, Any]) -> None:
        self.step = step
        self.error = error
        self.event = event
        super().__init__(f"step {step!r} failed: {error['type']}: {error['message']}")


class _CheckRaised(Exception):
    """A check hook raised (``error``): the effect it was asked about stays in doubt."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        super().__init__(str(error))


class _Permanent(Exception):
    """Wraps an error that retrying cannot fix (bad output, routing, loop bound)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        super().__init__(str(error))


class StepRunner:
    """Runs steps of active runs and journals what they did."""

    def __init__(self, journal: JournalWriter, *, store: Store, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[None]], rng: random.Random,
                 compensations: Compensations | None = None, tools: ToolsForSteps | None = None,
                 replay: Any = None) -> None:
        self.journal = journal
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.rng = rng
        self.compensations = compensations
        self.tools = tools
        self.replay = replay

    async def run(self, run: ActiveRun, name: str, *, offload: bool) -> None:
        """Execute step ``name`` of the current tick to completion, a failure route, or giving up."""
        wf = run.workflow
        step = wf.steps[name]
        folded = run.folded
        tick = folded.tick
        prior = folded.failures.get(name, 0)
        bound = step.max_visits or wf.max_visits
        if folded.visits.get(name, 0) >= bound:
            where = "its max_visits" if step.max_visits else f"workflow {wf.name!r} max_visits"
            self.fail(run, name, prior + 1, LoopLimitError(f"step {name!r} would run more than {bound} times ({where})"))
            return
        input_ref = self.input_ref(run, name)
        key = idempotency_key(run, name)  # every step has one (docs/sagas.md); effects journal it
        failure = folded.routed_errors.get(name)
        compensable = step.effect and _has_compensation(step, self.compensations)
        due = folded.retry_at.get(name)
        if due is not None and due > self.clock():
            # A backoff journaled before a crash (a server's Retry-After included) still holds, for
            # the settling of an attempt in doubt too: it is the next attempt's first act, as it is
            # without a crash (a check hook asked at once could find the service still acting).
            await self.sleep(due - self.clock())
        if step.effect and name in folded.in_flight:
            # Invariant 4: the intent is journaled but not the outcome. Never a blind duplicate.
            if await self.reconcile(run, name, key):
                return
        execution = _Execution(self, run, name, tick, prior, key, input_ref, failure, compensable, offload)
        try:
            result = await attempts(execution.attempt_once, step.retry, prior=prior, rng=self.rng, sleep=self.sleep,
                                    on_retry=execution.journal_retry, clock=self.clock)
        except _Settled:
            return  # the in-doubt attempt was found done: its completion is journaled
        except Suspend as suspend:
            # The step waits for a signal or a timer: journal that (the run becomes waiting).
            # Journaled on every suspension (also when a woken step waits again), so the journal alone
            # says the run is waiting (invariant 2); the timeout or wake-up time is kept from the first.
            self.journal.commit(run, [(suspend.kind, dict(suspend.data))])
            raise
        except asyncio.CancelledError:
            self.cancelled(run, execution)
            raise
        except (StoreError, GaveUp):
            raise  # the journal is unreachable or the lease is gone (or the step gave up already)
        except Exception as exc:
            if step.effect and await self.settle_failed(run, name, execution, exc):
                return  # its check hook found the effect done: the step's completion is journaled
            self.fail(run, name, execution.attempt, exc, ctx=execution.ctx)
            return
        attempt = execution.attempt
        # The attempt that completed, from its start: earlier attempts and backoff waits are their
        # StepFailed events' (a step's latency is the same whether or not a crash came between).
        ms = round((time.perf_counter() - execution.started) * 1000, 3)
        ctx = execution.ctx
        try:
            update = wf.normalise_update(name, result)
            next_steps = self.route(run, name, update)
        except _Permanent as permanent:
            self.fail(run, name, attempt, permanent.error)
            return
        except Exception as exc:
            self.fail(run, name, attempt, exc)
            return
        data: dict[str, Any] = {"step": name, "tick": tick, "attempt": attempt, "input": input_ref,
                                "update": update, "next": next_steps, "ms": ms, "lease": run.token}
        traces = ctx.traces
        if traces:
            data["trace"] = traces
        _add_records(data, ctx)
        joins = wf.join_targets(name)
        if joins:
            data["join"] = joins
        if step.effect:
            data["effect"] = True
            data["key"] = key
            data["compensable"] = resolve_compensation(step, self.compensations) is not None
        if name not in run.folded.code:
            data["code"] = step_code(step.fn)  # the code that ran, recorded at its first completion
        try:
            await self.journal.acommit(run, [(EventKind.STEP_COMPLETED, data)])
        except UpdateRefused as refused:  # a reducer cannot merge the update: nothing was written
            self.fail(run, name, attempt, refused.error)
        except EncodingError:
            # Say which part of the step's output is at fault, then fail the step for good.
            try:
                codec.dumps(update, what=f"output of step {name!r}")
                codec.dumps(traces, what=f"trace of step {name!r}")
                raise
            except EncodingError as precise:
                self.fail(run, name, attempt, precise)

    @staticmethod
    def input_ref(run: ActiveRun, name: str) -> dict[str, Any]:
        """What the step read: the fields it declared (``reads=``), else the seq its input state was formed at."""
        step = run.workflow.steps[name]
        if step.reads is not None:
            state = run.folded.state
            return {"reads": {k: state.get(k) for k in step.reads}}
        return {"state_at": run.folded.state_seq}

    async def reconcile(self, run: ActiveRun, name: str, key: str | None) -> bool:
        """Settle an effect left in doubt (a crash, a timeout). True when it was settled (found done
        and journaled, or failed as in doubt); False when it is to be sent again with the same key.

        With a check hook, ask it: it returns the step's update if the effect happened, None if not
        (then the step is re-sent with the same key). Without one: ``resend=True`` re-sends,
        ``resend=False`` fails the step with ``InDoubtError``, and the default re-sends only if the
        attempt's idempotency key had left the process (read, or sent by ``ctx.http``): a call made
        without it could not be recognised by the other side, so re-sending could do it twice.
        """
        wf = run.workflow
        step = wf.steps[name]
        folded = run.folded
        attempt = folded.failures.get(name, 0) + 1
        if resolve_check(step, self.compensations) is not None:
            try:
                return await self.ask_check(run, name, key, attempt)
            except _Permanent as permanent:  # what the hook answered cannot be the step's update
                self.fail(run, name, attempt, permanent.error)
                return True
            except _CheckRaised as raised:
                # The effect stays in doubt: say so at the step, visibly, instead of leaving the run stuck.
                exc = raised.error
                why = f"its check hook raised {type(exc).__name__}: {exc}"
                doubt = InDoubtError(f"effect step {name!r} (key {key!r}) may or may not have happened, and {why}; "
                                     "it is not sent again", reason=why)
                doubt.__cause__ = exc
                self.fail(run, name, attempt, doubt)
                return True
        if step.resend is True:
            return False
        if step.resend is False:
            self.fail(run, name, attempt, InDoubtError(
                f"effect step {name!r} (key {key!r}) may or may not have happened: it has no check hook and "
                "resend=False, so it is not sent again", reason="it has no check hook and declares resend=False"))
            return True
        intent = folded.in_flight.get(name, {})
        if intent.get("key_issued"):
            return False  # its key went out with the call: the other side recognises a re-send
        how = ("its attempt was cancelled while the step's function ran" if intent.get("cancelled")
               else "it may or may not have happened")
        self.fail(run, name, attempt, InDoubtError(
            f"effect step {name!r}: {how}, and its idempotency key {key!r} had not left the "
            "process (ctx.idempotency_key was not read, ctx.http had sent nothing), so a call made another way "
            "could be done twice by a re-send. Give the step a check= hook that looks the effect up, or declare "
            "resend=True if it reaches the world only through ctx.http (every request carries the key) or its "
            "call is idempotent by other means",
            reason=f"{'cancelled while it ran' if intent.get('cancelled') else 'interrupted'}, its idempotency key "
                   f"not sent: the service does not know the key, look the effect up by what the step sent"))
        return True

    async def ask_check(self, run: ActiveRun, name: str, key: str | None, attempt: int) -> bool:
        """Ask the step's check hook whether its effect happened. True: it did, and the step's
        completion (the hook's update, ``reconciled: check``) is journaled, or the step failed when
        that update cannot be journaled; False: it did not. Raises ``_CheckRaised`` when the hook raised, and
        ``_Permanent`` (an ``InDoubtError``) when what it answered cannot be the step's update."""
        wf = run.workflow
        step = wf.steps[name]
        folded = run.folded
        check = resolve_check(step, self.compensations)
        assert check is not None
        ctx = StepContext(run_id=run.run_id, workflow=wf.name, step=name, attempt=attempt, tick=folded.tick,
                          clock=self.clock, idempotency_key=key,
                          tools=_LookUps(self.tools) if self.tools is not None else None)
        try:
            found = check(ctx, state_view(wf, folded.state))
            if inspect.isawaitable(found):
                found = await found
        except Exception as exc:
            raise _CheckRaised(exc) from exc
        finally:
            if ctx.used_tools is not None:
                await ctx.used_tools.aclose()
        if found is None:
            return False
        try:
            update = wf.normalise_update(name, found)
            next_steps = self.route(run, name, update)
        except _Permanent:
            raise  # the caller fails the step (in doubt, when it failed for good: settle_failed)
        except Exception as exc:
            raise _Permanent(_bad_check(name, key, exc)) from exc
        data: dict[str, Any] = {
            "step": name, "tick": folded.tick, "attempt": attempt, "input": self.input_ref(run, name),
            "update": update, "next": next_steps, "ms": 0.0, "reconciled": "check",
            "effect": True, "key": key, "compensable": resolve_compensation(step, self.compensations) is not None,
        }
        joins = wf.join_targets(name)
        if joins:
            data["join"] = joins
        try:
            self.journal.commit(run, [(EventKind.STEP_COMPLETED, data)])
        except UpdateRefused as refused:
            self.fail(run, name, attempt, refused.error)
        except EncodingError:
            # What the hook found cannot be journaled: say where, and fail the step (not the run's driver).
            try:
                codec.dumps(update, what=f"the update the check hook of effect step {name!r} returned")
                raise
            except EncodingError as precise:
                raise _Permanent(_bad_check(name, key, precise)) from None
        return True

    async def settle_failed(self, run: ActiveRun, name: str, execution: _Execution, exc: Exception) -> bool:
        """An effect step failed for good. If its effect may have taken effect anyway (``doubt``) and
        the step has a check hook, ask the hook: found done, the step is settled as completed, like an
        in-doubt attempt after a crash or a timeout; not done, the step fails as it is, saying the hook
        found nothing; the hook raising leaves the failure in doubt, saying so. True when the step was
        settled here (completed, routed, or ``GaveUp`` raised); False when there is nothing to ask
        (no doubt, or no hook): the caller fails the step."""
        doubt = self.doubt(run, name, exc, execution.ctx)
        if doubt is None or resolve_check(run.workflow.steps[name], self.compensations) is None:
            return False
        try:
            if await self.ask_check(run, name, doubt["key"], execution.attempt):
                return True
        except _CheckRaised as raised:
            reason = f"{doubt['reason']}; its check hook raised {type(raised.error).__name__}: {raised.error}"
            self.fail(run, name, execution.attempt, exc, ctx=execution.ctx, doubt={**doubt, "reason": reason})
            return True  # (fail raised GaveUp, or took the failure route)
        except _Permanent as permanent:  # the hook's update cannot be routed: the step fails, still in doubt
            self.fail(run, name, execution.attempt, permanent.error, ctx=execution.ctx, doubt=doubt)
            return True
        self.fail(run, name, execution.attempt, exc, ctx=execution.ctx, doubt=False, checked="not done")
        return True

    def doubt(self, run: ActiveRun, name: str, exc: BaseException, ctx: StepContext | None) -> dict[str, Any] | None:
        """Whether an effect step failing for good with ``exc`` may have taken effect anyway:
        ``{"key", "reason"}``, or None. It may when its idempotency key left the process in an attempt
        of this execution (the key is sent with the call, or read to be sent) or an attempt timed out
        after it started, unless the last attempt was refused outright (``refused``); and always
        when the failure is itself an ``InDoubtError`` (a crash, a timeout or a cancellation that
        could not be settled)."""
        if self.replay is not None:
            # Replayed from a cassette: every durable call (ctx.http's too) was answered from it, and
            # nothing the engine sends left the process: no service can have acted.
            return None
        folded = run.folded
        intent = folded.in_flight.get(name) or {}
        key = intent.get("key") or folded.issued.get(name) or idempotency_key(run, name)
        if isinstance(exc, InDoubtError):
            return {"key": key, "reason": f"the outcome of an attempt could not be settled: "
                                          f"{exc.reason or 'it was neither checked nor sent again'}"}
        if intent.get("in_doubt"):
            return {"key": key, "reason": "its last attempt timed out after it started, and may have reached the "
                                          "outside world"}
        if not (intent.get("key_issued") or name in folded.issued):
            return None  # no key left: nothing the engine can see reached the world
        if refused(exc, ctx):
            return None
        if any(e["step"] == name and e["tick"] == folded.tick and e["call"] != -1 for e in folded.effects):
            # Its effects were journaled call by call (a tool loop's effect tools, durable calls with
            # ``effect=``): the step's key was read to derive theirs, each completed one is in the
            # journal and compensated with the run, so the step's own key is no effect of its own.
            return None
        return {"key": key, "reason": f"its idempotency key had left the process, and it failed with "
                                      f"{type(exc).__name__}: the service may have acted before the failure"}

    @staticmethod
    def route(run: ActiveRun, name: str, update: dict[str, Any]) -> list[str]:
        """Where the step goes next, decided now and journaled with its completion (invariant 3)."""
        wf = run.workflow
        if name not in wf.routes and wf.state_model is None:
            return wf.successors(name, None)
        # The router sees the update as returned; whether it can be journaled is checked at commit.
        after = preview(wf, run.folded.state, update)
        if wf.state_model is not None:
            try:
                wf.check_state(name, after)
            except Exception as exc:
                raise _Permanent(TypeError(f"step {name!r} produced an invalid state: {exc}")) from exc
        if name not in wf.routes:
            return wf.successors(name, None)
        try:
            return wf.successors(name, wf.view(after) if wf.state_model is not None else CowDict(after))
        except RoutingError as exc:
            raise _Permanent(exc) from exc
        except Exception as exc:
            raise _Permanent(RoutingError(f"router of step {name!r} raised {type(exc).__name__}: {exc}", step=name)) from exc

    def fail(self, run: ActiveRun, name: str, attempt: int, exc: BaseException,
             ctx: StepContext | None = None, *, doubt: dict[str, Any] | bool | None = None,
             checked: str | None = None) -> None:
        """Journal a final failure; follow the failure route if the step has one, else give up.

        An effect step's failure carries ``doubt`` (its key and why) when its effect may have taken
        effect anyway (``doubt`` None: decided here; False: it did not, a check hook said so)."""
        step = run.workflow.steps[name]
        error = error_record(exc)
        data: dict[str, Any] = {"step": name, "tick": run.folded.tick, "attempt": max(attempt, 1), "error": error,
                                "retry_in": None, "final": True}
        if step.journals_start and isinstance(exc, StepTimeoutError):
            data["in_doubt"] = True
        if doubt is None and step.effect:
            doubt = self.doubt(run, name, exc, ctx)
        if doubt:
            data["doubt"] = doubt
        if checked is not None:
            data["checked"] = checked
        _add_records(data, ctx)
        if step.on_failure:
            data["route"] = step.on_failure
            self.journal.commit(run, [(EventKind.STEP_FAILED, data)])
            return
        raise GaveUp(name, error, data)

    async def warm_tools(self) -> None:
        """Have the steps' tools make what they share (``ToolsForSteps.warm``) before the timer of an
        attempt starts: once per Orchestrator, on a thread (it imports and builds clients, blocking),
        a plain read afterwards. A failure is left to the step's own first call, which journals it."""
        tools = self.tools
        if tools is None or getattr(tools, "warmed", True):
            return  # made already, or tools that make nothing ahead
        try:
            await asyncio.to_thread(tools.warm)
        except Exception as exc:  # noqa: BLE001 (the step's first call meets it again, and journals it)
            _log.debug("making the steps' shared tools ahead of a timed attempt failed: %s: %s",
                       type(exc).__name__, exc)

    def _key_issuer(self, run: ActiveRun, name: str, tick: int, attempt: int) -> Callable[[], None]:
        """Journals ``KeyIssued`` once for the attempt, before its key first leaves the process."""
        issued = threading.Event()

        def issue() -> None:
            if issued.is_set():
                return
            with run.lock:
                if not issued.is_set():
                    self.journal.commit(run, [(EventKind.KEY_ISSUED, {"step": name, "tick": tick, "attempt": attempt})])
                    issued.set()

        return issue

    @staticmethod
    async def call(step: Any, ctx: StepContext, view: Any, offload: bool, execution: _Execution | None = None) -> Any:
        """Call the step function: async on the loop; sync inline, or on a thread when running in
        parallel or under a timeout.

        A thread cannot be stopped. A sync step past its timeout is abandoned: it runs on a daemon
        thread of its own (the caller is not held until it returns), and its context is revoked, so
        nothing it does afterwards reaches the journal or leaves through ``ctx`` (durable calls,
        ``ctx.http``); what it did before is in doubt, like after a crash (docs/guarantees.md).
        Each such thread is counted in its run's ``threads`` while it runs: a cancelled drive gives
        the lease back only once none is left (engine/driver.py)."""
        timeout = step.timeout
        with running(ctx):  # current_step() for integrations; tasks and threads below copy it
            if step.is_async:
                if timeout is None:
                    return await step.fn(ctx, view)
                return await with_timeout(step.fn(ctx, view), timeout, step.name, on_timeout=ctx.revoke)
            if timeout is None and not offload:
                return step.fn(ctx, view)
            fn = step.fn
            if execution is not None:
                run = execution.run
                if run.threads is None:
                    run.threads = StepThreads()
                fn = execution.thread = _Counted(fn, run.threads, ctx)
            if timeout is None:
                return await asyncio.to_thread(fn, ctx, view)
            return await with_timeout(_on_daemon_thread(fn, ctx, view, name=step.name), timeout, step.name,
                                      on_timeout=ctx.revoke)

    def cancelled(self, run: ActiveRun, execution: _Execution) -> None:
        """The task driving the run was cancelled during this step: journal how far its attempt got
        (``StepCancelled``), so a resume knows what may have left the process.

        An attempt whose function was not called yet withdraws its intent (nothing can have left:
        not in doubt). One whose function ran is in doubt exactly as after a crash, and is settled
        the same way on resume. A sync step still running on a thread cannot be stopped: its context
        is cancelled (nothing more leaves through ``ctx`` or reaches the journal) and the driver keeps
        the run's lease until the thread ends. Journaling is best effort: a store that fails here
        leaves the journal as a crash would, and the cancellation goes on."""
        if not execution.live:
            return  # between attempts (a backoff wait): the journal already says where the step is
        ctx = execution.ctx
        if ctx is not None:
            ctx.cancel()
        data: dict[str, Any] = {"step": execution.name, "tick": execution.tick, "attempt": execution.attempt,
                                "called": execution.called}
        thread = execution.thread
        if thread is not None and not thread.done:
            data["still_running"] = True  # on a thread that may still act: the lease stays until it ends
        if execution.step.effect:
            intent = run.folded.in_flight.get(execution.name) or {}
            data["key_left"] = bool(intent.get("key_issued"))
        try:
            self.journal.commit(run, [(EventKind.STEP_CANCELLED, data)])
        except Exception as exc:  # noqa: BLE001 (the cancellation must go on; the journal is as a crash leaves it)
            _log.warning("run %s: step %s was cancelled and that could not be journaled: %s: %s", run.run_id,
                         execution.name, type(exc).__name__, exc)


class _Execution:
    """One execution of a step, across its attempts: what ``StepRunner.run`` hands the retry loop.

    A class, not closures over ``run``'s locals: a thousand runs each wait in a step at once, and
    every object a waiting step holds is one more for the garbage collector to walk."""

    __slots__ = ("runner", "run", "name", "step", "tick", "prior", "key", "input_ref", "failure", "compensable",
                 "offload", "attempt", "ctx", "started", "live", "called", "thread", "cancels")

    def __init__(self, runner: StepRunner, run: ActiveRun, name: str, tick: int, prior: int, key: str,
                 input_ref: dict[str, Any], failure: dict[str, Any] | None, compensable: bool, offload: bool) -> None:
        self.runner, self.run, self.name, self.tick, self.offload = runner, run, name, tick, offload
        self.step = run.workflow.steps[name]
        self.prior, self.key, self.input_ref, self.failure, self.compensable = prior, key, input_ref, failure, compensable
        self.attempt = prior
        #: the context of the latest attempt (its traces and tool calls go into the step's event)
        self.ctx: StepContext | None = None
        #: when the latest attempt started (perf_counter)
        self.started = time.perf_counter()
        #: whether the latest attempt has begun and not ended (a cancellation then ends it), and whether
        #: the step's function was called in it
        self.live = False
        self.called = False
        #: the latest attempt's sync function on a thread (``_Counted``), if it runs on one
        self.thread: _Counted | None = None
        #: cancellations already pending for the task running the step when it began: the drive's
        #: (a step of a parallel tick runs in a task of its own, which starts with none)
        self.cancels = 0 if offload else run.cancels

    async def attempt_once(self) -> Any:
        runner, run, name, step = self.runner, self.run, self.name, self.step
        if step.effect and self.attempt > self.prior and run.folded.in_flight.get(name, {}).get("in_doubt"):
            # The previous attempt timed out with its effect in doubt: settle it before another.
            if await runner.reconcile(run, name, self.key):
                raise _Settled
        if step.timeout is not None:
            # What the process makes once for every step's first call (the shared HTTP clients) is
            # made before this attempt's timer starts: it is not the attempt's time to spend.
            await runner.warm_tools()
        if cancelling() > self.cancels:
            raise asyncio.CancelledError  # asked for while the run was between awaits: nothing begins
        self.attempt += 1
        this = self.attempt
        self.started = time.perf_counter()
        self.live, self.called, self.thread = True, False, None
        if step.journals_start:
            # Intent before effect, for every attempt (invariant 4): a crash during a retry finds
            # this attempt in flight and reconciles it; it is never re-sent blindly.
            started: dict[str, Any] = {"step": name, "tick": self.tick, "attempt": this, "input": self.input_ref}
            if step.effect:
                started["key"] = self.key
            await runner.journal.acommit(run, [(EventKind.STEP_STARTED, started)])
        ctx = self.ctx = StepContext(
            run_id=run.run_id, workflow=run.workflow.name, step=name, attempt=this, tick=self.tick,
            clock=runner.clock, failure=self.failure, idempotency_key=self.key, tools=runner.tools,
            on_key=runner._key_issuer(run, name, self.tick, this) if step.effect else None,
            # Not a method of this execution, which holds the context: that would be a cycle.
            durable=functools.partial(_durable_calls, runner, run, name, self.tick, self.compensable))
        # A fresh view each attempt: what an earlier attempt did to its view is gone with it.
        view = state_view(run.workflow, run.folded.state)
        if cancelling() > self.cancels:
            # A cancellation was asked for that this task has not met yet (asked by code of this task
            # as it committed, an observer say, or by another as it wrote without waiting): stop
            # before the function is called, so the journal can say that nothing left.
            raise asyncio.CancelledError
        self.called = True
        try:
            if step.breaker is None:
                result = await runner.call(step, ctx, view, self.offload, self)
            else:
                result = await self._behind_breaker(ctx, view)
        except asyncio.CancelledError:
            raise  # the attempt is still live: StepRunner.cancelled journals how far it got
        except BaseException:
            self.live = False
            raise
        finally:
            if ctx.used_tools is not None:
                await ctx.used_tools.aclose()
        self.live = False
        return result

    async def _behind_breaker(self, ctx: StepContext, view: Any) -> Any:
        # (Apart from attempt_once: the lambda makes closure cells of its locals, every attempt.)
        step, runner = self.step, self.runner
        return await ctx.tools.guard(step.breaker, lambda: runner.call(step, ctx, view, self.offload, self))

    def journal_retry(self, exc: BaseException | None, delay: float) -> None:
        runner = self.runner
        data = {
            "step": self.name, "tick": self.tick, "attempt": self.attempt,
            "error": error_record(exc) if exc else {"type": "unknown", "message": ""},
            "retry_in": round(delay, 6), "retry_at": round(runner.clock() + delay, 6), "final": False,
        }
        if self.step.journals_start and isinstance(exc, StepTimeoutError):
            data["in_doubt"] = True
        _add_records(data, self.ctx)
        runner.journal.commit(self.run, [(EventKind.STEP_FAILED, data)])


def _durable_calls(runner: StepRunner, run: ActiveRun, name: str, tick: int, compensable: bool,
                   ctx: StepContext) -> DurableExecution:
    """An attempt's durable calls, signals and timers (made on the first use of one)."""
    return DurableExecution(runner.journal, run, name, tick, signals=runner.store.signals, clock=runner.clock,
                            replay=runner.replay, attempt=ctx.attempt, guard=CallGuard(ctx.guard, runner.store, run),
                            compensable=compensable)


class _Counted:
    """A sync step function run on a thread, counted in its run's ``threads`` while it runs. If its
    attempt was cancelled before the thread got to it, it does not run at all (the thread counts
    itself first and then looks, and the canceller cancels the context first and then counts: so
    either the function never runs, or the count holds the lease until it returns)."""

    __slots__ = ("fn", "threads", "ctx", "done")

    def __init__(self, fn: Callable[..., Any], threads: StepThreads, ctx: StepContext) -> None:
        self.fn, self.threads, self.ctx, self.done = fn, threads, ctx, False

    def __call__(self, *args: Any) -> Any:
        self.threads.enter()
        try:
            if self.ctx.cancelled:
                raise asyncio.CancelledError(f"step {self.ctx.step!r} was cancelled before its thread started")
            return self.fn(*args)
        finally:
            self.done = True
            self.threads.leave()


def cancelling() -> int:
    """How many cancellations of the current task are pending (0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def _on_daemon_thread(fn: Callable[..., Any], *args: Any, name: str) -> Awaitable[Any]:
    """``fn(*args)`` on a daemon thread of its own; unlike the loop's default executor, a thread that
    never returns does not keep ``asyncio.run`` (and so ``orc.run``) from returning."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    context = contextvars.copy_context()  # a bare thread starts with an empty context

    def target() -> None:
        try:
            outcome: tuple[bool, Any] = (True, context.run(fn, *args))
        except BaseException as exc:  # handed to the awaiting task, whatever it is
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:
            pass  # the loop is gone: the step was abandoned and nobody waits for its outcome

    threading.Thread(target=target, name=f"agentsaga-step-{name}", daemon=True).start()
    return future


class _LookUps:
    """A check hook's tools: ``ctx.http`` / ``ctx.ahttp`` to look the effect up at its service, sending
    no idempotency key (a look-up must not be taken for the effect itself; the hook reads
    ``ctx.idempotency_key`` and sends it where the service's look-up wants it)."""

    def __init__(self, tools: ToolsForSteps) -> None:
        self._tools = tools

    @property
    def warmed(self) -> bool:
        return self._tools.warmed

    def warm(self) -> None:
        self._tools.warm()

    def for_step(self, *, key: str | None, attempt: int, durable: Any, on_key: Any = None,
                 before_send: Any = None) -> Any:
        return self._tools.for_step(key=None, attempt=attempt, durable=None)


def _has_compensation(step: Any, compensations: Compensations | None) -> bool:
    try:
        return resolve_compensation(step, compensations) is not None
    except Exception:  # a registry name that does not resolve: reported when the step completes
        return False


def _bad_check(name: str, key: str | None, exc: Exception) -> InDoubtError:
    """A check hook answered with something that is not an update the journal can hold: the effect
    stays in doubt, visibly, instead of the run's driver failing on every resume."""
    why = f"its check hook returned what cannot be its update ({type(exc).__name__}: {exc})"
    doubt = InDoubtError(f"effect step {name!r} (key {key!r}) may or may not have happened: {why}; it is not "
                         "sent again", reason=why)
    doubt.__cause__ = exc
    return doubt


def state_view(wf: Any, state: dict[str, Any]) -> Any:
    """What a step sees: a copy-on-access view of a dict state (``engine.views``): nothing it does
    to it reaches ``state``, and it costs what the step reaches, not the whole state. A typed state
    is validated from a deep copy (the model shares what it is given)."""
    if wf.state_model is None:
        return CowDict(state)
    return wf.view(copy_json(state))


def preview(wf: Any, state: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``state`` with ``update`` merged, for the router, leaving ``state`` untouched: a shallow copy
    whose fields the update touches are deep-copied first unless their reducer is a pure built-in
    (a user's reducer may change the current value in place). A typed state gets a whole deep copy."""
    if wf.state_model is not None:
        after = copy_json(state)
    else:
        after = dict(state)
        pure = wf.reducers
        for key in update:
            if key in after and pure.get(key, reducers.replace) not in PURE_REDUCERS:
                after[key] = copy_json(after[key])
    wf.reduce(after, copy_json(update))
    return after


def idempotency_key(run: ActiveRun, name: str) -> str:
    """(run, step, tick[, rollback epoch]): stable across retries and recoveries of one execution,
    different for each loop iteration and after a rollback.

    The epoch is written ``:r{n}``: request ``i`` of an execution sends ``{key}:{i}`` (docs/sagas.md),
    so a bare ``:{n}`` made the key of the execution after the n-th rollback that of request ``n`` of
    the execution it undid, and the service answered the new request with the undone booking. An
    execution that journaled its key already (its intent in flight, or the key issued by an earlier
    attempt) keeps that key, whatever this code would make of it now."""
    folded = run.folded
    kept = (folded.in_flight.get(name) or {}).get("key") or folded.issued.get(name)
    if kept is not None:
        return kept
    base = f"{run.run_id}:{name}:{folded.tick}"
    return base if folded.epoch == 0 else f"{base}:r{folded.epoch}"


def _add_records(data: dict[str, Any], ctx: StepContext | None) -> None:
    """The attempt's tool calls and breaker transitions go into its journal event."""
    tools = ctx.used_tools if ctx is not None else None
    if tools is None:
        return
    if tools.calls:
        data["calls"] = list(tools.calls)
    if tools.transitions:
        data["breakers"] = list(tools.transitions)
