"""``Engine``: the durable core, composed of one part per idea, and the life of a run.

The parts: a ``JournalWriter`` (the one door to the journal), a ``StepRunner`` (a step's attempts
and events), a ``SagaRunner`` (compensations), a ``Driver`` (the tick loop), a ``Heartbeat``
(leases) and a ``WorkflowRegistry`` (which code drives which run). The Engine wires them once, from
constructor arguments (hooks included), and offers the operations on runs: create, restore, drive,
resume, take over, recover, cancel, compensate, roll back, signal, snapshot. The ``Orchestrator``
facade adds the sync API, the tools and the audit reads on top.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import socket
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compensations import Compensations
from orchestrator.engine import rollback
from orchestrator.engine.config import EngineConfig, default_owner
from orchestrator.engine.code_changes import changed_steps, migrate_state, migration_path
from orchestrator.engine.driver import Driver
from orchestrator.engine.events import ACTIVE_STATUSES, TERMINAL_STATUSES
from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, awaited_names, fold
from orchestrator.engine.graph_changes import graph_differences
from orchestrator.engine.names import name_problem, shown as _shown
from orchestrator.engine.journal import ActiveRun, JournalWriter, Observer
from orchestrator.engine.leases import Heartbeat
from orchestrator.engine.reading import read_state, recorded_reducers
from orchestrator.engine.registry import WorkflowRegistry
from orchestrator.engine.result import RunResult
from orchestrator.engine.saga import SagaRunner, has_pending_effects, in_flight_doubts, run_in_doubt
from orchestrator.engine.services import ToolsForSteps
from orchestrator.engine import savepoints
from orchestrator.engine.snapshots import (
    AGENTSAGA_VERSION,
    make_snapshot,
    resolve_chains,
    restore_run,
    sign_snapshot,
    snapshot_problem,
)
from orchestrator.engine.steps import StepRunner
from orchestrator.errors import (
    CodeChangedError,
    ConfigurationError,
    GraphChangedError,
    JournalDamagedError,
    MigrationError,
    RunStateError,
    SavepointError,
)
from orchestrator.payload import codec
from orchestrator.payload.exceptions import error_record
from orchestrator.payload.redact import JournalRedactor, Redactor
from store import ConflictError, DuplicateRunError, LeaseHeldError, NewEvent, RunRecord, Store, StoreError
from workflows import Workflow

__all__ = ["Engine", "EngineConfig", "default_owner", "make_result"]

_log = logging.getLogger("agentsaga")


class Engine:
    """The durable core (see the module docstring)."""

    def __init__(self, store: Store, config: EngineConfig, *, workflows: WorkflowRegistry,
                 compensations: Compensations | None = None, tools: ToolsForSteps | None = None,
                 redactor: Redactor | None = None, replay: Any = None, observers: Iterable[Observer] = ()) -> None:
        self.store = store
        self.config = config
        self.workflows = workflows
        self.journal = JournalWriter(store, clock=config.clock, redact=JournalRedactor(redactor or Redactor()),
                                     snapshot_every=config.snapshot_every, keep_snapshots=config.keep_snapshots,
                                     incremental=config.incremental_snapshots,
                                     observers=observers, signing_key=config.signing_key)
        self.heartbeat = Heartbeat(store, ttl=config.lease_ttl, clock=config.clock, interval=config.heartbeat)
        self._creator: concurrent.futures.ThreadPoolExecutor | None = None  # see acreate
        steps = StepRunner(self.journal, store=store, clock=config.clock, sleep=config.sleep, rng=config.rng,
                           compensations=compensations, tools=tools, replay=replay)
        saga = SagaRunner(self.journal, compensations, clock=config.clock, sleep=config.sleep, rng=config.rng,
                          tools=tools, replaying=replay is not None)
        self.driver = Driver(self.journal, steps, saga, self.heartbeat, store=store, clock=config.clock,
                             gc_young=config.gc_young)

    def close(self) -> None:
        self.heartbeat.stop()
        self.journal.close()
        creator, self._creator = self._creator, None
        if creator is not None:
            creator.shutdown(wait=True)

    async def acreate(self, wf: Workflow, input: Any, *, run_id: str | None, lease: bool) -> ActiveRun | None:
        """``create`` for async callers: while other runs are being driven, the run's first transaction
        joins the group committer (shared with the creations and commits queued meanwhile), not made
        on the event loop. An adaptive snapshot policy reads recent runs to choose: that reading and
        the creation are made on a thread of their own (one, so one more connection at most)."""
        if self.journal.driving == 0:
            return self.create(wf, input, run_id=run_id, lease=lease)
        if self.journal.policy(wf).adaptive is not None:
            if self._creator is None:
                self._creator = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentsaga-create")
            return await asyncio.wrap_future(self._creator.submit(self.create, wf, input, run_id=run_id, lease=lease))
        item, choice = self._plan_create(wf, input, run_id=run_id, lease=lease, parent=None, start=None,
                                         with_choice=False)
        try:
            token = await self.journal.acreate(item)
        except DuplicateRunError as dup:
            return self._duplicate(wf, run_id, dup)
        return self._created(wf, item, token, choice)

    # -- starting ----------------------------------------------------------------------------------
    def create(self, wf: Workflow, input: Any, *, run_id: str | None, lease: bool, parent: dict[str, Any] | None = None,
               start: list[str] | None = None, **placement: Any) -> ActiveRun | None:
        """Journal a new run (``RunStarted`` and the run row in one transaction). Leased by this
        process when ``lease``; None when ``run_id`` exists already for the same workflow."""
        item, choice = self._plan_create(wf, input, run_id=run_id, lease=lease, parent=parent, start=start,
                                         with_choice=True, **placement)
        try:
            token = self.store.create_run(**item)
        except DuplicateRunError as dup:
            return self._duplicate(wf, run_id, dup)
        return self._created(wf, item, token, choice)

    def _plan_create(self, wf: Workflow, input: Any, *, run_id: str | None, lease: bool,
                     parent: dict[str, Any] | None, start: list[str] | None, with_choice: bool,
                     **placement: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """What creating the run writes (``store.create_run``'s arguments), and the adaptive policy's
        choice (only ``with_choice``: it reads the store)."""
        self.workflows.register(wf)
        if run_id is not None and (problem := name_problem(run_id)) is not None:
            raise ConfigurationError(f"run_id must be {problem}, got {_shown(run_id)}")
        rid = run_id or uuid.uuid4().hex
        # The run names its workflow, never where its code lives (invariant 11); the reducer kinds
        # let a reader without the code fold the state right (engine/reading.py).
        data = {
            "workflow": wf.name, "version": wf.version, "fingerprint": wf.fingerprint, "graph": wf.describe(),
            "reducers": recorded_reducers(wf), "input": wf.initial_state(input), "start": start or wf.start_steps,
        }
        if parent is not None:
            data["parent"] = parent
        what = (f"fork of run {parent['run_id']!r} at step {parent['step']!r}" if parent
                else f"input of workflow {wf.name!r}")
        text = self.journal.redact(codec.dumps(data, what=what))  # the input is a door too (invariant 9)
        cfg = self.config
        now = cfg.clock()
        events = [NewEvent(seq=1, kind=EventKind.RUN_STARTED, data=text, at=now)]
        choice = self.choose_interval(wf, now) if with_choice else None
        if choice is not None:
            events.append(NewEvent(seq=2, kind=EventKind.SNAPSHOT_POLICY, data=codec.dumps(choice), at=now))
        item = dict(
            run_id=rid, workflow=wf.name, version=wf.version, fingerprint=wf.fingerprint,
            target="", created_at=now, status="running" if lease else "pending",
            events=events,
            lease_owner=cfg.owner if lease else None, lease_ttl=cfg.lease_ttl if lease else None,
            parent_run_id=parent["run_id"] if parent else None,
            **placement,  # queue, priority, dedup_key (enqueue)
        )
        return item, choice

    def _duplicate(self, wf: Workflow, run_id: str | None, dup: DuplicateRunError) -> None:
        """The run id (or dedup key) is taken: None when it is this workflow's run of that id, else raise."""
        if run_id is None or dup.existing_run_id != run_id:  # a dedup key's clash: the caller's
            raise dup
        existing = self.store.get_run(run_id)
        if existing.workflow != wf.name:
            raise RunStateError(
                f"run {run_id!r} already exists for workflow {existing.workflow!r}, not {wf.name!r}"
            ) from None

    def _created(self, wf: Workflow, item: dict[str, Any], token: int, choice: dict[str, Any] | None) -> ActiveRun:
        events = item["events"]
        folded = fold(((e.seq, e.kind, codec.loads(e.data)) for e in events), wf.reduce)
        return ActiveRun(item["run_id"], wf, token, folded, 0, snapshot_at=item["created_at"],
                         every=choice["every"] if choice else None)

    def choose_interval(self, wf: Workflow, now: float) -> dict[str, Any] | None:
        """An adaptive snapshot policy's choice for a run of ``wf`` starting or resuming now, with its
        inputs (the ``SnapshotPolicy`` event's data); None when the policy is not adaptive."""
        adaptive = self.journal.policy(wf).adaptive
        if adaptive is None:
            return None
        recent = self.store.list_runs(workflow=wf.name, limit=adaptive.window)
        # Troubled: taken over after its owner died, or lying crashed (active, its lease expired).
        troubled = sum(1 for r in recent if r.recoveries > 0 or (
            r.status in ACTIVE_STATUSES and r.lease_owner is not None and (r.lease_expires_at or 0) < now))
        every = adaptive.choose(len(recent), troubled)
        rate = troubled / len(recent) if recent else 0.0
        return {"every": every, "policy": "adaptive", "bounds": [adaptive.min_every, adaptive.max_every],
                "inputs": {"window": adaptive.window, "runs": len(recent), "troubled": troubled,
                           "rate": round(rate, 4), "full_at": adaptive.full_at}}

    # -- reading and restoring -------------------------------------------------------------------
    def restore(self, run_id: str, wf: Workflow | None) -> tuple[RunState, int, list[tuple[int, str]]]:
        """Newest snapshot that verifies + the events after it: (state, snapshot seq, rejected).
        Without the workflow (not registered here) the state is folded with plain replacement."""
        if wf is None:
            events = self.store.events(run_id)
            return fold((e.seq, e.kind, codec.loads(e.data)) for e in events), 0, []
        return restore_run(self.store, run_id, wf.reduce, key=self.config.signing_key)

    def result(self, run_id: str) -> RunResult:
        """The run's current status and folded state, without driving it. Without its workflow
        registered, the state is read without code and ``note`` says how (engine/reading.py)."""
        rec = self.store.get_run(run_id)
        wf = self.workflows.for_run(rec, required=False)
        reading = read_state(self.store, run_id, wf, key=self.config.signing_key)
        if wf is not None:
            return self.with_failed_step(make_result(run_id, wf, reading.folded, status=rec.status))
        result = make_result(run_id, None, reading.folded, status=rec.status, note=reading.describe())
        return self.with_failed_step(dataclasses.replace(result, workflow=rec.workflow))

    def with_failed_step(self, result: RunResult) -> RunResult:
        """``result`` with ``failed_step`` filled in from the journal when a step's failure ended the run
        (the newest ``RunFailed``, or ``SagaStarted`` for a failure); read only for such runs."""
        if result.status not in ("failed", "compensated", "compensation_failed"):
            return result
        for event in reversed(self.store.events(result.run_id)):
            if event.kind == EventKind.RUN_FAILED or event.kind == EventKind.SAGA_STARTED:
                data = codec.loads(event.data)
                if event.kind == EventKind.SAGA_STARTED and data.get("reason") != "failure":
                    return result  # a cancel's or a rollback's saga: no step failed
                step = data.get("step")
                return dataclasses.replace(result, failed_step=step) if isinstance(step, str) else result
        return result

    # -- driving ---------------------------------------------------------------------------------
    async def drive(self, run: ActiveRun) -> RunResult:
        await self.driver.drive(run)
        return self.with_failed_step(make_result(run.run_id, run.workflow, run.folded))

    async def resume(self, run_id: str, *, force: bool, allow_graph_change: bool | None) -> RunResult:
        """Continue a run now (``force``: take its lease over, fencing out a previous owner)."""
        rec = self.store.get_run(run_id)
        if rec.status in TERMINAL_STATUSES:
            return self.result(run_id)
        wf = self.workflows.for_run(rec)
        assert wf is not None
        self.check_graph(rec, wf, allow_graph_change)
        cfg = self.config
        try:
            token = self.store.leases.acquire(run_id, owner=cfg.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                              force=force, status="running")
        except LeaseHeldError as held:
            # This very Orchestrator holds the lease but drives nothing under it: a create (or a
            # release) whose reply was lost left it behind. Nobody else can be using it.
            orphaned = held.owner == cfg.owner and not self.heartbeat.holds(run_id)
            if not orphaned and not owner_is_dead(held.owner):
                raise LeaseHeldError(_held_message(run_id, held, cfg.clock()), run_id=run_id, owner=held.owner,
                                     expires_at=held.expires_at) from None
            # Its owner was a process on this machine that no longer exists (it was killed), or is
            # this one and drives nothing: running the same program again is the natural recovery,
            # so take the run over now.
            _log.info("run %s: its owner %s is gone or idle; taking it over", run_id, held.owner)
            token = self.store.leases.acquire(run_id, owner=cfg.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                              force=True, status="running")
        return await self.drive_claimed(run_id, token, workflow=wf, before=rec)

    async def drive_claimed(self, run_id: str, token: int, *, workflow: Workflow | None = None,
                            allow_graph_change: bool | None = None, before: Any = None) -> RunResult:
        """Restore a run whose lease this process holds (``token``), journal ``Resumed``, drive it.
        ``before``: the run's record from before its lease was taken (by ``resume``, which marks it
        running and un-parks it): a resume that refuses gives the run back as it was."""
        wf = workflow
        rec = self.store.get_run(run_id)
        if wf is None:
            wf = self.workflows.for_run(rec)
            assert wf is not None
            self.check_graph(rec, wf, allow_graph_change)
        migrated: tuple[str, str] | None = None
        upgrade: dict[str, Any] | None = None
        changed: dict[str, dict[str, str]] = {}
        try:
            folded, snap_seq, rejected = self.restore(run_id, wf)
            if rec.version != wf.version and migration_path(wf, rec.version) is not None:
                state, names = migrate_state(run_id, wf, folded.state, rec.version)
                upgrade = {"from": rec.version, "to": wf.version, "migrations": names, "state": state}
                migrated = (wf.version, wf.fingerprint)
            changed = changed_steps(folded.code, wf)
            if changed and wf.on_code_change == "refuse" and upgrade is None:  # a migration declares the change
                raise CodeChangedError(
                    f"run {run_id!r}: the code of step(s) {', '.join(sorted(changed))} of workflow {wf.name!r} changed "
                    "since they ran, and the workflow refuses to mix old and new results (on_code_change='refuse'); "
                    "restore the old code, or declare on_code_change='journal' to continue",
                    changed=changed)
        except (MigrationError, CodeChangedError, JournalDamagedError):
            try:
                if before is not None:  # still waiting for its signal or timer: for the old code to resume it
                    self.store.leases.release(run_id, token=token, now=self.config.clock(), status=before.status,
                                              error=before.error, wake_at=before.wake_at)
                else:
                    self.store.leases.release(run_id, token=token, now=self.config.clock())
            except StoreError:
                pass  # fenced or gone meanwhile: the lease is not ours to give back
            raise
        now = self.config.clock()
        choice = self.choose_interval(wf, now)
        run = ActiveRun(run_id, wf, token, folded, snap_seq, snapshot_at=now,
                        every=choice["every"] if choice else None)
        run.row_status = rec.status  # a worker's claim leaves a queued run's row 'pending'
        missing = [s for s in {*folded.frontier, *folded.done, *folded.visits} if s not in wf.steps]
        if missing:
            raise GraphChangedError(
                f"run {run_id!r} journaled step(s) {sorted(missing)} that workflow {wf.name!r} no longer has",
                differences=[f"step {s!r} removed" for s in sorted(missing)],
            )
        batch: list[tuple[str, dict[str, Any]]] = [
            (EventKind.SNAPSHOT_REJECTED, {"seq": seq, "reason": why}) for seq, why in rejected
        ]
        # The fencing token is called "lease": a field named "token" reads as a secret to the redactor.
        batch.append((EventKind.RESUMED, {"owner": self.config.owner, "lease": token,
                                  "snapshot_seq": snap_seq, "replayed": folded.seq - snap_seq}))
        if choice is not None:
            batch.append((EventKind.SNAPSHOT_POLICY, choice))
        if changed:
            batch.append((EventKind.CODE_CHANGED, {"steps": changed, "policy": wf.on_code_change}))
            _log.warning("run %s: step code changed since it ran: %s", run_id, ", ".join(sorted(changed)))
        if upgrade is not None:
            batch.append((EventKind.MIGRATED, upgrade))
        self.journal.commit(run, batch, workflow_version=migrated)
        for seq, why in rejected:
            # The catalog remembers the verdict, so the next recovery skips it unread (an earlier
            # verdict, a person's quarantine included, stands).
            self.store.mark_snapshot(run_id, seq, "failed", reason=why, checked_at=self.config.clock(),
                                     keep_bad=True)
        return await self.drive(run)

    async def recover(self, *, limit: int | None = None) -> list[RunResult]:
        """Resume every interrupted run whose lease has expired (or that was never leased)."""
        results: list[RunResult] = []
        tried: list[str] = []
        cfg = self.config
        while limit is None or len(results) < limit:
            # One run at a time, never the same one twice in one call: one bad run never blocks the
            # others, and a run that could not be driven is reported, not retried in a loop.
            claimed = self.store.queues.claim_some(owner=cfg.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                                   statuses=ACTIVE_STATUSES, limit=1, not_runs=tried)
            if not claimed:
                break
            run_id, token = claimed[0]
            tried.append(run_id)
            try:
                results.append(await self.drive_claimed(run_id, token))
            except (StoreError, asyncio.CancelledError):
                raise  # the database or the lease is gone: nothing else can be recovered either
            except Exception as exc:
                # Leave the run as the journal has it (for a process with its code, or a fix); say why.
                why = error_record(exc, with_traceback=False)  # bounded, and safe from a __str__ that raises
                _log.error("recover: run %s not recovered: %s: %s", run_id, type(exc).__name__, why["message"])
                try:
                    self.store.leases.release(run_id, token=token, now=cfg.clock())
                except StoreError:
                    pass  # fenced or gone meanwhile: the lease is not ours to give back
                rec = self.store.get_run(run_id)
                results.append(RunResult(run_id=run_id, status=rec.status, state=None, workflow=rec.workflow,
                                         seq=self.store.last_seq(run_id),
                                         error=f"{type(exc).__name__}: {why['message']}"))
        return results

    def take_over(self, rec: RunRecord, *, workflow: Workflow | None = None) -> ActiveRun:
        """Take the run's lease now (fencing out any owner) and restore its state."""
        wf = workflow or self.workflows.for_run(rec)
        assert wf is not None
        cfg = self.config
        token = self.store.leases.acquire(rec.run_id, owner=cfg.owner, ttl=cfg.lease_ttl, now=cfg.clock(), force=True)
        folded, snap_seq, _ = self.restore(rec.run_id, wf)
        return ActiveRun(rec.run_id, wf, token, folded, snap_seq, snapshot_at=cfg.clock())

    def check_graph(self, rec: RunRecord, wf: Workflow, allow: bool | None) -> None:
        """Refuse to continue a run whose workflow's graph or version changed, unless allowed, or
        unless the workflow declares a migration path from the run's version."""
        if rec.fingerprint == wf.fingerprint and rec.version == wf.version:
            return
        if rec.version != wf.version and migration_path(wf, rec.version) is not None:
            return  # the declared migration is the compatibility (drive_claimed applies it)
        first = self.store.events(rec.run_id, after_seq=0, until_seq=1)
        old_graph = codec.loads(first[0].data).get("graph", {}) if first else {}
        diffs = graph_differences(old_graph, wf.describe())
        if not diffs and rec.version == wf.version:
            return  # the same graph, described otherwise by an older agentsaga (engine/graph_changes.py)
        if rec.version != wf.version:
            diffs.insert(0, f"version {rec.version!r} -> {wf.version!r}")
        allowed = self.config.allow_graph_change if allow is None else allow
        if not allowed:
            raise GraphChangedError(
                f"run {rec.run_id!r} started with a different definition of workflow {wf.name!r}: "
                + "; ".join(diffs or ["graph fingerprint differs"])
                + ". If the change is compatible, resume with allow_graph_change=True (--allow-graph-change).",
                differences=diffs,
            )
        _log.warning("run %s continues under a changed graph: %s", rec.run_id, "; ".join(diffs))

    # -- operations on a run ---------------------------------------------------------------------
    async def cancel(self, run_id: str, *, reason: str | None, compensate: bool) -> RunResult:
        rec = self.store.get_run(run_id)
        if rec.status in TERMINAL_STATUSES:
            raise RunStateError(f"run {run_id!r} is already {rec.status}; nothing to cancel")
        run = self.take_over(rec)
        why = reason or "cancelled by request"
        # An effect in flight (its intent journaled, not its outcome: its process was killed, or is
        # fenced by this cancel with its request out) may stand. A cancel neither re-sends it (that
        # would make the effect it is stopping) nor asks its check hook (a "not found" now cannot
        # exclude a request the service is still processing, and nothing would re-send it after): it is
        # recorded in doubt, with the saga when one runs (even with nothing to undo), else here.
        doubts = in_flight_doubts(run.folded)
        if compensate and (has_pending_effects(run.folded) or doubts):
            self.journal.commit(run, [(EventKind.SAGA_STARTED, {"reason": "cancel", "after_seq": 0,
                                                        "error": {"type": "Cancelled", "message": why}})])
            return await self.drive(run)
        data: dict[str, Any] = {"reason": why, "by": self.config.owner}
        if doubts:
            data["in_doubt"] = doubts
        self.journal.commit(run, [(EventKind.RUN_CANCELLED, data)])
        return make_result(run_id, run.workflow, run.folded)

    async def compensate(self, run_id: str) -> RunResult:
        rec = self.store.get_run(run_id)
        if rec.status != "compensation_failed":
            raise RunStateError(f"run {run_id!r} is {rec.status}; only a compensation_failed run has compensations "
                                "to retry")
        run = self.take_over(rec)
        # The run stands again for what started the saga (a step's failure, a cancel; nothing for a
        # rollback), not for the compensation that failed: the event says so, so that its meaning is
        # in the journal (a SagaRetried written before it carried "error" folds as it did then).
        started = (run.folded.saga or {}).get("error")
        self.journal.commit(run, [(EventKind.SAGA_RETRIED, {"by": self.config.owner, "error": started or None})])
        return await self.drive(run)

    async def rollback(self, run_id: str, *, to: int | str, input: dict[str, Any] | None,
                       next_step: str | None) -> RunResult:
        rec = self.store.get_run(run_id)
        if rec.status in ("cancelled", "compensating"):
            raise RunStateError(f"run {run_id!r} is {rec.status}; it cannot be rolled back")
        wf = self.workflows.for_run(rec)
        assert wf is not None
        if next_step is not None and next_step not in wf.steps:
            raise RunStateError(f"next_step {next_step!r} is not a step of workflow {wf.name!r}")
        events = [(e.seq, e.kind, codec.loads(e.data)) for e in self.store.events(run_id)]
        seq = rollback.checkpoint_seq(run_id, events, to)
        # Only a seq between ticks is a checkpoint (engine/rollback.py); any other is refused here,
        # before the lease is taken or anything is journaled.
        checkpoint = rollback.checkpoint_state(run_id, events, seq, wf.reduce)
        if input is not None:
            codec.dumps(input, what="rollback input")
        run = self.take_over(rec, workflow=wf)
        self.journal.commit(run, [(EventKind.SAGA_STARTED, {
            "reason": "rollback", "after_seq": seq, "restore": checkpoint.to_json(), "input": input,
            "next": [next_step] if next_step else None})])
        return await self.drive(run)

    def signal(self, run_id: str, name: str, data: Any) -> None:
        """Send signal ``name`` to a run; a waiting run is woken (see ``Orchestrator.signal``)."""
        if (problem := name_problem(name)) is not None:  # a bad argument, whatever the run
            raise ValueError(f"a signal's name must be {problem}, got {_shown(name)}")
        rec = self.store.get_run(run_id)
        if rec.status in TERMINAL_STATUSES:
            raise RunStateError(f"run {run_id!r} is {rec.status}; it waits for no signal")
        # Any name is accepted at any moment: a signal for a wait the run has not reached yet is kept
        # until a step waits for it (and then consumed exactly once).
        text = self.journal.redact(codec.dumps(data, what=f"data of signal {name!r}"))  # invariant 9
        now = self.config.clock()
        self.store.signals.send(run_id, name, text, now=now)
        if rec.status == "waiting":
            # Wake the run only if it waits for this signal (a signal for a later wait stays pending).
            # A run that parks after this look finds the signal itself (``wakeups.park``).
            folded = self.restore(run_id, self.workflows.for_run(rec, required=False))[0]
            if name in awaited_names(folded):
                self.store.wakeups.wake(run_id, now=now)

    def snapshot(self, run_id: str) -> int:
        """Write a snapshot of the run now (on demand) and return its seq (see ``Orchestrator.snapshot``)."""
        rec = self.store.get_run(run_id)
        # A snapshot is trusted by recoveries: fold it with the workflow's own reducers, never without.
        wf = self.workflows.for_run(rec)
        assert wf is not None
        folded = self.restore(run_id, wf)[0]
        cfg = self.config
        snap = make_snapshot(folded, "on_demand", cfg.clock(), self.journal.snapshot_meta(wf), run_id=run_id,
                             key=cfg.signing_key)
        if any(s.seq == snap.seq for s in self.store.snapshot_catalog(run_id)):
            return snap.seq
        try:
            # Pruned here only when no process holds the run: the one driving it may be writing a chain of
            # incremental snapshots whose base this newer one would push out of the newest K.
            self.store.append(run_id, [], token=rec.lease_token, now=cfg.clock(), snapshot=snap,
                              keep_snapshots=self.journal.policy(wf).keep if rec.lease_owner is None else None)
        except ConflictError:
            pass  # the driving process wrote one at this seq first
        return snap.seq


    # -- savepoints ------------------------------------------------------------------------------
    def savepoint(self, run_id: str, *, name: str, path: str | os.PathLike[str]) -> Path:
        """Write the run as a savepoint file (see ``engine/savepoints.py``): its row, its newest
        snapshot that verifies, its whole journal, its pending signals, a hash chain, signed when a
        key is configured."""
        # The catalog and snapshot first, then the journal: a snapshot is written with the event at
        # its seq, so the journal read afterwards always holds it, even while the run is driven.
        # An incremental snapshot is materialised from its chain: the file holds a self-contained one.
        snapshot = None
        bad = {i.seq for i in self.store.snapshot_catalog(run_id) if i.validity in ("failed", "quarantined")}
        key = self.config.signing_key
        stored = [s for s in self.store.snapshots(run_id) if s.seq not in bad]  # newest first
        found, problems = resolve_chains(stored, key=key, run_id=run_id)
        for snap in found:
            if snap.seq not in problems and snapshot_problem(snap) is None:
                snapshot = snap
                break
        # The inbox before the journal: a signal consumed in between is then in both, and is left
        # out by the SignalReceived that names it (consuming journals it in the same transaction),
        # never carried twice. One sent after this read stays here, like one sent after the file.
        inbox = self.store.signals.pending(run_id)
        events = self.store.events(run_id)
        rec = self.store.get_run(run_id)
        consumed = _consumed_here(events)
        signals = [savepoints.PendingSignal(id=i, name=n, data=d, sent_at=at)
                   for i, n, d, at in inbox if i not in consumed]
        doc = savepoints.build_savepoint(name, rec, snapshot, events, now=self.config.clock(),
                                         agentsaga_version=AGENTSAGA_VERSION, key=self.config.signing_key,
                                         signals=signals)
        return savepoints.write_savepoint(Path(path), doc)

    def restore_savepoint(self, path: str | os.PathLike[str], *, max_bytes: int | None = None) -> str:
        """Bring a savepoint's run into this database (all or nothing); return its run id."""
        point = savepoints.read_savepoint(Path(path), key=self.config.signing_key, max_bytes=max_bytes)
        run = point.run
        wf = self.workflows.get(run["workflow"])
        if wf is None:
            known = ", ".join(sorted(self.workflows.names())) or "none"
            raise SavepointError(f"savepoint {str(path)!r} holds a run of workflow {run['workflow']!r}, which is not "
                                 f"registered here (registered: {known}); register it (--app) to restore the run")
        now = self.config.clock()
        restored = {"savepoint": point.name, "head": point.head, "signed": point.signed,
                    "created_at": point.created_at, "snapshot_seq": point.snapshot.seq if point.snapshot else 0,
                    "signals": len(point.signals), "owner": self.config.owner}
        events = [*point.events, NewEvent(seq=len(point.events) + 1, kind=EventKind.RESTORED,
                                          data=codec.dumps(restored), at=now)]
        # An unfinished run arrives unleased and pending: `resume RUN`, `recover` or a worker
        # continues it from the journal (its waits and timers are journaled, not kept on the row).
        status = "pending" if run["status"] in ACTIVE_STATUSES else run["status"]
        snapshot = point.snapshot
        if snapshot is not None and self.config.signing_key is not None:
            # The file's chain and signature vouch for its snapshot; in this database it is signed
            # with this database's key like every snapshot written here.
            snapshot = dataclasses.replace(snapshot, signature=sign_snapshot(
                self.config.signing_key, run["run_id"], snapshot.seq, snapshot.kind, snapshot.base_seq,
                snapshot.sha256))
        try:
            self.store.create_run(
                run_id=run["run_id"], workflow=run["workflow"], version=run["version"],
                fingerprint=run["fingerprint"], target="", created_at=run["created_at"], events=events,
                status=status, parent_run_id=run["parent_run_id"], snapshot=snapshot,
                finished_at=run["finished_at"], error=run["error"],
                signals=[(sig.name, sig.data, sig.sent_at) for sig in point.signals])
        except DuplicateRunError:
            raise SavepointError(f"savepoint {str(path)!r}: run {run['run_id']!r} already exists in this database; "
                                 "nothing was written") from None
        return run["run_id"]


def _consumed_here(events: Iterable[Any]) -> set[int]:
    """The ids of the signals this database's journal of a run says were consumed: those its
    ``SignalReceived`` events name after the last ``Restored`` (before it, the ids are another
    database's, which may be this one's pending signals' ids too)."""
    consumed: set[int] = set()
    for event in events:
        if event.kind == EventKind.RESTORED:
            consumed.clear()
        elif event.kind == EventKind.SIGNAL_RECEIVED:
            signal = codec.loads(event.data).get("signal")
            if isinstance(signal, int):
                consumed.add(signal)
    return consumed


def owner_is_dead(owner: str | None) -> bool:
    """Whether a lease owner (``host:pid:random``, see ``default_owner``) is provably gone: a process
    of this machine that no longer exists. Anything else (another host, a live pid, a reused pid, a
    name of another form) is presumed alive: never take a live owner's run by mistake."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, but not ours to signal
        return False
    return False


def _held_message(run_id: str, held: LeaseHeldError, now: float) -> str:
    until = held.until(now)
    return (f"run {run_id!r} is being driven by {held.owner!r}{until}. If that process is gone, take the run "
            f"over now with orc.resume({run_id!r}) or `agentsaga resume {run_id}`; otherwise let it finish, or "
            "wait for its lease to expire (`agentsaga recover`).")


def make_result(run_id: str, wf: Workflow | None, folded: RunState, *, status: str | None = None,
                note: str | None = None) -> RunResult:
    """A ``RunResult`` from a folded run: the state as the workflow's model when it has one."""
    state: Any = folded.state
    if wf is not None and wf.state_model is not None:
        try:
            state = wf.view(folded.state)
        except Exception:  # a state that no longer validates is still shown, as a dict
            state = dict(folded.state)
    error = None
    if folded.error:
        error = f"{folded.error.get('type')}: {folded.error.get('message')}"
    ended = (status or folded.status) in TERMINAL_STATUSES
    return RunResult(run_id=run_id, status=status or folded.status, state=state,
                     workflow=wf.name if wf else "", seq=folded.seq, error=error, note=note,
                     in_doubt=tuple(run_in_doubt(folded)) if ended else ())
