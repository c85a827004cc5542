"""``Orchestrator``: the entry point users see (run, start, resume, recover, cancel, and async twins)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from orchestrator.payload import codec
from orchestrator.audit.audit import AuditMixin
from orchestrator.scale.queues import QueueMixin
from orchestrator.engine.driver import Engine, EngineConfig, Live
from orchestrator.engine.events import ACTIVE_STATUSES, TERMINAL_STATUSES
from orchestrator.engine.events import EventKind as K
from orchestrator.engine.fold import RunState, fold
from orchestrator.engine.graph_changes import graph_differences
from orchestrator.engine.loader import load_target, target_of
from orchestrator.engine.result import RunResult
from orchestrator.errors import ConfigurationError, GraphChangedError, RunStateError, WorkflowNotFoundError
from compensations import BreakerConfig, BreakerRegistry, Compensations, default_breakers
from orchestrator.tools.breakers import StoreBreakers
from orchestrator.payload.redact import Redactor
from orchestrator.tools.toolbox import Tools
from orchestrator.engine.saga import SagaKind, has_pending_effects
from store import ConflictError, DuplicateRunError, NewEvent, RunRecord, Store, open_store
from workflows import Workflow

__all__ = ["Orchestrator"]

_log = logging.getLogger("agentsaga")
T = TypeVar("T")


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Orchestrator(AuditMixin, QueueMixin):
    """Runs workflows durably against a store.

    ``url`` is a database URL (``sqlite:///file.db``, ``postgresql://...``); without it,
    ``AGENTSAGA_DB`` or a SQLite file in the working directory. Options (keyword-only):

    - ``snapshot_every`` (100): write a snapshot every N events (and at the end of a run)
    - ``keep_snapshots`` (3): snapshots kept per run; older ones are pruned in the same transaction
    - ``lease_ttl`` (30 s): how long a lease lasts without a heartbeat; renewed every ttl/3
    - ``allow_graph_change`` (False): let ``resume`` continue a run whose graph or version changed
    - ``clock`` / ``sleep`` / ``rng``: injected time (epoch seconds), async sleep and randomness
    - ``store``: an already opened ``Store`` (then ``url`` and ``store_options`` are ignored)
    - ``store_options``: passed to ``store.open_store`` (e.g. ``sqlite_synchronous="NORMAL"``)
    - ``compensations``: a ``compensations.Compensations`` registry (compensations and check hooks
      keyed by effect name), for effects that do not carry their own
    - ``breakers``: a ``compensations.BreakerRegistry`` of breaker settings (default: the process-wide
      one that ``declare_breaker`` fills); breaker *state* lives in the store, shared by all processes
    - ``redact``: extra regex patterns scrubbed from everything journaled (secrets never reach the
      journal; Authorization headers, API keys and sensitive fields are redacted by default)
    - ``max_body``: bytes of each HTTP request/response body kept in the journal (the rest is cut,
      with a marker and the full size)
    - ``replay``: a ``Cassette`` of recorded responses: durable calls (model calls, tools) are
      answered from it instead of the network, and a request that differs is an error
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        workflows: Iterable[Workflow] = (),
        snapshot_every: int = 100,
        keep_snapshots: int = 3,
        lease_ttl: float = 30.0,
        allow_graph_change: bool = False,
        owner: str | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
        store: Store | None = None,
        store_options: dict[str, Any] | None = None,
        compensations: Compensations | None = None,
        breakers: BreakerRegistry | None = None,
        redact: Iterable[str] = (),
        max_body: int = 8192,
        replay: Any = None,
    ) -> None:
        if not isinstance(snapshot_every, int) or snapshot_every < 1:
            raise ConfigurationError(f"snapshot_every must be an integer >= 1, got {snapshot_every!r}")
        if not isinstance(keep_snapshots, int) or keep_snapshots < 1:
            raise ConfigurationError(f"keep_snapshots must be an integer >= 1, got {keep_snapshots!r}")
        if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
            raise ConfigurationError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}")
        self._workflows: dict[str, Workflow] = {}
        for wf in workflows:
            self.register(wf)
        self.store = store if store is not None else open_store(url, **(store_options or {}))
        self._owns_store = store is None
        self.allow_graph_change = allow_graph_change
        self._breakers = breakers if breakers is not None else default_breakers
        for wf in self._workflows.values():
            self._declare_breakers(wf)
        the_clock = clock or (lambda: time.time())
        try:
            redactor = Redactor(patterns=tuple(redact))
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        tools = Tools(breakers=StoreBreakers(self.store, the_clock), registry=self._breakers, redactor=redactor,
                      clock=the_clock, max_body=max_body)
        self.engine = Engine(
            self.store,
            EngineConfig(
                snapshot_every=snapshot_every,
                keep_snapshots=keep_snapshots,
                lease_ttl=float(lease_ttl),
                owner=owner or _default_owner(),
                clock=the_clock,
                sleep=sleep or asyncio.sleep,
                rng=rng or random.Random(),
            ),
            registry=compensations,
            tools=tools,
        )
        self.engine.replay = replay

    # -- setup -----------------------------------------------------------------------------------
    @property
    def owner(self) -> str:
        return self.engine.cfg.owner

    def register(self, *workflows: Workflow) -> None:
        """Make workflows known by name (validated now: a bad graph fails here, not mid-run)."""
        for wf in workflows:
            if not isinstance(wf, Workflow):
                raise ConfigurationError(f"workflows must be Workflow objects, got {wf!r}")
            wf.validate()
            known = self._workflows.get(wf.name)
            if known is not None and known is not wf:
                raise ConfigurationError(f"two different workflows are named {wf.name!r}")
            if hasattr(self, "_breakers"):
                self._declare_breakers(wf)
            self._workflows[wf.name] = wf

    def _declare_breakers(self, wf: Workflow) -> None:
        """A step may carry a ``BreakerConfig``: declare it, so two settings for one name fail here."""
        for step in wf.steps.values():
            if isinstance(step.breaker, BreakerConfig):
                self._breakers.declare(step.breaker)
            elif step.breaker is not None and not isinstance(step.breaker, str):
                raise ConfigurationError(f"step {step.name!r}: breaker must be a name or a BreakerConfig, "
                                         f"got {step.breaker!r}")

    def close(self) -> None:
        self.engine.heartbeat.stop()
        self.engine.tools.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sync API (each a thin wrapper over its async twin) -------------------------------------
    def run(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> RunResult:
        """Start a run and drive it to the end. An existing ``run_id`` of the same workflow is
        continued instead of started twice (a start is exactly-once per id)."""
        return _sync(self.arun(workflow, input, run_id=run_id))

    def start(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> str:
        """Journal a new run as pending without driving it; ``resume`` or ``recover`` drives it."""
        return _sync(self.astart(workflow, input, run_id=run_id))

    def resume(self, run_id: str, *, allow_graph_change: bool | None = None) -> RunResult:
        """Continue an interrupted run now, taking its lease over (a previous owner is fenced out).
        A finished run just returns its result."""
        return _sync(self.aresume(run_id, allow_graph_change=allow_graph_change))

    def recover(self, *, limit: int | None = None) -> list[RunResult]:
        """Resume every interrupted run whose lease has expired (or that was never leased)."""
        return _sync(self.arecover(limit=limit))

    def cancel(self, run_id: str, *, reason: str | None = None, compensate: bool = False) -> RunResult:
        """Cancel a run that has not finished; a process still driving it is fenced out. With
        ``compensate=True`` its completed effects are undone first, newest first."""
        return _sync(self.acancel(run_id, reason=reason, compensate=compensate))

    def snapshot(self, run_id: str) -> int:
        """Write a snapshot of the run now (on demand) and return its seq.

        The snapshot is the fold of the journal as it stands, verified like any other; the run's
        journal is not changed, so this is safe while another process drives the run (a snapshot
        that process writes at the same seq wins, and this call then reports that seq).
        """
        rec = self.store.get_run(run_id)
        wf = self._workflow_for(rec, required=False)
        rs = self.engine.restore(run_id, wf)[0] if wf else self._fold_plain(run_id)[0]
        cfg = self.engine.cfg
        snap = self.engine.make_snapshot(rs, "on_demand", cfg.clock())
        if any(s.seq == snap.seq for s in self.store.snapshots(run_id)):
            return snap.seq
        try:
            self.store.append(run_id, [], token=rec.lease_token, now=cfg.clock(), snapshot=snap,
                              keep_snapshots=self.engine.cfg.keep_snapshots)
        except ConflictError:
            pass  # the driving process wrote one at this seq first
        return snap.seq

    def signal(self, run_id: str, name: str, data: Any = None) -> None:
        """Send signal ``name`` (JSON data) to a run, from any process. A run waiting for it is
        woken (``recover`` or a worker continues it); one not yet waiting gets it when it waits."""
        rec = self.store.get_run(run_id)
        if rec.status in TERMINAL_STATUSES:
            raise RunStateError(f"run {run_id!r} is {rec.status}; it waits for no signal")
        if not isinstance(name, str) or not name:
            raise RunStateError(f"a signal needs a name, got {name!r}")
        if rec.status == "waiting":
            wf = self._workflow_for(rec, required=False)
            rs = self.engine.restore(run_id, wf)[0] if wf else self._fold_plain(run_id)[0]
            waiting_for = sorted({key.split(":", 1)[1] for key in rs.waits})
            if waiting_for and name not in waiting_for:
                raise RunStateError(f"run {run_id!r} is waiting for {', '.join(map(repr, waiting_for))}, "
                                    f"not {name!r}")
        text = codec.dumps(data, what=f"data of signal {name!r}")
        now = self.engine.cfg.clock()
        self.store.signals.send(run_id, name, text, now=now)
        self.store.wakeups.wake(run_id, now=now)

    def compensate(self, run_id: str) -> RunResult:
        """Retry the remaining compensations of a run left ``compensation_failed``."""
        return _sync(self.acompensate(run_id))

    def rollback(self, run_id: str, *, to: int | str, input: dict[str, Any] | None = None,
                 next_step: str | None = None) -> RunResult:
        """Roll a run back to a checkpoint and continue it from there.

        ``to`` is a journal seq at a tick boundary (a snapshot's seq, say) or a step name (the state
        just before that step's latest execution). The effects recorded after that point are
        compensated, newest first; a ``RolledBack`` event makes the checkpoint's state current
        (history is not rewritten); ``input`` is merged into that state and ``next_step`` forces
        where the run goes next. Then the run is driven to its end.
        """
        return _sync(self.arollback(run_id, to=to, input=input, next_step=next_step))

    # -- async API -------------------------------------------------------------------------------
    async def arun(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> RunResult:
        live = self._create(workflow, input, run_id=run_id, lease=True)
        if live is None:  # the id exists: continue that run (never start it twice)
            assert run_id is not None
            return await self._continue(run_id, force=False, allow=None)
        await self.engine.drive(live)
        return self._result(live.run_id, live.wf, live.rs)

    async def astart(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> str:
        live = self._create(workflow, input, run_id=run_id, lease=False)
        if live is None:
            raise RunStateError(f"run {run_id!r} already exists")
        return live.run_id

    async def aresume(self, run_id: str, *, allow_graph_change: bool | None = None) -> RunResult:
        return await self._continue(run_id, force=True, allow=allow_graph_change)

    async def arecover(self, *, limit: int | None = None) -> list[RunResult]:
        results: list[RunResult] = []
        cfg = self.engine.cfg
        while limit is None or len(results) < limit:
            claimed = self.store.queues.claim(owner=cfg.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                            statuses=ACTIVE_STATUSES, limit=1)
            if not claimed:
                break
            run_id, token = claimed[0]
            try:
                results.append(await self._drive_claimed(run_id, token, allow=None))
            except (WorkflowNotFoundError, GraphChangedError) as exc:
                # Leave the run for a process that has its code; say why, do not fail it.
                _log.error("recover: run %s skipped: %s", run_id, exc)
                self.store.leases.release(run_id, token=token, now=cfg.clock())
                rec = self.store.get_run(run_id)
                results.append(RunResult(run_id=run_id, status=rec.status, state=None, workflow=rec.workflow,
                                         seq=self.store.last_seq(run_id), error=str(exc)))
                if limit is None:
                    limit = len(results) + 1000  # do not spin on the same unrunnable run
        return results

    async def acancel(self, run_id: str, *, reason: str | None = None, compensate: bool = False) -> RunResult:
        rec = self.store.get_run(run_id)
        if rec.status in TERMINAL_STATUSES:
            raise RunStateError(f"run {run_id!r} is already {rec.status}; nothing to cancel")
        live = self._take_over(rec)
        why = reason or "cancelled by request"
        if compensate and has_pending_effects(live.rs):
            self.engine.commit(live, [(SagaKind.SAGA_STARTED, {"reason": "cancel", "after_seq": 0,
                                                               "error": {"type": "Cancelled", "message": why}})])
            await self.engine.drive(live)
        else:
            self.engine.commit(live, [(K.RUN_CANCELLED, {"reason": why, "by": self.engine.cfg.owner})])
        return self._result(run_id, live.wf, live.rs)

    async def acompensate(self, run_id: str) -> RunResult:
        rec = self.store.get_run(run_id)
        if rec.status != "compensation_failed":
            raise RunStateError(f"run {run_id!r} is {rec.status}; only a compensation_failed run has compensations to retry")
        live = self._take_over(rec)
        self.engine.commit(live, [(SagaKind.SAGA_RETRIED, {"by": self.engine.cfg.owner})])
        await self.engine.drive(live)
        return self._result(run_id, live.wf, live.rs)

    async def arollback(self, run_id: str, *, to: int | str, input: dict[str, Any] | None = None,
                        next_step: str | None = None) -> RunResult:
        rec = self.store.get_run(run_id)
        if rec.status in ("cancelled", "compensating"):
            raise RunStateError(f"run {run_id!r} is {rec.status}; it cannot be rolled back")
        wf = self._workflow_for(rec)
        if next_step is not None and next_step not in wf.steps:
            raise RunStateError(f"next_step {next_step!r} is not a step of workflow {wf.name!r}")
        events = [(e.seq, e.kind, codec.loads(e.data)) for e in self.store.events(run_id)]
        seq = _checkpoint_seq(run_id, events, to)
        checkpoint = fold(events[:seq], wf.reduce)
        if checkpoint.done:
            raise RunStateError(f"seq {seq} of run {run_id!r} is in the middle of a tick; roll back to a step "
                                "or to a snapshot's seq")
        if input is not None:
            codec.dumps(input, what="rollback input")
        live = self._take_over(rec, workflow=wf)
        self.engine.commit(live, [(SagaKind.SAGA_STARTED, {
            "reason": "rollback", "after_seq": seq, "restore": checkpoint.to_json(), "input": input,
            "next": [next_step] if next_step else None})])
        await self.engine.drive(live)
        return self._result(run_id, wf, live.rs)

    def _take_over(self, rec: RunRecord, *, workflow: Workflow | None = None) -> Live:
        """Take the run's lease now (fencing out any owner) and restore its state."""
        wf = workflow or self._workflow_for(rec)
        cfg = self.engine.cfg
        token = self.store.leases.acquire(rec.run_id, owner=cfg.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                         force=True)
        rs, snap_seq, _ = self.engine.restore(rec.run_id, wf)
        return Live(rec.run_id, wf, token, rs, snap_seq)

    # -- reading ---------------------------------------------------------------------------------
    def result(self, run_id: str) -> RunResult:
        """The run's current status and folded state, without driving it."""
        rec = self.store.get_run(run_id)
        wf = self._workflow_for(rec, required=False)
        rs, _, _ = self.engine.restore(run_id, wf) if wf else self._fold_plain(run_id)
        return self._result(run_id, wf, rs, status=rec.status)

    # -- internals -------------------------------------------------------------------------------
    def _create(self, workflow: Workflow, input: Any, *, run_id: str | None, lease: bool,
                **placement: Any) -> Live | None:
        self.register(workflow)
        wf = workflow
        if run_id is not None and (not isinstance(run_id, str) or not run_id or len(run_id) > 200):
            raise ConfigurationError(f"run_id must be a non-empty string of at most 200 characters, got {run_id!r}")
        rid = run_id or uuid.uuid4().hex
        initial = wf.initial_state(input)
        data = {
            "workflow": wf.name,
            "version": wf.version,
            "fingerprint": wf.fingerprint,
            "graph": wf.describe(),
            "target": target_of(wf),
            "input": initial,
            "start": wf.start_steps,
        }
        text = codec.dumps(data, what=f"input of workflow {wf.name!r}")
        cfg = self.engine.cfg
        now = cfg.clock()
        try:
            token = self.store.create_run(
                run_id=rid, workflow=wf.name, version=wf.version, fingerprint=wf.fingerprint,
                target=data["target"] or "", created_at=now, status="running" if lease else "pending",
                events=[NewEvent(seq=1, kind=K.RUN_STARTED, data=text, at=now)],
                lease_owner=cfg.owner if lease else None, lease_ttl=cfg.lease_ttl if lease else None,
                **placement,  # queue, priority, dedup_key (enqueue)
            )
        except DuplicateRunError as dup:
            if run_id is None or dup.existing_run_id != run_id:  # a dedup key's clash: the caller's
                raise
            existing = self.store.get_run(run_id)
            if existing.workflow != wf.name:
                raise RunStateError(
                    f"run {run_id!r} already exists for workflow {existing.workflow!r}, not {wf.name!r}"
                ) from None
            return None
        rs = fold([(1, K.RUN_STARTED, codec.loads(text))], wf.reduce)
        return Live(rid, wf, token, rs, 0)

    async def _continue(self, run_id: str, *, force: bool, allow: bool | None) -> RunResult:
        rec = self.store.get_run(run_id)
        if rec.status in TERMINAL_STATUSES:
            return self.result(run_id)
        wf = self._workflow_for(rec)
        self._check_graph(rec, wf, allow)
        cfg = self.engine.cfg
        token = self.store.leases.acquire(run_id, owner=cfg.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                         force=force, status="running")
        return await self._drive_claimed(run_id, token, allow=allow, workflow=wf)

    async def _drive_claimed(self, run_id: str, token: int, *, allow: bool | None,
                             workflow: Workflow | None = None) -> RunResult:
        rec = self.store.get_run(run_id)
        wf = workflow or self._workflow_for(rec)
        if workflow is None:
            self._check_graph(rec, wf, allow)
        rs, snap_seq, rejected = self.engine.restore(run_id, wf)
        live = Live(run_id, wf, token, rs, snap_seq)
        missing = [s for s in {*rs.frontier, *rs.done, *rs.visits} if s not in wf.steps]
        if missing:
            raise GraphChangedError(
                f"run {run_id!r} journaled step(s) {sorted(missing)} that workflow {wf.name!r} no longer has",
                differences=[f"step {s!r} removed" for s in sorted(missing)],
            )
        batch: list[tuple[str, dict[str, Any]]] = [
            (K.SNAPSHOT_REJECTED, {"seq": seq, "reason": why}) for seq, why in rejected
        ]
        # The fencing token is called "lease": a field named "token" reads as a secret to the redactor.
        batch.append((K.RESUMED, {"owner": self.engine.cfg.owner, "lease": token,
                                  "snapshot_seq": snap_seq, "replayed": rs.seq - snap_seq}))
        self.engine.commit(live, batch)
        await self.engine.drive(live)
        return self._result(run_id, wf, live.rs)

    def _workflow_for(self, rec: RunRecord, *, required: bool = True) -> Workflow | None:
        wf = self._workflows.get(rec.workflow)
        if wf is not None:
            return wf
        if rec.target:
            try:
                loaded = load_target(rec.target)
            except WorkflowNotFoundError:
                if required:
                    raise
                return None
            if loaded.name != rec.workflow:
                if required:
                    raise WorkflowNotFoundError(
                        f"target {rec.target!r} of run {rec.run_id!r} is workflow {loaded.name!r}, not {rec.workflow!r}"
                    )
                return None
            self.register(loaded)
            return loaded
        if required:
            raise WorkflowNotFoundError(
                f"workflow {rec.workflow!r} of run {rec.run_id!r} is not registered and the run records no import "
                "target; pass it with Orchestrator(workflows=[...])"
            )
        return None

    def _check_graph(self, rec: RunRecord, wf: Workflow, allow: bool | None) -> None:
        if rec.fingerprint == wf.fingerprint and rec.version == wf.version:
            return
        first = self.store.events(rec.run_id, after_seq=0, until_seq=1)
        old_graph = codec.loads(first[0].data).get("graph", {}) if first else {}
        diffs = graph_differences(old_graph, wf.describe())
        if rec.version != wf.version:
            diffs.insert(0, f"version {rec.version!r} -> {wf.version!r}")
        allowed = self.allow_graph_change if allow is None else allow
        if not allowed:
            raise GraphChangedError(
                f"run {rec.run_id!r} started with a different definition of workflow {wf.name!r}: "
                + "; ".join(diffs or ["graph fingerprint differs"])
                + ". If the change is compatible, resume with allow_graph_change=True (--allow-graph-change).",
                differences=diffs,
            )
        _log.warning("run %s continues under a changed graph: %s", rec.run_id, "; ".join(diffs))

    def _fold_plain(self, run_id: str) -> tuple[RunState, int, list[Any]]:
        events = self.store.events(run_id)
        return fold((e.seq, e.kind, codec.loads(e.data)) for e in events), 0, []

    def _result(self, run_id: str, wf: Workflow | None, rs: RunState, *, status: str | None = None) -> RunResult:
        state: Any = rs.state
        if wf is not None and wf.state_model is not None:
            try:
                state = wf.view(rs.state)
            except Exception:  # a state that no longer validates is still shown, as a dict
                state = dict(rs.state)
        error = None
        if rs.error:
            error = f"{rs.error.get('type')}: {rs.error.get('message')}"
        return RunResult(run_id=run_id, status=status or rs.status, state=state,
                         workflow=wf.name if wf else "", seq=rs.seq, error=error)


def _checkpoint_seq(run_id: str, events: list[tuple[int, str, Any]], to: int | str) -> int:
    """The journal seq a rollback returns to: a seq, or the tick start of a step's last execution."""
    last = events[-1][0] if events else 0
    if isinstance(to, bool) or not isinstance(to, (int, str)):
        raise RunStateError(f"rollback target must be a seq or a step name, got {to!r}")
    if isinstance(to, int):
        if not 1 <= to <= last:
            raise RunStateError(f"run {run_id!r} has no checkpoint at seq {to}: its journal holds seq 1..{last}")
        return to
    completions = [d for _, kind, d in events if kind == K.STEP_COMPLETED and d["step"] == to]
    if not completions:
        raise RunStateError(f"run {run_id!r} has no completed step {to!r} to roll back to")
    state_at = completions[-1].get("input", {}).get("state_at")
    if state_at is None:  # the step declared reads=: find its tick's start by folding
        tick = completions[-1]["tick"]
        rs = RunState()
        for seq, kind, data in events:
            if rs.tick == tick and not rs.done and rs.seq:
                return rs.seq
            from orchestrator.engine.fold import apply

            apply(rs, seq, kind, data)
        raise RunStateError(f"cannot locate the start of step {to!r}'s tick in run {run_id!r}")
    return int(state_at)


def _sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("called the sync Orchestrator API inside a running event loop; use the a-prefixed twin "
                       "(await orc.arun(...), orc.aresume(...), ...)")
