"""What a run did, read from its journal: the model behind ``agentsaga show`` and the HTML report.

``summarise`` is pure: it takes the run row, the journal and the snapshot rows and never touches
the store, so ``show``, the report and the tests all see one interpretation of the events. It
walks the journal once, folding as it goes (the fold is what says which tick a step ran in and,
for the report, what state a step's input refers to), and groups events into *executions*: one
per time a step ran to an outcome, with its failed attempts, trace, calls and timings.

Events of kinds this code does not know (written by a newer agentsaga, say) are kept in the
timeline as they are; the fold stops at the first one and the summary says so, rather than
refusing to show the run.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.payload import codec
from orchestrator.engine.snapshots import resolve_chains, snapshot_problem
from orchestrator.engine.events import ACTIVE_STATUSES, TERMINAL_STATUSES
from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, apply
from store import RunRecord, SnapshotRecord

__all__ = ["Execution", "RunSummary", "summarise", "decode_events"]

Event = tuple[int, str, float, dict[str, Any]]  # (seq, kind, at, data)
_STEP_KINDS = (EventKind.STEP_STARTED, EventKind.STEP_COMPLETED, EventKind.STEP_FAILED)
# A durable call made inside a step (orchestrator.engine.durable): an LLM or tool call with its request and
# response, or the error it raised. Named by their strings so that reading old or new journals never
# depends on that module.
_CALL_COMPLETED = "CallCompleted"
_CALL_FAILED = "CallFailed"


@dataclass(slots=True)
class Execution:
    """One time a step ran: from its first event to its completion or final failure."""

    index: int  #: 1-based position among the run's executions (the report's anchors use it)
    step: str
    tick: int
    epoch: int  #: how many rollbacks preceded it
    first_seq: int
    seq: int  #: the event that ended it (or its latest event while it has not ended)
    #: completed | failed | routed | in progress | waiting | in doubt | abandoned | cancelled
    outcome: str = "in progress"
    attempts: int = 1
    ms: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    input: Any = None  #: the journaled input: {"state_at": seq} or {"reads": {...}}
    update: Any = None
    next: list[str] = field(default_factory=list)
    joins: list[str] = field(default_factory=list)  #: join targets this completion arrived at
    route: str | None = None  #: the failure route taken, if any
    trace: list[Any] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)  #: failed attempts, oldest first
    #: every call the step journaled, once each, with its ``outcome`` (``completed`` or ``failed``):
    #: its durable calls (``CallCompleted``, ``CallFailed``: model, tool and HTTP calls) and the HTTP
    #: requests its attempts recorded that were no durable call. An HTTP request made as a durable call
    #: is that call's entry, with the request's own record (status, headers, bodies, key) under ``http``.
    calls: list[Any] = field(default_factory=list)
    #: other events of this execution (waits, signals, timers, a cancellation...): {"seq", "at", "kind", "data"}
    extra: list[dict[str, Any]] = field(default_factory=list)
    #: when an attempt's idempotency key left the process (``KeyIssued``: read, or sent with a request;
    #: a re-send with it is recognised by the service): {"seq", "at", "attempt"}
    key_issued: list[dict[str, Any]] = field(default_factory=list)
    effect: bool = False
    key: str | None = None
    compensable: bool | None = None
    reconciled: str | None = None
    error: dict[str, Any] | None = None  #: the error that ended it, when it failed
    #: when it failed but its effect may have taken effect anyway: {"key", "reason"}
    doubt: dict[str, Any] | None = None


@dataclass(slots=True)
class RunSummary:
    run_id: str
    workflow: str
    version: str
    fingerprint: str
    status: str
    created_at: float
    updated_at: float
    finished_at: float | None
    error: str | None
    parent: dict[str, Any] | None
    lease_owner: str | None
    lease_expires_at: float | None
    events: int
    first_at: float | None
    last_at: float | None
    graph: dict[str, Any]
    start: list[str]
    input: Any
    state: Any  #: the folded state at the end of the journal (None if the fold stopped)
    executions: list[Execution]
    ticks: list[dict[str, Any]]  #: the path taken: {"tick", "epoch", "steps", "seq"} in order
    edges_taken: list[tuple[str, str, int]]
    effects: list[dict[str, Any]]
    sagas: list[dict[str, Any]]
    resumes: list[dict[str, Any]]
    breakers: list[dict[str, Any]]
    snapshots: list[dict[str, Any]]
    others: list[dict[str, Any]]  #: events no section above accounts for (unknown kinds)
    failure: dict[str, Any] | None
    notes: list[str]
    #: with ``keep_states``: the state a tick's steps saw, by the seq it was folded at (JSON text)
    states: dict[int, str] = field(default_factory=dict)
    #: how ``state`` was read: "state folded from all N events" with the workflow's reducers, or
    #: without its code, from which snapshot and which fields were merged by replacement
    state_source: str = ""
    #: failures a rollback went back past, oldest first: ``failure``'s fields plus ``rolled_back_at``
    #: (the ``RolledBack`` seq). History, not the run's current cause.
    earlier_failures: list[dict[str, Any]] = field(default_factory=list)
    #: the HTTP requests compensations made, each once, in journal order: a request's record (method,
    #: redacted URL, idempotency key, status...) as the attempt's ``CompensationCompleted`` or
    #: ``CompensationFailed`` journaled it, plus ``seq``/``at`` (that event), ``compensation_of`` (the
    #: step whose effect was undone), ``effect_seq`` (the effect's seq), ``attempt``, the call's
    #: ``outcome`` (``completed``, ``failed``, or ``unknown`` for a record this code cannot read) and
    #: ``undo`` (how that compensation attempt ended: ``completed`` or ``failed``)
    compensation_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duration(self) -> float | None:
        end = self.finished_at if self.finished_at is not None else self.last_at
        return None if end is None else max(0.0, end - self.created_at)

    @property
    def step_ms(self) -> float:
        return round(sum(x.ms or 0.0 for x in self.executions), 3)

    @property
    def retries(self) -> int:
        return sum(len(x.failures) - (1 if x.outcome in ("failed", "routed") else 0) for x in self.executions)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("states")
        out["edges_taken"] = [{"from": a, "to": b, "count": n} for a, b, n in self.edges_taken]
        out.update(duration=self.duration, step_ms=self.step_ms, retries=self.retries)
        return out


def decode_events(records: Iterable[Any]) -> list[Event]:
    """Store ``EventRecord`` rows as ``(seq, kind, at, data)`` with data decoded by the codec.

    A damaged event is kept, not fatal: its data is read as plain JSON, or shown as the text it
    is, so the run can still be shown (``verify`` is where the damage is reported)."""
    out: list[Event] = []
    for e in records:
        try:
            data = codec.loads(e.data)
        except Exception:  # a bad tag (a Decimal that is not one...) or text that is not JSON
            try:
                data = json.loads(e.data)
            except ValueError:
                data = {"undecodable": e.data[:2000]}
        out.append((e.seq, e.kind, e.at, data if isinstance(data, dict) else {"value": data}))
    return out


def summarise(
    rec: RunRecord,
    events: Sequence[Event],
    snapshots: Sequence[SnapshotRecord],
    *,
    reduce: Callable[[dict[str, Any], Mapping[str, Any]], None] | None = None,
    keep_states: bool = False,
    state_chars: int = 20_000,
) -> RunSummary:
    """Read a run. ``reduce`` is the workflow's merge (without it, updates replace fields, and a
    note says the folded state may differ); ``keep_states`` keeps each tick's input state as text
    (clipped to ``state_chars``) for the report."""
    b = _Builder(rec, reduce, keep_states, state_chars)
    for seq, kind, at, data in events:
        b.event(seq, kind, at, data)
    return b.finish(snapshots)


class _Builder:
    def __init__(self, rec: RunRecord, reduce: Any, keep_states: bool, state_chars: int) -> None:
        self.rec = rec
        self.reduce = reduce
        self.keep_states = keep_states
        self.state_chars = state_chars
        self.folded: RunState | None = RunState()
        self.notes: list[str] = [] if reduce else [
            f"workflow {rec.workflow!r} is not registered here: states are folded without its reducers "
            "(fields merged by replacement) and may differ from what the run saw"]
        self.executions: list[Execution] = []
        self.open: dict[str, Execution] = {}
        self.ticks: list[dict[str, Any]] = []
        #: by the seq of the event that recorded them (a run's end may list several in doubt: by (seq, n))
        self.effects: dict[int | tuple[int, int], dict[str, Any]] = {}
        self.sagas: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.breakers: list[dict[str, Any]] = []
        self.rejected: list[dict[str, Any]] = []
        self.others: list[dict[str, Any]] = []
        self.edges: Counter[tuple[str, str]] = Counter()
        self.started: dict[str, Any] = {}
        #: per step, the HTTP durable calls journaled since its latest step event (the attempt running):
        #: the requests its next step event records are paired with them
        self.attempt_calls: dict[str, list[dict[str, Any]]] = {}
        self.states: dict[int, str] = {}
        self.count = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.run_failed: tuple[int, dict[str, Any]] | None = None
        self.saga_failed: tuple[int, dict[str, Any]] | None = None
        self.cancelled: tuple[int, dict[str, Any]] | None = None
        #: the seq of the newest ``RolledBack``: a failure journaled before it is history, not a cause
        self.since = 0
        self.earlier: list[dict[str, Any]] = []
        self.compensation_calls: list[dict[str, Any]] = []

    # -- one event ---------------------------------------------------------------------------------
    def event(self, seq: int, kind: str, at: float, data: dict[str, Any]) -> None:
        self.count += 1
        self.first_at = at if self.first_at is None else self.first_at
        self.last_at = at
        folded = self.folded
        tick = folded.tick if folded is not None else -1
        epoch = folded.epoch if folded is not None else 0
        if kind in _STEP_KINDS:
            self.step_event(seq, kind, at, data, tick, epoch)
        elif kind == EventKind.STEP_CANCELLED:
            self.step_cancelled(seq, at, data, tick, epoch)
        elif kind == EventKind.RUN_STARTED:
            self.started = data
        elif kind == EventKind.RESUMED:
            self.resumes.append({"seq": seq, "at": at, **data})
        elif kind == EventKind.SNAPSHOT_REJECTED:
            self.rejected.append({"event_seq": seq, "at": at, **data})
        elif kind == EventKind.RUN_FAILED:
            self.run_failed = (seq, data)
            self.listed_in_doubt(seq, data)
        elif kind == EventKind.RUN_CANCELLED:
            self.cancelled = (seq, data)
            self.listed_in_doubt(seq, data)
        elif kind.startswith(("Saga", "Compensation")) or kind == EventKind.ROLLED_BACK:
            self.saga_event(seq, kind, at, data)
            if kind in (EventKind.SAGA_COMPLETED, EventKind.SAGA_FAILED):
                self.listed_in_doubt(seq, data)
        elif kind == EventKind.RUN_COMPLETED:
            pass
        elif "breaker" in kind.lower() or "circuit" in kind.lower():
            self.breakers.append({"seq": seq, "at": at, "kind": kind, "step": data.get("step"),
                                  "message": data.get("message") or _brief(data)})
        elif isinstance(data.get("step"), str):  # journaled inside a step: calls, keys, waits, timers, ...
            x = self.execution(data["step"], seq, at, data, tick, epoch)
            x.seq = seq
            if kind in (_CALL_COMPLETED, _CALL_FAILED):
                call = _call_record(seq, at, data, failed=kind == _CALL_FAILED)
                x.calls.append(call)
                if call["type"] == "http":
                    self.attempt_calls.setdefault(data["step"], []).append(call)
            elif kind == EventKind.KEY_ISSUED:
                x.key_issued.append({"seq": seq, "at": at, "attempt": data.get("attempt")})
            else:
                x.extra.append({"seq": seq, "at": at, "kind": kind, "data": data})
        else:
            self.others.append({"seq": seq, "at": at, "kind": kind, "data": data})
        self.fold(seq, kind, data)

    def fold(self, seq: int, kind: str, data: dict[str, Any]) -> None:
        folded = self.folded
        if folded is None:
            return
        before = (folded.tick, folded.epoch, folded.state_seq)
        try:
            if self.reduce is None:
                apply(folded, seq, kind, data)
            else:
                apply(folded, seq, kind, data, self.reduce)
        except Exception as exc:  # an unknown kind or a damaged event: show the run anyway
            self.notes.append(f"the fold stopped at seq {seq} ({kind}): {exc}; `agentsaga verify` says more")
            self.folded = None
            return
        if (folded.tick, folded.epoch, folded.state_seq) != before or kind == EventKind.RUN_STARTED:
            if folded.frontier and folded.status in ("running", "pending"):
                self.ticks.append({"tick": folded.tick, "epoch": folded.epoch, "steps": list(folded.frontier), "seq": seq})
            if self.keep_states:
                self.states[folded.state_seq] = _clip_json(folded.state, self.state_chars)

    def execution(self, step: str, seq: int, at: float, data: dict[str, Any], tick: int, epoch: int) -> Execution:
        """The step's execution in progress, opened by this event if it is the first of one."""
        x = self.open.get(step)
        if x is None:
            x = Execution(index=len(self.executions) + 1, step=step, tick=data.get("tick", tick), epoch=epoch,
                          first_seq=seq, seq=seq, started_at=at)
            self.executions.append(x)
            self.open[step] = x
        return x

    def step_event(self, seq: int, kind: str, at: float, data: dict[str, Any], tick: int, epoch: int) -> None:
        step = data.get("step", "?")
        x = self.execution(step, seq, at, data, tick, epoch)
        x.seq = seq
        x.attempts = max(x.attempts, int(data.get("attempt") or 1))
        if "input" in data:
            x.input = data["input"]
        if data.get("key"):
            x.key = data["key"]
        for t in data.get("breakers") or ():  # transitions this attempt caused (store-backed breakers)
            if isinstance(t, dict):
                self.breakers.append({"seq": seq, "at": at, "kind": "BreakerTransition", "step": step,
                                      "message": f"{t.get('breaker')}: {t.get('from')} -> {t.get('to')}"
                                                 + (f" ({t['reason']})" if t.get("reason") else "")})
        pending = self.attempt_calls.pop(step, [])
        if kind == EventKind.STEP_STARTED:
            x.effect = x.effect or bool(data.get("key"))
            return
        requests = [r for name in ("calls", "http") if isinstance(data.get(name), list) for r in data[name]]
        _pair_requests(x, requests, pending, seq, at)
        if kind == EventKind.STEP_FAILED:
            failure = {"seq": seq, "at": at, "attempt": data.get("attempt"), "error": data.get("error") or {},
                       "retry_in": data.get("retry_in"), "final": bool(data.get("final"))}
            x.failures.append(failure)
            if _is_breaker(failure["error"]):
                self.breakers.append({"seq": seq, "at": at, "kind": "CircuitOpen", "step": step,
                                      "message": failure["error"].get("message")})
            if not data.get("final"):
                return
            x.error = failure["error"]
            x.route = data.get("route")
            x.outcome = "routed" if x.route else "failed"
            doubt = data.get("doubt")
            if isinstance(doubt, dict):
                # It failed, but its effect may stand: an effect of the run, in doubt (never undone:
                # there is no result to undo it with).
                x.doubt = doubt
                x.effect = True
                self.effects[seq] = {"seq": seq, "step": step, "key": doubt.get("key"), "execution": x.index,
                                     "compensable": False, "result": None, "status": "in doubt",
                                     "reason": doubt.get("reason"), "attempts": 0, "errors": [], "undone_seq": None,
                                     "undo_result": None, "undo_trace": []}
            if x.route:
                x.next = [x.route]
                self.edges[(step, x.route)] += 1
        else:
            x.outcome = "completed"
            x.update = data.get("update")
            x.next = list(data.get("next") or [])
            x.ms = data.get("ms")
            x.trace = list(data.get("trace") or [])
            x.reconciled = data.get("reconciled")
            for call in requests:
                if isinstance(call, dict) and call.get("sent") is False and _is_breaker(call.get("error") or {}):
                    self.breakers.append({"seq": seq, "at": at, "kind": "CircuitOpen", "step": step,
                                          "message": (call.get("error") or {}).get("message")})
            x.joins = list(data.get("join") or {})
            for target in [*x.next, *x.joins]:
                self.edges[(step, target)] += 1
            if data.get("effect"):
                x.effect, x.compensable = True, bool(data.get("compensable"))
                self.effects[seq] = {"seq": seq, "step": step, "key": data.get("key"), "execution": x.index,
                                     "compensable": x.compensable, "result": x.update, "status": "not undone",
                                     "attempts": 0, "errors": [], "undone_seq": None, "undo_result": None,
                                     "undo_trace": []}
        if x.ms is not None:
            x.started_at = min(x.started_at or at, at - x.ms / 1000.0)
        x.ended_at = at
        del self.open[step]

    def listed_in_doubt(self, seq: int, data: dict[str, Any]) -> None:
        """The run's end (``RunCancelled``, ``SagaCompleted``, ``SagaFailed``, ``RunFailed``) lists
        effects ``in_doubt``: each one not already an effect in doubt (a ``StepFailed`` with
        ``doubt``) is one now, at that event: an effect in flight when the run was cancelled, which no
        step event ever settled."""
        known = {e["key"] for e in self.effects.values() if e["status"] == "in doubt"}
        for d in data.get("in_doubt") or ():
            if not isinstance(d, dict) or d.get("key") in known:
                continue
            step = d.get("step")
            x = self.open.get(step) if isinstance(step, str) else None
            self.effects[(seq, len(known))] = {
                "seq": seq, "step": step, "key": d.get("key"), "execution": x.index if x else None,
                "compensable": False, "result": None, "status": "in doubt",
                "reason": d.get("reason") or "it was in flight when the run ended, and no outcome was journaled",
                "attempts": 0, "errors": [], "undone_seq": None, "undo_result": None, "undo_trace": []}
            known.add(d.get("key"))

    def step_cancelled(self, seq: int, at: float, data: dict[str, Any], tick: int, epoch: int) -> None:
        """The task driving the run was cancelled during an attempt. One whose function had not been
        called, or of a step with no effect, ended there (the step runs again on resume); an effect's
        attempt whose function ran stays open: in doubt until a resume settles it."""
        step = data.get("step", "?")
        x = self.execution(step, seq, at, data, tick, epoch)
        x.seq = seq
        x.attempts = max(x.attempts, int(data.get("attempt") or 1))
        x.extra.append({"seq": seq, "at": at, "kind": EventKind.STEP_CANCELLED, "data": data})
        self.attempt_calls.pop(step, None)  # the attempt ended: its requests were not recorded
        if data.get("called") and x.effect:
            return
        x.outcome = "cancelled"
        x.ended_at = at
        del self.open[step]

    def saga_event(self, seq: int, kind: str, at: float, data: dict[str, Any]) -> None:
        effect = self.effects.get(data.get("effect", -1)) if "effect" in data else None
        if kind in (EventKind.COMPENSATION_COMPLETED, EventKind.COMPENSATION_FAILED) and "calls" in data:
            self.compensation_calls += _compensation_calls(seq, at, data, failed=kind == EventKind.COMPENSATION_FAILED)
        if kind == EventKind.COMPENSATION_STARTED and effect is not None:
            effect["attempts"] = max(effect["attempts"], int(data.get("attempt") or 1))
            effect["status"] = "compensating"
        elif kind == EventKind.COMPENSATION_COMPLETED and effect is not None:
            effect.update(status="compensated", undone_seq=seq, undo_result=data.get("result"),
                          undo_trace=list(data.get("trace") or []))
        elif kind == EventKind.COMPENSATION_FAILED and effect is not None:
            effect["errors"].append({"seq": seq, "at": at, "attempt": data.get("attempt"),
                                     "error": data.get("error") or {}, "retry_in": data.get("retry_in"),
                                     "final": bool(data.get("final"))})
            effect["status"] = "compensation failed" if data.get("final") else "retrying"
        elif kind == EventKind.SAGA_FAILED:
            self.saga_failed = (seq, data)
        elif kind == EventKind.SAGA_RETRIED:
            # Its compensations are tried again: the compensation that failed is no longer what the run
            # stands for (a new SagaFailed says so if it fails again); what started the saga is.
            self.saga_failed = None
        if kind == EventKind.ROLLED_BACK:
            for x in self.open.values():  # their tick was rolled back: they will not end
                x.outcome = "abandoned"
            self.open.clear()
            # The run went back past its failure, if it had one: that failure is history now.
            past = self.cause()
            if past is not None:
                self.earlier.append({**past, "rolled_back_at": seq})
            self.run_failed = self.saga_failed = None
            self.since = seq
        if kind in (EventKind.SAGA_STARTED, EventKind.SAGA_COMPLETED, EventKind.SAGA_FAILED, EventKind.SAGA_RETRIED, EventKind.ROLLED_BACK):
            entry = {"seq": seq, "at": at, "kind": kind}
            entry.update({k: v for k, v in data.items() if k != "restore"})  # the checkpoint is bulky
            self.sagas.append(entry)

    # -- the end -------------------------------------------------------------------------------------
    def finish(self, snapshots: Sequence[SnapshotRecord]) -> RunSummary:
        rec, folded = self.rec, self.folded
        for x in self.open.values():
            if rec.status == "waiting":
                x.outcome = "waiting"
            elif x.effect and x.key:
                x.outcome = "in doubt" if rec.status not in ACTIVE_STATUSES or not rec.lease_owner else "in progress"
            elif rec.status in TERMINAL_STATUSES:
                x.outcome = "abandoned"
        snaps = []
        chain_problems = resolve_chains(snapshots)[1]
        for snap in sorted(snapshots, key=lambda s: s.seq):
            snaps.append({"seq": snap.seq, "trigger": snap.trigger, "created_at": snap.created_at,
                          "sha256": snap.sha256, "bytes": len(snap.state.encode()), "kind": snap.kind,
                          "problem": chain_problems.get(snap.seq) or snapshot_problem(snap)})
        state: Any = folded.state if folded is not None else None
        if folded is not None and folded.seq and folded.status != rec.status and TERMINAL_STATUSES & {folded.status, rec.status}:
            self.notes.append(f"the run row says {rec.status!r} but its journal folds to {folded.status!r}")
        started = self.started
        return RunSummary(
            run_id=rec.run_id, workflow=rec.workflow, version=rec.version, fingerprint=rec.fingerprint,
            status=rec.status, created_at=rec.created_at, updated_at=rec.updated_at,
            finished_at=rec.finished_at, error=rec.error,
            parent=started.get("parent") or ({"run_id": rec.parent_run_id} if rec.parent_run_id else None),
            lease_owner=rec.lease_owner, lease_expires_at=rec.lease_expires_at, events=self.count, first_at=self.first_at, last_at=self.last_at,
            graph=started.get("graph") or {}, start=list(started.get("start") or []), input=started.get("input"),
            state=state, executions=self.executions, ticks=self.ticks,
            edges_taken=[(a, b, n) for (a, b), n in self.edges.items()],
            effects=list(self.effects.values()), sagas=self.sagas, resumes=self.resumes, breakers=self.breakers,
            snapshots=snaps + [{"rejected": True, **r} for r in self.rejected], others=self.others,
            failure=self.failure(), notes=self.notes, states=self.states,
            state_source="" if folded is None else f"state folded from all {folded.seq} events"
            + ("" if self.reduce else "; folded without reducers: fields merged by replacement"),
            earlier_failures=self.earlier, compensation_calls=self.compensation_calls,
        )

    def failure(self) -> dict[str, Any] | None:
        """Where the run went wrong, pointing at the execution (or compensation) that caused it.

        Only what came after the newest rollback counts: a run rolled back past a failure and then
        completed has no cause (the failure is in ``earlier_failures``)."""
        cause = self.cause()
        if cause is not None:
            return cause
        if self.cancelled is not None:
            seq, data = self.cancelled
            return {"kind": "cancelled", "seq": seq, "step": None, "execution": None,
                    "error": {"type": "Cancelled", "message": data.get("reason")},
                    "message": f"cancelled by {data.get('by')}", "in_doubt": data.get("in_doubt")}
        # A cancel with compensation journals its saga instead of RunCancelled: what it left in doubt
        # is on the saga's end.
        started = next((e for e in reversed(self.sagas) if e["kind"] == EventKind.SAGA_STARTED and
                        e.get("reason") == "cancel" and e["seq"] > self.since), None)
        if started is not None:
            ended = next((e for e in self.sagas if e["kind"] == EventKind.SAGA_COMPLETED and e["seq"] > started["seq"]),
                         {})
            return {"kind": "cancelled", "seq": started["seq"], "step": None, "execution": None,
                    "error": started.get("error") or {"type": "Cancelled", "message": None},
                    "message": "cancelled with compensation", "in_doubt": ended.get("in_doubt")}
        last = next((x for x in reversed(self.executions)
                     if x.first_seq > self.since and x.failures and x.outcome != "completed"), None)
        if last is not None and self.rec.status in ACTIVE_STATUSES:
            return {"kind": "retrying", "seq": last.seq, "step": last.step, "execution": last.index,
                    "error": last.failures[-1]["error"], "message": f"step {last.step!r} is failing and retrying"}
        return None

    def cause(self) -> dict[str, Any] | None:
        """The failure the run stands for since the newest rollback: a compensation that kept failing
        (until ``compensate`` retries it), else the step whose failure failed the run or started its saga."""
        if self.saga_failed is not None:
            seq, data = self.saga_failed
            effect = self.effects.get(data.get("effect", -1), {})
            return {"kind": "compensation", "seq": seq, "step": data.get("step"), "error": data.get("error") or {},
                    "execution": effect.get("execution"), "detail": effect.get("errors", [])[-1:] or None,
                    "message": f"compensating the effect of step {data.get('step')!r} kept failing",
                    "in_doubt": data.get("in_doubt")}
        cause = self.run_failed
        if cause is None:
            for saga in self.sagas:
                if (saga["kind"] == EventKind.SAGA_STARTED and saga.get("reason") == "failure"
                        and saga["seq"] > self.since):
                    cause = (saga["seq"], saga)
        if cause is not None:
            seq, data = cause
            step = data.get("step")
            culprit = next((x for x in reversed(self.executions)
                            if x.step == step and x.error and x.first_seq > self.since), None)
            error = (culprit.error if culprit else None) or data.get("error") or {}
            return {"kind": "step", "seq": culprit.seq if culprit else seq, "step": step, "error": error,
                    "execution": culprit.index if culprit else None,
                    "message": f"step {step!r} failed and had no failure route",
                    "uncompensable": data.get("uncompensable"), "in_doubt": data.get("in_doubt")}
        return None


