"""``Orchestrator``: the entry point users see, a small facade over composed parts.

- ``orc.engine`` drives runs (``orchestrator.engine.Engine``): run, start, resume, recover, cancel,
  compensate, rollback, signal, snapshot;
- ``orc.audit`` reads them (``orchestrator.audit.Audit``): list, history, summary, verify, fork,
  report, gc, stats;
- ``orc.queues`` puts runs on queues for workers (``enqueue``, ``retry_dead``);
- ``orc.tools`` is what steps use to reach the outside world (``ctx.http``, breakers, call limits).

The methods below are the names users call; each is a few lines that delegate to a part. Every
sync method is a thin wrapper over its async twin (``arun``, ``aresume``, ...).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compensations import BreakerConfig, BreakerRegistry, Compensations, default_breakers
from orchestrator._sync import run_sync
from orchestrator.audit.audit import Audit
from orchestrator.audit.gc import GcReport
from orchestrator.audit.stats import Stats
from orchestrator.audit.summary import RunSummary
from orchestrator.audit.verify import VerifyReport
from orchestrator.engine.config import DEFAULT_GC_YOUNG, EngineConfig, default_owner
from orchestrator.engine.names import name_problem, shown
from orchestrator.engine.queues import DEFAULT_QUEUE, Queues
from orchestrator.engine.registry import WorkflowRegistry
from orchestrator.engine.result import RunResult
from orchestrator.errors import ConfigurationError, RunStateError
from orchestrator.payload.redact import Redactor
from orchestrator.tools.breakers import StoreBreakers
from orchestrator.tools.limits import CallLimits, ToolLimits
from orchestrator.tools.toolbox import ToolBox
from store import ConfigError as StoreConfigError
from store import LeaseHeldError, RunRecord, SnapshotInfo, Store, open_store
from workflows import Workflow

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine
    from orchestrator.engine.journal import ActiveRun, Observer

__all__ = ["Orchestrator"]


class Orchestrator:
    """Runs workflows durably against a store.

    ``url`` is a database URL (``sqlite:///file.db``, ``postgresql://...``); without it,
    ``AGENTSAGA_DB`` or a SQLite file in the working directory. Options (keyword-only):

    - ``workflows``: the workflows this process can drive (also ``register``)
    - ``snapshot_every`` (100): write a snapshot every N events (and at the end of a run)
    - ``keep_snapshots`` (3): snapshots kept per run; older ones are pruned in the same transaction
    - ``incremental_snapshots`` (10): snapshots are incremental (only what changed since the previous
      one), a full one closing each chain after this many; ``None``: every snapshot is full
      (all three for workflows that declare no ``Workflow(snapshots=Snapshots(...))`` policy)
    - ``signing_key``: HMAC key that savepoints and snapshots are signed with, and must be signed with to be restored
    - ``lease_ttl`` (30 s): how long a lease lasts without a heartbeat
    - ``heartbeat`` (``lease_ttl / 3``): how often held leases are renewed
    - ``allow_graph_change`` (False): let ``resume`` continue a run whose graph or version changed
    - ``owner``: this process's name in leases (default ``host:pid:random``)
    - ``clock`` / ``sleep`` / ``rng``: injected time (epoch seconds), async sleep and randomness
    - ``store``: an already opened ``Store`` (then ``url`` and ``store_options`` are ignored)
    - ``store_options``: passed to ``store.open_store`` (e.g. ``sqlite_synchronous="NORMAL"``)
    - ``compensations``: a ``compensations.Compensations`` registry (compensations and check hooks
      keyed by effect name), for effects that do not carry their own
    - ``breakers``: a ``compensations.BreakerRegistry`` of breaker settings (default: the process-wide
      one that ``declare_breaker`` fills); breaker *state* lives in the store, shared by all processes
    - ``tool_limits``: in-flight calls allowed per tool across the cluster (``{"payments": 2}`` or a
      ``orchestrator.tools.ToolLimits``)
    - ``redact``: extra regex patterns scrubbed from everything journaled (secrets never reach the
      journal; Authorization headers, API keys, common key formats and sensitive fields are
      redacted by default, see ``orchestrator.payload.redact``), or a whole ``Redactor``
    - ``redact_fields``: extra field, header and parameter names whose values are redacted
    - ``max_body``: bytes of each HTTP request/response body kept in the journal (the rest is cut,
      with a marker and the full size)
    - ``replay``: a ``Cassette`` of recorded responses: durable calls (model calls, tools) are
      answered from it instead of the network, and a request that differs is an error
    - ``observers``: callables ``(run, events)`` told of every commit (progress lines, tracing)
    - ``gc_young`` (10,000): while runs are driven in this process, the cyclic collector's youngest
      generation is collected after this many net allocations instead of the interpreter's 700 (the
      thresholds are put back when the last drive ends; ``orchestrator/engine/collector.py`` says
      why); ``None`` leaves the collector alone
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        workflows: Iterable[Workflow] = (),
        snapshot_every: int = 100,
        keep_snapshots: int = 3,
        incremental_snapshots: int | None = 10,
        lease_ttl: float = 30.0,
        heartbeat: float | None = None,
        allow_graph_change: bool = False,
        owner: str | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
        store: Store | None = None,
        store_options: dict[str, Any] | None = None,
        compensations: Compensations | None = None,
        breakers: BreakerRegistry | None = None,
        tool_limits: ToolLimits | Mapping[str, int] | None = None,
        redact: Iterable[str] | Redactor = (),
        redact_fields: Iterable[str] = (),
        max_body: int = 8192,
        replay: Any = None,
        observers: Sequence[Observer] = (),
        signing_key: bytes | str | None = None,
        gc_young: int | None = DEFAULT_GC_YOUNG,
    ) -> None:
        _check_options(snapshot_every, keep_snapshots, lease_ttl, heartbeat)
        if gc_young is not None and (isinstance(gc_young, bool) or not isinstance(gc_young, int) or gc_young < 1):
            raise ConfigurationError(f"gc_young must be an integer >= 1 or None (leave the collector alone), "
                                     f"got {gc_young!r}")
        if owner is not None and (problem := name_problem(owner)) is not None:
            raise ConfigurationError(f"owner must be {problem}, got {shown(owner)}")
        if incremental_snapshots is not None and (isinstance(incremental_snapshots, bool)
                                                  or not isinstance(incremental_snapshots, int)
                                                  or incremental_snapshots < 1):
            raise ConfigurationError(f"incremental_snapshots must be an integer >= 1 or None, "
                                     f"got {incremental_snapshots!r}")
        if signing_key is not None and (not isinstance(signing_key, (bytes, str)) or not signing_key):
            raise ConfigurationError("signing_key must be non-empty bytes or text (the HMAC key of savepoints)")
        key = signing_key.encode() if isinstance(signing_key, str) else signing_key
        if isinstance(redact, Redactor):
            if redact_fields:
                raise ConfigurationError("redact_fields goes into the Redactor when redact is one: "
                                         "Redactor(fields=[...])")
            redactor = redact
        else:
            if isinstance(redact, str) or isinstance(redact_fields, str):
                raise ConfigurationError("redact and redact_fields take lists (of patterns, of names), not a string")
            try:
                redactor = Redactor(patterns=tuple(redact), fields=tuple(redact_fields))
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        if tool_limits is not None and not isinstance(tool_limits, ToolLimits):
            tool_limits = ToolLimits(tool_limits)
        self._breaker_settings = breakers if breakers is not None else default_breakers
        self.workflows = WorkflowRegistry(on_register=self._declare_breakers)
        self.workflows.register(*workflows)
        self.store = store if store is not None else _open(url, store_options)
        self._owns_store = store is None
        the_clock = clock or time.time
        config = EngineConfig(
            owner=owner or default_owner(), snapshot_every=snapshot_every, keep_snapshots=keep_snapshots,
            incremental_snapshots=incremental_snapshots,
            lease_ttl=float(lease_ttl), heartbeat=heartbeat, allow_graph_change=allow_graph_change,
            clock=the_clock, sleep=sleep or asyncio.sleep, rng=rng or random.Random(), signing_key=key,
            gc_young=gc_young,
        )
        call_limits = None
        if tool_limits is not None and tool_limits.calls:
            call_limits = CallLimits(self.store, tool_limits.calls, owner=config.owner, clock=the_clock,
                                     ttl=tool_limits.slot_ttl)
        self.tools = ToolBox(breakers=StoreBreakers(self.store, the_clock), breaker_settings=self._breaker_settings,
                             redactor=redactor, clock=the_clock, max_body=max_body, call_limits=call_limits)
        self._config = config
        # The engine is built on first use: a process that only reads runs (the CLI's read verbs, an
        # audit) never loads the driver, the group committer and the rest of it.
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()
        self._engine_parts = {"compensations": compensations, "redactor": redactor, "replay": replay,
                              "observers": observers}
        self.audit = Audit(self.store, workflows=self.workflows, clock=the_clock, create_run=self._create_run,
                           savepoint=self._savepoint, signing_key=key)
        self.queues = Queues(self.store, create_run=self._create_run, clock=the_clock, owner=config.owner)

    # -- setup -----------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """The durable core (``orchestrator.engine.Engine``), built on first use."""
        engine = self._engine
        if engine is None:
            with self._engine_lock:
                if self._engine is None:
                    from orchestrator.engine.core import Engine

                    self._engine = Engine(self.store, self._config, workflows=self.workflows, tools=self.tools,
                                          **self._engine_parts)
                engine = self._engine
        return engine

    def _create_run(self, *args: Any, **kwargs: Any) -> ActiveRun | None:
        return self.engine.create(*args, **kwargs)

    def _savepoint(self, *args: Any, **kwargs: Any) -> Path:
        return self.engine.savepoint(*args, **kwargs)

    @property
    def owner(self) -> str:
        return self._config.owner

    def register(self, *workflows: Workflow) -> None:
        """Make workflows known by name (validated now: a bad graph fails here, not mid-run)."""
        self.workflows.register(*workflows)

    def _declare_breakers(self, wf: Workflow) -> None:
        """A step may carry a ``BreakerConfig``: declare it, so two settings for one name fail here."""
        for step in wf.steps.values():
            if isinstance(step.breaker, BreakerConfig):
                self._breaker_settings.declare(step.breaker)
            elif step.breaker is not None and not isinstance(step.breaker, str):
                raise ConfigurationError(f"step {step.name!r}: breaker must be a name or a BreakerConfig, "
                                         f"got {step.breaker!r}")

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self.tools.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Orchestrator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- driving runs (sync API: each a thin wrapper over its async twin) -------------------------
    def run(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> RunResult:
        """Start a run and drive it to the end. An existing ``run_id`` of the same workflow is
        continued instead of started twice (a start is exactly-once per id)."""
        return run_sync(self.arun(workflow, input, run_id=run_id))

    def start(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> str:
        """Journal a new run as pending without driving it; ``resume`` or ``recover`` drives it."""
        return run_sync(self.astart(workflow, input, run_id=run_id))

    def resume(self, run_id: str, *, allow_graph_change: bool | None = None) -> RunResult:
        """Continue an interrupted run now, taking its lease over (a previous owner is fenced out).
        A finished run just returns its result."""
        return run_sync(self.aresume(run_id, allow_graph_change=allow_graph_change))

    def recover(self, *, limit: int | None = None) -> list[RunResult]:
        """Resume every interrupted run whose lease has expired (or that was never leased)."""
        return run_sync(self.arecover(limit=limit))

    def cancel(self, run_id: str, *, reason: str | None = None, compensate: bool = False) -> RunResult:
        """Cancel a run that has not finished; a process still driving it is fenced out. With
        ``compensate=True`` its completed effects are undone first, newest first."""
        return run_sync(self.acancel(run_id, reason=reason, compensate=compensate))

    def compensate(self, run_id: str) -> RunResult:
        """Retry the remaining compensations of a run left ``compensation_failed``."""
        return run_sync(self.acompensate(run_id))

    def rollback(self, run_id: str, *, to: int | str, input: dict[str, Any] | None = None,
                 next_step: str | None = None) -> RunResult:
        """Roll a run back to a checkpoint and continue it from there.

        ``to`` is a journal seq at a tick boundary (a snapshot's seq, say) or a step name (the state
        just before that step's latest execution). The effects recorded after that point are
        compensated, newest first; a ``RolledBack`` event makes the checkpoint's state current
        (history is not rewritten); ``input`` is merged into that state and ``next_step`` forces
        where the run goes next. Then the run is driven to its end.
        """
        return run_sync(self.arollback(run_id, to=to, input=input, next_step=next_step))

    async def arun(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> RunResult:
        created = await self.engine.acreate(workflow, input, run_id=run_id, lease=True)
        if created is None:  # the id exists: continue that run (never start it twice)
            assert run_id is not None
            return await self.engine.resume(run_id, force=False, allow_graph_change=None)
        return await self.engine.drive(created)

    async def astart(self, workflow: Workflow, input: Any = None, *, run_id: str | None = None) -> str:
        created = self.engine.create(workflow, input, run_id=run_id, lease=False)
        if created is None:
            raise RunStateError(f"run {run_id!r} already exists")
        return created.run_id

    async def aresume(self, run_id: str, *, allow_graph_change: bool | None = None) -> RunResult:
        return await self.engine.resume(run_id, force=True, allow_graph_change=allow_graph_change)

    async def arecover(self, *, limit: int | None = None) -> list[RunResult]:
        return await self.engine.recover(limit=limit)

    async def acancel(self, run_id: str, *, reason: str | None = None, compensate: bool = False) -> RunResult:
        return await self.engine.cancel(run_id, reason=reason, compensate=compensate)

    async def acompensate(self, run_id: str) -> RunResult:
        return await self.engine.compensate(run_id)

    async def arollback(self, run_id: str, *, to: int | str, input: dict[str, Any] | None = None,
                        next_step: str | None = None) -> RunResult:
        return await self.engine.rollback(run_id, to=to, input=input, next_step=next_step)

    def signal(self, run_id: str, name: str, data: Any = None, *, resume: bool = False) -> RunResult | None:
        """Send signal ``name`` (JSON data) to a run, from any process; one not yet waiting for it
        gets it when it waits.

        Without ``resume`` (when a worker serves the run's queue) the signal is delivered and a run
        waiting for it is woken: a worker, or the next ``recover``, continues it; returns None.

        With ``resume=True`` (when no worker runs: a script, an approval sent from a shell) the
        signal is delivered and the run is driven here, now, until it ends or waits again, and its
        ``RunResult`` is returned. If a live process holds the run's lease (a worker is driving it),
        the signal is only delivered and that process continues the run: the result returned is the
        run as it stands, its ``note`` saying who drives it. The run's workflow must be registered
        here; that is checked before anything is sent."""
        if not resume:
            # Sending drives nothing: no event loop is needed, so a step (or any async caller) can
            # signal another run with the plain call.
            self.engine.signal(run_id, name, data)
            return None
        return run_sync(self.asignal(run_id, name, data, resume=resume))

    async def asignal(self, run_id: str, name: str, data: Any = None, *, resume: bool = False) -> RunResult | None:
        if resume:
            self.workflows.for_run(self.store.get_run(run_id))  # no code to drive it: fail before sending
        self.engine.signal(run_id, name, data)
        if not resume:
            return None
        try:
            return await self.engine.resume(run_id, force=False, allow_graph_change=None)
        except LeaseHeldError as held:
            note = (f"signal {name!r} delivered; the run is being driven by {held.owner!r}, which continues it "
                    "(not driven here)")
            return dataclasses.replace(self.engine.result(run_id), note=note)

    def snapshot(self, run_id: str) -> int:
        """Write a snapshot of the run now (on demand) and return its seq.

        The snapshot is the fold of the journal as it stands, verified like any other; the run's
        journal is not changed, so this is safe while another process drives the run (a snapshot
        that process writes at the same seq wins, and this call then reports that seq).
        """
        return self.engine.snapshot(run_id)

    def result(self, run_id: str) -> RunResult:
        """The run's current status and folded state, without driving it."""
        return self.engine.result(run_id)

    # -- queues ------------------------------------------------------------------------------------
    def enqueue(self, workflow: Workflow, input: Any = None, *, queue: str = DEFAULT_QUEUE, priority: int = 0,
                dedup_key: str | None = None, run_id: str | None = None) -> str:
        """Journal a pending run on ``queue`` for workers (see ``orchestrator.engine.queues``)."""
        return self.queues.enqueue(workflow, input, queue=queue, priority=priority, dedup_key=dedup_key,
                                   run_id=run_id)

    def retry_dead(self, run_id: str) -> str:
        """Put a ``dead`` run back to the status it had, for workers to pick up now; returns it."""
        return self.queues.retry_dead(run_id)

    # -- reading (see orchestrator.audit) ----------------------------------------------------------
    def get_run(self, run_id: str) -> RunRecord:
        return self.audit.get_run(run_id)

    def list_runs(self, *, status: str | Sequence[str] | None = None, workflow: str | None = None,
                  since: float | None = None, until: float | None = None, limit: int | None = 100,
                  offset: int = 0) -> list[RunRecord]:
        """Runs newest first; ``since <= created_at < until`` (epoch seconds); ``limit=None`` lists all."""
        return self.audit.list_runs(status=status, workflow=workflow, since=since, until=until, limit=limit,
                                    offset=offset)

    def history(self, run_id: str, *, after: int = 0, until: int | None = None) -> list[dict[str, Any]]:
        """The run's events in order: ``{"seq", "kind", "at", "data"}``."""
        return self.audit.history(run_id, after=after, until=until)

    def summary(self, run_id: str, *, keep_states: bool = False) -> RunSummary:
        """What the run did: status, timings, step executions, effects, snapshots, the failure."""
        return self.audit.summary(run_id, keep_states=keep_states)

    def verify(self, run_id: str, *, mark: bool = True) -> VerifyReport:
        """Re-fold the journal and check every snapshot against it; ``report.ok`` is the verdict.
        Each snapshot's verdict is recorded in the checkpoint catalog unless ``mark=False``."""
        return self.audit.verify(run_id, mark=mark)

    def savepoint(self, run_id: str, *, name: str, path: str | os.PathLike[str]) -> Path:
        """Write the run to ``path`` as a named, portable, verifiable savepoint (compressed JSON with a
        hash chain; signed with ``signing_key`` when one is configured). See docs/checkpoints.md."""
        return self.engine.savepoint(run_id, name=name, path=path)

    def restore(self, path: str | os.PathLike[str], *, max_bytes: int | None = None) -> str:
        """Bring a savepoint into this database (all or nothing) and return its run id; drive it on
        with ``resume``. Its workflow must be registered here; a damaged, tampered, newer-format,
        (under a key) unsigned file, or one that decompresses to more than ``max_bytes`` (default
        256 MiB) raises ``SavepointError`` naming what is wrong, before anything is written."""
        if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1):
            raise ConfigurationError(f"restore max_bytes must be a positive number of bytes, got {max_bytes!r}")
        return self.engine.restore_savepoint(path, max_bytes=max_bytes)

    def archive(self, *, older_than: float, to: str | os.PathLike[str]) -> dict[str, Any]:
        """Move finished runs that ended more than ``older_than`` seconds ago into savepoint files in
        ``to`` and out of the database (``restore`` brings one back); unfinished runs are never touched."""
        return self.audit.archive(older_than=older_than, to=to)

    def retention(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """Drop the snapshots of finished runs older than their workflow's ``Snapshots(finished_ttl=)``
        (registered workflows only); the journals stay. Returns what was (or would be) dropped."""
        return self.audit.retention(dry_run=dry_run)

    def snapshots(self, run_id: str) -> list[SnapshotInfo]:
        """The run's checkpoint catalog, newest first: trigger, seq, time, code, size, validity."""
        return self.audit.snapshots(run_id)

    def quarantine(self, run_id: str, seq: int, *, reason: str) -> None:
        """Set the snapshot at ``seq`` aside: recoveries skip it (and journal why), verify keeps the mark."""
        self.audit.quarantine(run_id, seq, reason=reason)

    def fork(self, parent_id: str, /, *, from_step: str, run_id: str | None = None) -> str:
        """A new pending run from ``parent_id``'s state just before ``from_step``; returns its id."""
        return self.audit.fork(parent_id, from_step=from_step, run_id=run_id)

    def report_html(self, run_id: str) -> str:
        """The run's self-contained HTML report as text."""
        return self.audit.report_html(run_id)

    def report(self, run_id: str, path: str | os.PathLike[str]) -> Path:
        """Write the run's HTML report to ``path`` (atomically)."""
        return self.audit.report(run_id, path)

    def gc(self, *, keep_snapshots: int | None = None, older_than: float | None = None,
           dry_run: bool = False) -> GcReport:
        """Retention for finished runs (see ``orchestrator.audit.gc``); unfinished runs are never touched."""
        return self.audit.gc(keep_snapshots=keep_snapshots, older_than=older_than, dry_run=dry_run)

    def stats(self, *, runs: int = 500) -> Stats:
        """Runs by status, queue depths, recoveries and step latency percentiles."""
        return self.audit.stats(runs=runs)

    def dead_letters(self, run_id: str) -> list[dict[str, Any]]:
        """The run's failed recoveries, dead-lettering and retries, oldest first."""
        return self.audit.dead_letters(run_id)


def _open(url: str | None, options: dict[str, Any] | None) -> Store:
    """``open_store(url, **options)``, a bad option said as the Orchestrator's (``store_options``)."""
    options = dict(options or {})
    known = set(inspect.signature(open_store).parameters) - {"url"}
    unknown = sorted(map(str, set(options) - known))
    if unknown:
        raise ConfigurationError(f"store_options: unknown option(s) {', '.join(map(repr, unknown))}; known: "
                                 f"{', '.join(sorted(known))}")
    try:
        return open_store(url, **options)
    except StoreConfigError as exc:
        if any(str(exc).startswith(name) for name in options):  # the option's own message, named as given
            raise ConfigurationError(f"store_options: {exc}") from None
        raise


def _check_options(snapshot_every: Any, keep_snapshots: Any, lease_ttl: Any, heartbeat: Any) -> None:
    if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int) or snapshot_every < 1:
        raise ConfigurationError(f"snapshot_every must be an integer >= 1, got {snapshot_every!r}")
    if isinstance(keep_snapshots, bool) or not isinstance(keep_snapshots, int) or keep_snapshots < 1:
        raise ConfigurationError(f"keep_snapshots must be an integer >= 1, got {keep_snapshots!r}")
    # (finite: a lease that never expires could never be taken over, and NaN expires nowhere)
    if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, (int, float)) or not 0 < lease_ttl < math.inf:
        raise ConfigurationError(f"lease_ttl must be a positive, finite number of seconds, got {lease_ttl!r}")
    if heartbeat is not None:
        if isinstance(heartbeat, bool) or not isinstance(heartbeat, (int, float)) or not 0 < heartbeat < math.inf:
            raise ConfigurationError(f"heartbeat must be a positive, finite number of seconds, got {heartbeat!r}")
        if heartbeat >= lease_ttl:
            raise ConfigurationError(f"heartbeat ({heartbeat:g}s) must be shorter than lease_ttl ({lease_ttl:g}s)")
