"""``fold``: the one pure function from events to a run's state (invariant 2).

``RunState`` holds everything needed to continue a run: the user state and the scheduler's position
(tick, frontier, completions within the tick, failed attempts, visit counts, join arrivals). It is
plain JSON data so that a snapshot is ``canonical_dumps(run_state.to_json())`` and
``fold(snapshot_n + events after n) == fold(all events)`` holds exactly.

``apply`` never calls user code except the workflow's reducers (which must be deterministic); it
never asks a router: routing decisions are read from the journal (invariant 3).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.engine.events import EventKind as K

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
    #: durable calls of steps not yet completed: step -> {index: {kind, request, response}}
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: signal waits in progress: "step:name" -> {timeout_at}
    waits: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: signals received by steps not yet completed: "step:name" -> data
    received: dict[str, Any] = field(default_factory=dict)
    #: durable timers of steps not yet completed: "step:index" -> wake_at
    timers: dict[str, float] = field(default_factory=dict)

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


def _run_started(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    rs.status = "running"
    rs.state = dict(data.get("input") or {})
    rs.frontier = list(data["start"])
    rs.state_seq = seq


def _step_started(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    rs.in_flight[data["step"]] = dict(data)


def _step_completed(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    if data.get("effect"):
        rs.effects.append({
            "seq": seq, "step": step, "tick": rs.tick, "branch": rs.frontier.index(step) if step in rs.frontier else 0,
            "call": -1, "name": step, "key": data["key"], "result": data["update"],
            "compensable": bool(data.get("compensable")), "compensated": False, "attempts": 0,
        })
    rs.done[step] = {"update": data["update"], "next": list(data["next"]), "join": data.get("join")}
    rs.failures.pop(step, None)
    rs.in_flight.pop(step, None)
    rs.visits[step] = rs.visits.get(step, 0) + 1
    _forget_step(rs, step)
    _maybe_advance(rs, seq, reduce)


def _forget_step(rs: RunState, step: str, *, keep_waits: bool = False) -> None:
    """A step execution ended: its durable calls (and, when it completed, its waits) are done with."""
    rs.calls.pop(step, None)
    if keep_waits or not (rs.waits or rs.received or rs.timers):
        return
    prefix = step + ":"
    for table in (rs.waits, rs.received, rs.timers):
        for key in [k for k in table if k.startswith(prefix)]:
            del table[key]


def _step_failed(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    step = data["step"]
    rs.in_flight.pop(step, None)
    # A retry reuses the durable calls (and signals) of earlier attempts; a final failure ends them.
    if data.get("final"):
        _forget_step(rs, step)
    route = data.get("route")
    if data.get("final") and route:
        # The failure route counts as the step's completion with no update.
        rs.done[step] = {"update": {}, "next": [route], "join": None}
        rs.failures.pop(step, None)
        rs.visits[step] = rs.visits.get(step, 0) + 1
        rs.routed_errors[route] = {"step": step, **data["error"]}
        _maybe_advance(rs, seq, reduce)
    else:
        rs.failures[step] = rs.failures.get(step, 0) + 1


def _maybe_advance(rs: RunState, seq: int, reduce: Reduce) -> None:
    """When every step of the tick has completed: merge updates in frontier order, move on."""
    frontier = rs.frontier
    done = rs.done
    if any(s not in done for s in frontier):
        return
    nxt: list[str] = []
    for step in frontier:
        entry = done[step]
        if entry["update"]:
            reduce(rs.state, entry["update"])
        rs.routed_errors.pop(step, None)
        for target in entry["next"]:
            if target not in nxt:
                nxt.append(target)
        for target, sources in (entry.get("join") or {}).items():
            arrived = rs.arrivals.setdefault(target, [])
            if step not in arrived:
                arrived.append(step)
            if all(s in arrived for s in sources):
                del rs.arrivals[target]
                if target not in nxt:
                    nxt.append(target)
    rs.frontier = nxt
    rs.done = {}
    rs.failures = {}
    rs.tick += 1
    rs.state_seq = seq


def _run_ended(status: str) -> Callable[[RunState, int, Mapping[str, Any], Reduce], None]:
    def apply_end(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
        rs.status = status
        if data.get("error"):
            rs.error = dict(data["error"])

    return apply_end


def _resumed(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    if rs.status == "waiting":
        rs.status = "running"


def _no_change(rs: RunState, seq: int, data: Mapping[str, Any], reduce: Reduce) -> None:
    return None


_APPLY: dict[str, Callable[[RunState, int, Mapping[str, Any], Reduce], None]] = {
    K.RUN_STARTED: _run_started,
    K.STEP_STARTED: _step_started,
    K.STEP_COMPLETED: _step_completed,
    K.STEP_FAILED: _step_failed,
    K.RUN_COMPLETED: _run_ended("completed"),
    K.RUN_FAILED: _run_ended("failed"),
    K.RUN_CANCELLED: _run_ended("cancelled"),
    K.RESUMED: _resumed,
    K.SNAPSHOT_REJECTED: _no_change,
}


def register_kind(kind: str, handler: Callable[[RunState, int, Mapping[str, Any], Reduce], None]) -> None:
    """Let another module of the orchestrator teach fold a new event kind (sagas, signals)."""
    _APPLY[kind] = handler


def apply(rs: RunState, seq: int, kind: str, data: Mapping[str, Any], reduce: Reduce = _replace_all) -> None:
    """Fold one event into ``rs`` (in place). Events must arrive in seq order without gaps."""
    if seq != rs.seq + 1:
        raise ValueError(f"journal gap: expected seq {rs.seq + 1}, got {seq}")
    try:
        handler = _APPLY[kind]
    except KeyError:
        raise ValueError(f"unknown event kind {kind!r} at seq {seq}") from None
    handler(rs, seq, data, reduce)
    rs.seq = seq


def fold(
    events: Iterable[tuple[int, str, Mapping[str, Any]]],
    reduce: Reduce = _replace_all,
    *,
    start: RunState | None = None,
) -> RunState:
    """``fold(events)``; with ``start`` (a restored snapshot) only the later events are folded."""
    rs = start if start is not None else RunState()
    for seq, kind, data in events:
        apply(rs, seq, kind, data, reduce)
    return rs
