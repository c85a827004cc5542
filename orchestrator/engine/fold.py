"""``fold``: the one pure function from events to a run's state (invariant 2).

``RunState`` holds everything needed to continue a run: the user state and the scheduler's position
(tick, frontier, completions within the tick, failed attempts, visit counts, join arrivals). It is
plain JSON data so that a snapshot is ``canonical_dumps(run_state.to_json())`` and
``fold(snapshot_n + events after n) == fold(all events)`` holds exactly.

``apply`` never calls user code except the workflow's reducers (which must be deterministic); it
never asks a router: routing decisions are read from the journal (invariant 3).

The fold table at the bottom (``_APPLY``) has one handler per event kind of ``events.EventKind``,
grouped as the kinds are: a run's life, steps, durable calls and waits inside a step, sagas.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.engine.events import EventKind

__all__ = ["RunState", "apply", "fold"]

Reduce = Callable[[dict[str, Any], Mapping[str, Any]], None]


def _replace_all(state: dict[str, Any], update: Mapping[str, Any]) -> None:
    state.update(update)


@dataclass(slots=True)
class RunState:
    """What the events of a run add up to."""

    seq: int = 0
    status: str = "pending"
    state: dict[str, Any] = field(default_factory=dict)
    tick: int = 0
    frontier: list[str] = field(default_factory=list)
    #: completions in the current tick: step -> {"update", "next", "join"}
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: failed attempts in the current tick: step -> count
    failures: dict[str, int] = field(default_factory=dict)
    #: completed executions per step over the whole run (loop bounds)
    visits: dict[str, int] = field(default_factory=dict)
    #: join target -> sources that arrived since it last ran
    arrivals: dict[str, list[str]] = field(default_factory=dict)
    #: seq at which the current tick's input state was formed (a step's input, by reference)
    state_seq: int = 0
    #: the failure that routed to a step via on_failure: step -> error
    routed_errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: durable starts not yet completed (effects in doubt after a crash): step -> StepStarted data
    in_flight: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    #: completed effects, oldest first (see compensations.EffectRecord for the fields)
    effects: list[dict[str, Any]] = field(default_factory=list)
    #: the saga in progress (reason, after_seq, error, ...), or None
    saga: dict[str, Any] | None = None
    #: incremented by each rollback, so effects re-made after one get fresh idempotency keys
    epoch: int = 0
    #: durable calls of steps not yet completed: step -> {position: {kind, request, response}}, the
    #: position as text: "0", "1", ... and, for a call made inside call 1, "1.0", "1.1", ...
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: signal waits in progress: "step:name" -> {timeout_at}, with "timed_out": True once the step was
    #: told its timeout passed (``WaitTimedOut``)
    waits: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: signals received by steps not yet completed: "step:name" -> data
    received: dict[str, Any] = field(default_factory=dict)
    #: durable timers of steps not yet completed: "step:index" -> wake_at ("step:1.0" inside call 1)
    timers: dict[str, float] = field(default_factory=dict)
    #: when the next attempt of a failed step may start (its journaled backoff): step -> epoch seconds
    retry_at: dict[str, float] = field(default_factory=dict)
    #: the hash of each step's code as it first ran in this run (or as a CodeChanged accepted): step -> hash
    code: dict[str, str] = field(default_factory=dict)
    #: effect steps of the current tick whose idempotency key has left the process (``KeyIssued``) in
    #: an attempt that is over: step -> key. A later attempt with the same key, crashed before it sent
    #: anything, is re-sent with it: the other side already knows that key (invariant 4).
    issued: dict[str, str] = field(default_factory=dict)
    #: effects that may have taken effect although their step failed for good (its key had left the
    #: process, and no check hook settled it): {"seq", "step", "key", "tick", "reason"}, oldest first.
    #: Never compensated (there is no result to undo them with): the run's outcome lists them.
    doubts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "status": self.status,
            "state": self.state,
            "tick": self.tick,
            "frontier": self.frontier,
            "done": self.done,
            "failures": self.failures,
            "visits": self.visits,
            "arrivals": self.arrivals,
            "state_seq": self.state_seq,
            "routed_errors": self.routed_errors,
            "in_flight": self.in_flight,
            "error": self.error,
            "effects": self.effects,
            "saga": self.saga,
            "epoch": self.epoch,
            "calls": self.calls,
            "waits": self.waits,
            "received": self.received,
            "timers": self.timers,
            "retry_at": self.retry_at,
            "code": self.code,
            # Only when there is one: snapshots written before the field existed compare equal.
            **({"issued": self.issued} if self.issued else {}),
            **({"doubts": self.doubts} if self.doubts else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunState:
        """From ``to_json`` output. Takes ownership of ``data`` (pass a fresh decode, not a shared dict)."""
        return cls(**data)

    def copy(self) -> RunState:
        return RunState.from_json(copy.deepcopy(self.to_json()))

    @property
    def pending(self) -> list[str]:
        """Steps of the current tick that have not completed."""
        return [s for s in self.frontier if s not in self.done]


def _run_started(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.status = "running"
    run.state = dict(data.get("input") or {})
    run.frontier = list(data["start"])
    run.state_seq = seq


def _code_changed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    for step, change in data["steps"].items():
        run.code[step] = change["now"]


def _migrated(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.state = dict(data["state"])
    run.state_seq = seq


def _step_started(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    intent = dict(data)
    key = data.get("key")
    if key is not None:
        earlier = run.in_flight.get(step)
        # The key went out in an earlier attempt (or before a crash, in this one started again):
        # that stays true of every attempt that carries it.
        if run.issued.get(step) == key or (earlier is not None and earlier.get("key") == key
                                            and earlier.get("key_issued")):
            intent["key_issued"] = True
    run.in_flight[step] = intent


def _key_issued(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    intent = run.in_flight.get(step)
    if intent is not None:
        intent["key_issued"] = True
        if intent.get("key") is not None:
            run.issued[step] = intent["key"]


def _step_completed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    if data.get("effect"):
        record: dict[str, Any] = {
            "seq": seq, "step": step, "tick": run.tick, "branch": run.frontier.index(step) if step in run.frontier else 0,
            "call": -1, "name": step, "key": data["key"], "result": data["update"],
            "compensable": bool(data.get("compensable")), "compensated": False, "attempts": 0,
        }
        # The effects its calls made (tools of a tool loop) are undone with the step, by its
        # compensation: they join its record instead of standing alone (never compensated twice).
        mine = [e for e in run.effects if e["step"] == step and e["call"] != -1 and e["tick"] == run.tick
                and not e["compensated"] and e.get("epoch", 0) == run.epoch]
        if mine:
            record["calls"] = [{"index": e["call"], "name": e["name"], "key": e["key"], "result": e["result"]}
                               for e in mine]
            run.effects = [e for e in run.effects if not any(e is m for m in mine)]
        run.effects.append(record)
    if "code" in data:
        run.code[step] = data["code"]
    run.done[step] = {"update": data["update"], "next": list(data["next"]), "join": data.get("join")}
    run.failures.pop(step, None)
    run.in_flight.pop(step, None)
    run.issued.pop(step, None)
    run.retry_at.pop(step, None)
    run.visits[step] = run.visits.get(step, 0) + 1
    _forget_step(run, step)
    _maybe_advance(run, seq, reduce)


def _forget_step(run: RunState, step: str, *, keep_waits: bool = False) -> None:
    """A step execution ended: its durable calls (and, when it completed, its waits) are done with."""
    run.calls.pop(step, None)
    if keep_waits or not (run.waits or run.received or run.timers):
        return
    prefix = step + ":"
    for table in (run.waits, run.received, run.timers):
        for key in [k for k in table if k.startswith(prefix)]:
            del table[key]


def _step_cancelled(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    intent = run.in_flight.get(step)
    if intent is None:
        return  # a step with no durable start: nothing was promised, the step just runs again
    if not data.get("called"):
        # Cancelled before the step's function was called: nothing of the attempt can have left the
        # process, so its intent is withdrawn (not in doubt). Not a failed attempt either.
        run.in_flight.pop(step, None)
    else:
        # The function ran: what it did is in doubt as after a crash (invariant 4), settled on resume.
        intent["cancelled"] = True


def _step_failed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    doubt = data.get("doubt") if data.get("final") else None
    if doubt:
        # The step gave up, but its effect may stand: recorded as in doubt (its intent, if one was
        # still in flight, is this record now).
        run.in_flight.pop(step, None)
        run.doubts.append({"seq": seq, "step": step, "key": doubt.get("key"), "tick": run.tick,
                           "reason": doubt.get("reason")})
    elif data.get("in_doubt") and step in run.in_flight:
        # The attempt timed out while it may have reached the outside world: its intent stays in
        # flight, so the next attempt (or a recovery) reconciles it instead of re-sending blindly.
        run.in_flight[step]["in_doubt"] = True
    else:
        run.in_flight.pop(step, None)
    if data.get("final"):
        run.issued.pop(step, None)
    run.retry_at.pop(step, None)
    if not data.get("final") and data.get("retry_at") is not None:
        run.retry_at[step] = data["retry_at"]
    # A retry reuses the durable calls (and signals) of earlier attempts; a final failure ends them.
    if data.get("final"):
        _forget_step(run, step)
    route = data.get("route")
    if data.get("final") and route:
        # The failure route counts as the step's completion with no update.
        run.done[step] = {"update": {}, "next": [route], "join": None}
        run.failures.pop(step, None)
        run.visits[step] = run.visits.get(step, 0) + 1
        run.routed_errors[route] = {"step": step, **data["error"]}
        _maybe_advance(run, seq, reduce)
    else:
        run.failures[step] = run.failures.get(step, 0) + 1


def _maybe_advance(run: RunState, seq: int, reduce: Reduce) -> None:
    """When every step of the tick has completed: merge updates in frontier order, move on."""
    frontier = run.frontier
    done = run.done
    if any(s not in done for s in frontier):
        return
    nxt: list[str] = []
    for step in frontier:
        entry = done[step]
        if entry["update"]:
            reduce(run.state, entry["update"])
        run.routed_errors.pop(step, None)
        for target in entry["next"]:
            if target not in nxt:
                nxt.append(target)
        for target, sources in (entry.get("join") or {}).items():
            arrived = run.arrivals.setdefault(target, [])
            if step not in arrived:
                arrived.append(step)
            if all(s in arrived for s in sources):
                del run.arrivals[target]
                if target not in nxt:
                    nxt.append(target)
    run.frontier = nxt
    run.done = {}
    run.failures = {}
    run.tick += 1
    run.state_seq = seq


def _run_ended(status: str) -> Callable[[RunState, int, Mapping[str, Any], Reduce], None]:
    def apply_end(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
        run.status = status
        if data.get("error"):
            run.error = dict(data["error"])

    return apply_end


def _resumed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    if run.status == "waiting":
        run.status = "running"


def _no_change(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    return None



# -- inside a step: durable calls, signals, timers ------------------------------------------------
def _call_completed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    run.calls.setdefault(step, {})[str(data["index"])] = {
        "kind": data["kind"], "request": data["request"], "response": data["response"]}
    effect = data.get("effect")
    if effect:
        # A call that changed the outside world (an effect tool): an effect of its own from the
        # moment it returned, undone by its step's compensation if the run fails before the step ends.
        run.effects.append({
            "seq": seq, "step": step, "tick": run.tick, "branch": run.frontier.index(step) if step in run.frontier else 0,
            "call": data["index"], "name": effect.get("name", step), "key": effect.get("key"),
            "result": effect.get("result"), "compensable": bool(effect.get("compensable")), "compensated": False,
            "attempts": 0, "epoch": run.epoch,
        })


def _call_failed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.calls.setdefault(data["step"], {})[str(data["index"])] = {
        "kind": data["kind"], "request": data["request"], "error": data["error"], "attempt": data.get("attempt")}


#: between a wait's name and its number in a wait key: a signal name holds no control character
_WAIT_INDEX = "\x1f"


def wait_key(step: str, name: str, index: int | str = 0) -> str:
    """The key of a step's ``index``-th wait for signal ``name`` (counted from 0 in the step
    execution) in ``waits`` and ``received``: ``"step:name"`` for the first, as journals written
    before waits were numbered hold every wait, then ``"step:name<US>1"``, ...; a wait inside a
    durable call is numbered under it (``"1.0"``: the first for that name inside call 1)."""
    return f"{step}:{name}" if not index else f"{step}:{name}{_WAIT_INDEX}{index}"


def wait_name(key: str) -> str:
    """The signal name of a ``wait_key``."""
    return key.split(":", 1)[1].split(_WAIT_INDEX, 1)[0]


def awaited_names(run: RunState) -> list[str]:
    """The names of the signals the run's steps wait for now: their waits no signal answered yet. A
    wait already answered is not one (a signal of that name sent for a later wait must not wake the
    run while it waits for another: it would run again only to wait again)."""
    return sorted({wait_name(key) for key, wait in run.waits.items()
                   if key not in run.received and not wait.get("timed_out")})


def _wait_started(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.status = "waiting"
    key = wait_key(data["step"], data["name"], data.get("index") or 0)
    run.waits[key] = {"timeout_at": data.get("timeout_at")}


def _signal_received(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.received[wait_key(data["step"], data["name"], data.get("index") or 0)] = data.get("data")


def _wait_timed_out(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    # The step was told its wait timed out: told again when it runs again, whatever comes later.
    run.waits[wait_key(data["step"], data["name"], data.get("index") or 0)] = {
        "timeout_at": data.get("timeout_at"), "timed_out": True}


def _timer_started(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.status = "waiting"
    run.timers[f"{data['step']}:{data['index']}"] = data["wake_at"]


# -- sagas and rollback ---------------------------------------------------------------------------
def _effect(run: RunState, seq: int) -> dict[str, Any]:
    for effect in run.effects:
        if effect["seq"] == seq:
            return effect
    raise ValueError(f"the journal compensates an effect at seq {seq} that it never recorded")


def _saga_started(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.status = "compensating"
    run.saga = dict(data)
    if data.get("error"):
        run.error = dict(data["error"])


def _compensation_started(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    _effect(run, data["effect"])["attempts"] += 1


def _compensation_completed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    _effect(run, data["effect"])["compensated"] = True


def _saga_completed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.status = data["outcome"]
    run.saga = None


def _saga_failed(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    run.status = "compensation_failed"
    run.error = {"type": data["error"]["type"], "message": f"compensating {data['step']!r}: {data['error']['message']}"}


def _saga_retried(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    # The compensation that failed is tried again, and the event carries the error the run stands for
    # again (what started the saga), so a saga that now succeeds ends with it, as one that succeeded
    # at the first try does. A SagaRetried journaled without "error" (before it had one) leaves the
    # error as it was, as it did then: snapshots made after it still verify.
    run.status = "compensating"
    if "error" in data:
        run.error = dict(data["error"]) if data["error"] else None


#: What a rollback restores from the checkpoint: everything but the effects and the epoch, which
#: carry on. Durable calls, waits, received signals, timers and backoffs recorded after the
#: checkpoint belong to history that was undone: none of them may be reused after it.
_RESTORED = ("state", "tick", "frontier", "done", "failures", "visits", "arrivals", "state_seq", "routed_errors",
             "in_flight", "calls", "waits", "received", "timers", "retry_at", "issued")


def _rolled_back(run: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    restore = data["restore"]
    keep_effects, epoch = run.effects, run.epoch + 1
    defaults = RunState()
    for name in _RESTORED:
        setattr(run, name, copy.deepcopy(restore[name]) if name in restore else getattr(defaults, name))
    run.effects, run.epoch = keep_effects, epoch
    run.status, run.saga, run.error = "running", None, None
    if data.get("input"):
        reduce(run.state, data["input"])
    if data.get("next"):
        run.frontier, run.done, run.failures = list(data["next"]), {}, {}
    run.state_seq = seq


_APPLY: dict[str, Callable[[RunState, int, Mapping[str, Any], Reduce], None]] = {
    # a run's life
    EventKind.RUN_STARTED: _run_started,
    EventKind.RESUMED: _resumed,
    EventKind.SNAPSHOT_REJECTED: _no_change,
    EventKind.SNAPSHOT_POLICY: _no_change,
    EventKind.RESTORED: _no_change,
    EventKind.CODE_CHANGED: _code_changed,
    EventKind.MIGRATED: _migrated,
    EventKind.RUN_COMPLETED: _run_ended("completed"),
    EventKind.RUN_FAILED: _run_ended("failed"),
    EventKind.RUN_CANCELLED: _run_ended("cancelled"),
    # steps
    EventKind.STEP_STARTED: _step_started,
    EventKind.KEY_ISSUED: _key_issued,
    EventKind.STEP_COMPLETED: _step_completed,
    EventKind.STEP_FAILED: _step_failed,
    EventKind.STEP_CANCELLED: _step_cancelled,
    # inside a step
    EventKind.CALL_COMPLETED: _call_completed,
    EventKind.CALL_FAILED: _call_failed,
    EventKind.WAIT_STARTED: _wait_started,
    EventKind.SIGNAL_RECEIVED: _signal_received,
    EventKind.WAIT_TIMED_OUT: _wait_timed_out,
    EventKind.TIMER_STARTED: _timer_started,
    # sagas and rollback
    EventKind.SAGA_STARTED: _saga_started,
    EventKind.COMPENSATION_STARTED: _compensation_started,
    EventKind.COMPENSATION_COMPLETED: _compensation_completed,
    EventKind.COMPENSATION_FAILED: _no_change,
    EventKind.SAGA_COMPLETED: _saga_completed,
    EventKind.SAGA_FAILED: _saga_failed,
    EventKind.SAGA_RETRIED: _saga_retried,
    EventKind.ROLLED_BACK: _rolled_back,
}


def apply(run: RunState, seq: int, kind: str, data: Mapping[str, Any], reduce: Reduce = _replace_all) -> None:
    """Fold one event into ``run`` (in place). Events must arrive in seq order without gaps."""
    if seq != run.seq + 1:
        raise ValueError(f"journal gap: expected seq {run.seq + 1}, got {seq}")
    try:
        handler = _APPLY[kind]
    except KeyError:
        raise ValueError(f"unknown event kind {kind!r} at seq {seq}") from None
    handler(run, seq, data, reduce)
    run.seq = seq


def fold(
    events: Iterable[tuple[int, str, Mapping[str, Any]]],
    reduce: Reduce = _replace_all,
    *,
    start: RunState | None = None,
) -> RunState:
    """``fold(events)``; with ``start`` (a restored snapshot) only the later events are folded."""
    run = start if start is not None else RunState()
    for seq, kind, data in events:
        apply(run, seq, kind, data, reduce)
    return run