def _call_record(seq: int, at: float, data: Mapping[str, Any], *, failed: bool = False) -> dict[str, Any]:
    """A durable call as the report's call table reads it: its kind as the type, a name from its
    request when it has one (a model, a tool, a URL), its ``outcome`` (``completed``, or ``failed``
    with the ``error`` it raised), an HTTP call's ``status`` and, for a call made inside another one
    (position ``"1.0"``), ``inside`` (that call's position) and ``depth`` (how deep it is)."""
    request = data.get("request")
    name = ""
    if isinstance(request, dict):
        name = next((str(request[k]) for k in ("model", "tool", "name", "url") if request.get(k)), "")
    record = {k: v for k, v in data.items() if k not in ("step", "tick", "kind", "inside", "depth", "outcome")}
    position = str(data.get("index"))
    if "." in position:
        record.update(inside=position.rsplit(".", 1)[0], depth=position.count("."))
    kind = data.get("kind") or "call"
    call = {"type": kind, "name": name, "seq": seq, "at": at, **record, "outcome": "failed" if failed else "completed"}
    if kind == "http" and "status" not in call:
        answer = data.get("error") if failed else data.get("response")
        if isinstance(answer, dict) and isinstance(answer.get("status"), int):
            call["status"] = answer["status"]
    return call


