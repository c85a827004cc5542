"""Reading runs for audit: listing, history, summaries, verification, forks, reports and retention.

``Audit`` is the Orchestrator's reading part (``orc.audit``; the Orchestrator keeps short methods
delegating to it). It is given the store, the workflow registry, the injected clock and, for
``fork``, the engine's way of creating a run. It never drives a run: ``fork`` journals a new
pending run that ``resume`` drives, and ``gc`` only deletes finished runs.

Reading is pure (invariant 11): ``list_runs``, ``history``, ``summary``, ``verify``, ``report``,
``stats`` and ``gc(dry_run=True)`` import no code, take no lease and append nothing (``verify``
records its verdicts in the checkpoint catalog, never in the journal). A run whose
workflow is registered is folded with its reducers; any other run is read without code
(``orchestrator.engine.reading``): its state from the newest verified snapshot plus the events
after it, its built-in reducers applied as the run recorded them, and the summary says which
fields, if any, had to be merged by replacement.

The interpretation of a journal lives in small pure modules, so the CLI, the report and the tests
share one reading: ``summary`` (what a run did), ``verify`` (does the journal agree with its
snapshots), ``fork`` (the state before a step), ``gc`` (what retention may delete), ``report``
(the HTML page), ``stats`` (how the cluster is doing).
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from orchestrator.audit.fork import fork_point
from orchestrator.audit.gc import GC_STATUSES, GcReport, finished_at, plan_deletions
from orchestrator.audit.stats import Stats, collect_stats
from orchestrator.audit.summary import RunSummary, decode_events, summarise
from orchestrator.audit.verify import VerifyReport, verify_journal
from orchestrator.engine.names import name_problem, shown
from orchestrator.engine.reading import read_state, reduce_for
from orchestrator.engine.registry import WorkflowRegistry
from orchestrator.engine.snapshots import retained
from orchestrator.errors import ConfigurationError, RunStateError
from orchestrator.payload import codec
from store import RunNotFoundError, RunRecord, SnapshotInfo, Store, StoreError

if TYPE_CHECKING:
    from orchestrator.engine.journal import ActiveRun

__all__ = ["Audit"]


class Audit:
    """Reading runs (see the module docstring). ``create_run`` is ``Engine.create``, for forks."""

    def __init__(self, store: Store, *, workflows: WorkflowRegistry, clock: Callable[[], float],
                 create_run: Callable[..., ActiveRun | None],
                 savepoint: Callable[..., Path] | None = None, signing_key: bytes | None = None) -> None:
        self.store = store
        #: the HMAC key snapshots must be signed with to verify (the engine's), or None
        self.signing_key = signing_key
        self.workflows = workflows
        self.clock = clock
        self._create_run = create_run
        self._savepoint = savepoint

    def get_run(self, run_id: str) -> RunRecord:
        return self.store.get_run(run_id)

    def list_runs(self, *, status: str | Sequence[str] | None = None, workflow: str | None = None,
                  since: float | None = None, until: float | None = None, limit: int | None = 100,
                  offset: int = 0) -> list[RunRecord]:
        """Runs newest first; ``since <= created_at < until`` (epoch seconds); ``limit=None`` lists all."""
        return self.store.list_runs(status=status, workflow=workflow, since=since, until=until, limit=limit,
                                    offset=offset)

    def history(self, run_id: str, *, after: int = 0, until: int | None = None) -> list[dict[str, Any]]:
        """The run's events in order (``after < seq <= until``): ``{"seq", "kind", "at", "data"}``,
        data decoded by the codec."""
        self.store.get_run(run_id)
        events = self.store.events(run_id, after_seq=after, until_seq=until)
        return [{"seq": seq, "kind": kind, "at": at, "data": data} for seq, kind, at, data in decode_events(events)]

    def summary(self, run_id: str, *, keep_states: bool = False) -> RunSummary:
        """What the run did: status, timings, step executions, effects, snapshots, the failure."""
        rec = self.store.get_run(run_id)
        snapshots = self.store.snapshots(run_id)
        events = decode_events(self.store.events(run_id))
        wf = self.workflows.for_run(rec, required=False)
        if wf is not None:
            return summarise(rec, events, snapshots, reduce=wf.reduce, keep_states=keep_states)
        # Without the workflow's code: the step-by-step states (the report's) are folded with the
        # reducers the run recorded; the final state comes from the newest verified snapshot.
        along = reduce_for(self.store, run_id)
        summary = summarise(rec, events, snapshots, reduce=along, keep_states=keep_states)
        if summary.state is not None:
            reading = read_state(self.store, run_id, None, key=self.signing_key)
            summary.state = reading.folded.state
            summary.state_source = reading.describe()
        if keep_states and along.replaced:
            summary.notes.append(f"workflow {rec.workflow!r} is not registered here: the states shown per step "
                                 "are folded without its reducers; fields merged by replacement: "
                                 + ", ".join(sorted(along.replaced)))
        return summary

    def verify(self, run_id: str, *, mark: bool = True) -> VerifyReport:
        """Re-fold the journal and check every snapshot: its sha256, and that it equals the fold at
        its seq. The report names the seq and what differs; ``report.ok`` is the verdict. With
        ``mark`` each snapshot's verdict is recorded in the checkpoint catalog (a quarantine set by
        a person stays)."""
        self.store.get_run(run_id)
        # Snapshots first: each is written with the event at its seq, so every snapshot read now is
        # inside the journal read next, even while the run is being driven.
        snapshots = self.store.snapshots(run_id)
        events = self.store.events(run_id)
        rec = self.store.get_run(run_id)
        last = events[-1].seq if events else 0
        status = rec.status if self.store.last_seq(run_id) == last else None  # moved on: not comparable
        wf = self.workflows.for_run(rec, required=False)
        if wf is not None:
            report = verify_journal(run_id, events, snapshots, reduce=wf.reduce, run_status=status,
                                    key=self.signing_key)
        else:
            # Without the code, user state is compared wherever the run's recorded reducers reproduce it.
            recorded = reduce_for(self.store, run_id)
            report = verify_journal(run_id, events, snapshots, reduce=recorded, run_status=status,
                                    unknown_fields=recorded.unknown, key=self.signing_key)
        if mark:
            try:
                self._mark(run_id, report)
            except StoreError as exc:
                # A read-only database (a file or role an auditor was given) still gets its verdict.
                return dataclasses.replace(report, recorded=False, notes=(*report.notes, (
                    f"the verdicts were not recorded in the checkpoint catalog: the database refused the "
                    f"write ({exc}); verify --no-mark (mark=False) only reads")))
            return dataclasses.replace(report, recorded=True)
        return report

    def _mark(self, run_id: str, report: VerifyReport) -> None:
        """Record the verdicts in the checkpoint catalog, where they differ from what it holds: the
        catalog, never the journal, so verifying stays a read of the run's history."""
        held = {i.seq: (i.validity, i.validity_reason) for i in self.store.snapshot_catalog(run_id)}
        now = self.clock()
        for seq, validity, reason in report.verdicts:
            if seq in held and held[seq] != (validity, reason) and held[seq][0] != "quarantined":
                self.store.mark_snapshot(run_id, seq, validity, reason=reason, checked_at=now)

    def archive(self, *, older_than: float, to: str | os.PathLike[str]) -> dict[str, Any]:
        """Move finished runs that ended more than ``older_than`` seconds ago out of the database into
        savepoint files in ``to`` (``RUN.savepoint.json.gz``, restorable with ``restore``). Each file is
        written and fsynced before its run is deleted, one run at a time, and the delete is
        conditional on the run still being finished: a crash at any point loses no run (at worst a run
        is both in the database and in its file, and archiving again finishes the job). Unfinished
        runs are never touched. ``to`` must be a directory that exists (``agentsaga archive`` makes
        a missing last directory of ``--to`` before calling this)."""
        if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or older_than < 0:
            raise ConfigurationError(f"older_than must be a number of seconds >= 0, got {older_than!r}")
        if self._savepoint is None:
            raise ConfigurationError("archive needs the engine's savepoints (use Orchestrator.archive)")
        folder = Path(to)
        if not folder.is_dir():
            missing = "" if folder.exists() else ": it does not exist (make it first)"
            raise ConfigurationError(f"archive: {str(folder)!r} is not a directory{missing}")
        finished = self.store.list_runs(status=GC_STATUSES, limit=None)
        doomed = plan_deletions(finished, cutoff=self.clock() - older_than)
        archived: list[dict[str, Any]] = []
        spared: list[str] = []
        for rec in reversed(doomed):  # oldest first
            path = folder / f"{quote(rec.run_id, safe='')}.savepoint.json.gz"
            try:
                self._savepoint(rec.run_id, name="archive", path=path)
            except RunNotFoundError:
                continue  # deleted by someone else meanwhile
            if self.store.delete_runs([rec.run_id], statuses=GC_STATUSES):
                archived.append({"run_id": rec.run_id, "workflow": rec.workflow, "status": rec.status,
                                 "path": str(path), "bytes": path.stat().st_size})
            else:  # resumed (rolled back) meanwhile: it stays, and so must not look archived
                path.unlink(missing_ok=True)
                spared.append(rec.run_id)
        return {"archived": archived, "spared": spared, "to": str(folder)}

    def retention(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """Apply each registered workflow's ``Snapshots(finished_ttl=...)``: every snapshot of a
        finished run of it that ended more than that long ago is dropped (the journal stays, so its
        state still folds). Unfinished runs are never touched. Returns what was (or would be) dropped."""
        now = self.clock()
        dropped: list[dict[str, Any]] = []
        for name in self.workflows.names():
            wf = self.workflows.get(name)
            ttl = wf.snapshots.finished_ttl if wf is not None and wf.snapshots is not None else None
            if ttl is None:
                continue
            for rec in self.store.list_runs(workflow=name, status=GC_STATUSES, limit=None):
                if finished_at(rec) >= now - ttl:
                    continue
                try:
                    seqs = sorted(i.seq for i in self.store.snapshot_catalog(rec.run_id))
                    if seqs and not dry_run:
                        self.store.prune_snapshots(rec.run_id, 0)
                except RunNotFoundError:
                    continue  # deleted by someone else meanwhile
                if seqs:
                    dropped.append({"run_id": rec.run_id, "workflow": name, "status": rec.status, "seqs": seqs})
        return dropped

    def snapshots(self, run_id: str) -> list[SnapshotInfo]:
        """The run's checkpoint catalog, newest first (metadata and validity, no state)."""
        return self.store.snapshot_catalog(run_id)

    def quarantine(self, run_id: str, seq: int, *, reason: str) -> None:
        """Set a snapshot aside by hand: recoveries skip it and say why; ``verify`` keeps the mark."""
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigurationError("quarantine needs a reason (it is shown wherever the snapshot is skipped)")
        if not self.store.mark_snapshot(run_id, seq, "quarantined", reason=reason, checked_at=self.clock()):
            have = ", ".join(str(i.seq) for i in self.store.snapshot_catalog(run_id)) or "none"
            raise RunStateError(f"run {run_id!r} has no snapshot at seq {seq} (its snapshots: {have})")

    def fork(self, parent_id: str, /, *, from_step: str, run_id: str | None = None) -> str:
        """Journal a new pending run whose first state is ``parent_id``'s state just before the
        latest execution of ``from_step``, starting at that step; return its id.

        The fork uses the workflow's current code (fix a step, then fork the failed run at it) and
        is linked to its parent by ``parent_run_id`` and the ``parent`` field of its RunStarted.
        Drive it with ``resume(new_id)``. A point whose state holds an effect the parent undid since
        (its saga, a rollback) is refused, naming the nearest steps that can be forked instead
        (``audit/fork.py``); nothing is written then.
        """
        if run_id is not None and (problem := name_problem(run_id)) is not None:
            raise ConfigurationError(f"run_id must be {problem}, got {shown(run_id)}")
        rec = self.store.get_run(parent_id)
        wf = self.workflows.for_run(rec)
        assert wf is not None  # required=True raises instead
        events = [(e.seq, e.kind, codec.loads(e.data)) for e in self.store.events(parent_id)]
        point = fork_point(parent_id, events, from_step, wf.reduce)
        if from_step not in wf.steps:
            raise RunStateError(f"run {parent_id!r} ran step {from_step!r}, but workflow {wf.name!r} no longer has it; "
                                f"its steps: {', '.join(sorted(wf.steps))}")
        parent = {"run_id": parent_id, "seq": point.seq, "step": from_step}
        new_id = run_id or uuid.uuid4().hex
        if self._create_run(wf, point.state, run_id=new_id, lease=False, parent=parent, start=[from_step]) is None:
            raise RunStateError(f"run {new_id!r} already exists; choose another id for the fork")
        return new_id

    def report_html(self, run_id: str) -> str:
        """The run's self-contained HTML report as text."""
        # Imported here: jinja2 costs every process that imports orchestrator ~20 ms otherwise,
        # and only reports need it.
        from orchestrator.audit.report import render_report

        return render_report(self.summary(run_id, keep_states=True), generated_at=self.clock())

    def report(self, run_id: str, path: str | os.PathLike[str]) -> Path:
        """Write the run's HTML report to ``path`` (atomically); raises ``OSError`` if it cannot."""
        from orchestrator.audit.report import write_report

        return write_report(path, self.report_html(run_id))

    def gc(self, *, keep_snapshots: int | None = None, older_than: float | None = None,
           dry_run: bool = False) -> GcReport:
        """Retention for finished runs (see ``orchestrator.audit.gc``): keep the newest ``keep_snapshots``
        snapshots of each, delete those that ended more than ``older_than`` seconds ago. Running,
        pending, compensating and compensation_failed runs are never touched. ``dry_run`` only
        reports what would be done."""
        if keep_snapshots is None and older_than is None:
            raise ConfigurationError("gc needs keep_snapshots and/or older_than; with neither it has nothing to do")
        if keep_snapshots is not None and (isinstance(keep_snapshots, bool) or not isinstance(keep_snapshots, int)
                                           or keep_snapshots < 0):
            raise ConfigurationError(f"keep_snapshots must be an integer >= 0, got {keep_snapshots!r}")
        if older_than is not None and (isinstance(older_than, bool) or not isinstance(older_than, (int, float))
                                       or older_than < 0):
            raise ConfigurationError(f"older_than must be a number of seconds >= 0, got {older_than!r}")
        store = self.store
        untouched = {s: n for s, n in store.count_by_status().items() if s not in GC_STATUSES}
        finished = store.list_runs(status=GC_STATUSES, limit=None)
        doomed = plan_deletions(finished, cutoff=None if older_than is None else self.clock() - older_than)
        doomed_ids = {r.run_id for r in doomed}
        pruned: list[dict[str, Any]] = []
        if keep_snapshots is not None:
            for rec in finished:
                if rec.run_id in doomed_ids:
                    continue
                try:
                    # The newest K and the base chains they need (incremental snapshots): the store's rule.
                    kept, dropped = retained(store.snapshot_catalog(rec.run_id), keep_snapshots)
                except RunNotFoundError:  # deleted by someone else meanwhile
                    continue
                if not dropped:
                    continue
                if not dry_run:
                    store.prune_snapshots(rec.run_id, keep_snapshots)
                pruned.append({"run_id": rec.run_id, "status": rec.status, "deleted": dropped, "kept": kept})
        deleted = [{"run_id": r.run_id, "workflow": r.workflow, "status": r.status,
                    "finished_at": r.finished_at if r.finished_at is not None else r.updated_at} for r in doomed]
        spared = 0
        if deleted and not dry_run:
            count = store.delete_runs([d["run_id"] for d in deleted], statuses=GC_STATUSES)
            if count != len(deleted):  # some were resumed (or deleted) meanwhile: report only what went
                gone = []
                for entry in deleted:
                    try:
                        store.get_run(entry["run_id"])
                    except RunNotFoundError:
                        gone.append(entry)
                spared, deleted = len(deleted) - len(gone), gone
        return GcReport(dry_run=dry_run, keep_snapshots=keep_snapshots, older_than=older_than,
                        deleted=tuple(deleted), pruned=tuple(pruned), untouched=untouched, spared=spared)

    def stats(self, *, runs: int = 500) -> Stats:
        """Runs by status, queue depths, recoveries and step latency percentiles (over the newest
        ``runs`` runs)."""
        return collect_stats(self.store, now=self.clock(), runs=runs)

    def dead_letters(self, run_id: str) -> list[dict[str, Any]]:
        """The run's failed recoveries, dead-lettering and retries, oldest first:
        ``{"at", "owner", "kind", "error", "recoveries", "status"}``."""
        return [{"at": at, "owner": owner, "kind": kind, "error": json.loads(error) if error else None,
                 "recoveries": recoveries, "status": status}
                for at, owner, kind, error, recoveries, status in self.store.failures.for_run(run_id)]