def _compensation_calls(seq: int, at: float, data: Mapping[str, Any], *, failed: bool) -> list[dict[str, Any]]:
    """The requests a compensation attempt journaled (its event's ``calls``), each labelled with the
    compensation that made them. Journals are read as they are: ``calls`` that is one record rather
    than a list, a record that is not a mapping, or one without the fields of today's records is
    still listed (its ``outcome`` ``unknown`` when it says nothing of one), never a failed read."""
    calls = data.get("calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        calls = [calls]
    label = {"seq": seq, "at": at, "compensation_of": data.get("step"), "effect_seq": data.get("effect"),
             "attempt": data.get("attempt"), "undo": "failed" if failed else "completed"}
    out = []
    for record in calls:
        if not isinstance(record, dict):
            out.append({**label, "type": "unknown", "record": record, "outcome": "unknown"})
            continue
        error = record.get("error")
        known = any(k in record for k in ("error", "status", "response"))
        outcome = "failed" if error else "completed" if known else "unknown"
        call = {**record, **label, "type": record.get("type") or "http", "outcome": outcome}
        if call["attempt"] is None:  # an event without it: the record's own, if any
            call["attempt"] = record.get("attempt")
        out.append(call)
    return out


def _pair_requests(x: Execution, requests: list[Any], pending: list[dict[str, Any]], seq: int, at: float) -> None:
    """Add the HTTP requests an attempt recorded (a step event's ``calls``) to ``x.calls``, once each.

    A request made as a durable call (``ctx.http`` in a step) is journaled twice: as that call
    (``CallCompleted``/``CallFailed``, in ``pending``: this attempt's, not yet paired) and in the
    attempt's records. It is paired with its call, and its record goes under the call's ``http``:
    by the call's position where the record has one (``index``), else (journals written before
    records carried it) with the attempt's first unpaired call of the same method and URL, in order.
    A request that was no durable call (an effect tool's own request, say) is an entry of its own,
    at the step event that recorded it."""
    free = list(pending)
    for record in requests:
        if not isinstance(record, dict):
            x.calls.append(record)  # not a record this code knows: shown as it is
            continue
        match = None
        if "index" in record:
            match = next((c for c in free if str(c.get("index")) == str(record["index"])), None)
        else:
            match = next((c for c in free if _same_request(c, record)), None)
        if match is not None:
            free.remove(match)
            match["http"] = record
            if record.get("status") is not None:
                match["status"] = record["status"]
            continue
        error = record.get("error")
        x.calls.append({"seq": seq, "at": at, **record, "type": record.get("type") or "http",
                        "outcome": "failed" if error else "completed"})


def _same_request(call: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
    """Whether an HTTP durable call's request and a request's record are of one method and URL (the
    record's URL carries the query the call's ``params`` added)."""
    request = call.get("request")
    if not isinstance(request, dict):
        return False
    if str(request.get("method") or "").upper() != str(record.get("method") or "").upper():
        return False
    return str(request.get("url") or "").split("?", 1)[0] == str(record.get("url") or "").split("?", 1)[0]


def _is_breaker(error: Mapping[str, Any]) -> bool:
    return "CircuitOpen" in str(error.get("type") or "")


def _brief(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)[:200]


def _clip_json(value: Any, limit: int) -> str:
    """Pretty JSON of ``value``, or compact JSON cut at ``limit`` characters when it is large
    (indenting goes through the pure-Python encoder: only small values are worth it)."""
    text = codec.dumps(value)
    if len(text) > limit:
        return text[:limit] + f"… [{len(text):,} characters; `agentsaga history --json` has all]"
    return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
