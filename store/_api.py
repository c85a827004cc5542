"""The Store: a small facade over the database of one agentsaga installation.

It keeps what is about runs and their journal: creating (`_create.py`), reading and listing runs,
appending and reading events, snapshots, and deleting whole runs. Everything else is a part, one
idea each, built here with exactly the collaborators it needs and reached as an attribute:

    store.leases     acquire / renew / release a run's lease (fencing tokens)       _leases.py
    store.queues     claim runs for workers, under a queue's concurrency and rate    _queues.py
    store.wakeups    park and wake runs, the next due time, LISTEN on Postgres       _wakeups.py
    store.signals    a run's inbox: send, pending, consume                           _signals.py
    store.breakers   circuit-breaker state: get, compare_and_set                     _breakers.py
    store.slots      bulkheads for in-flight calls: acquire / renew / release        _slots.py
    store.failures   failed attempts, dead-letter and revive                         _failures.py
    store.stats      read-only aggregates for `agentsaga stats`                      _stats.py

Parts share three things and nothing else: the `Dialect` (what differs between SQLite and
Postgres), the `Boundary` (connections per thread, error translation, retries) and the `Fence`
(the run lookup and stale-token errors every token-guarded write needs). No part knows the Store
or another part. The transactions that span two ideas: an append that also consumes signals calls
`_signals.consume_in_transaction` from the journal (`_journal.py`), and a create that queues a
restored run's signals calls `_signals.insert_in_transaction` (`_create.py`).

Why plain SQL and not the ORM: the hot path must cost about one INSERT+COMMIT through the
driver, and an ORM session (identity map, unit of work, result processing) costs several times
that. Every method uses the same raw per-thread connection, so there is one transaction
discipline and one error boundary, not two. The SQLModel classes in `_schema.py` remain the one
description of the tables; the statements name their columns, and the contract suite runs them
on both backends.

SQL is written with `?` placeholders; the dialect rewrites them for its driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._boundary import Boundary
from ._breakers import Breakers
from ._create import Creates
from ._dialect import CHUNK, Dialect, iter_chunks, marks
from ._failures import Failures
from ._fence import Fence
from ._journal import PRUNE_SNAPSHOTS, GroupConflict, Journal, check_batch
from ._leases import Leases
from ._queues import Queues
from ._records import (
    VALIDITY,
    EventRecord,
    NewEvent,
    NewSnapshot,
    RunRecord,
    SnapshotInfo,
    SnapshotRecord,
)
from ._version import SCHEMA_VERSION, check_schema, ensure_schema
from ._signals import Signals
from ._slots import Slots
from ._stats import Stats
from ._wakeups import Wakeups
from .errors import ConflictError, DuplicateRunError, FencedError, RunNotFoundError

__all__ = ["Store"]

_RUN_COLUMNS = (
    "run_id, workflow, version, fingerprint, target, status, created_at, updated_at,"
    " finished_at, parent_run_id, error, lease_owner, lease_token, lease_expires_at, queue,"
    " priority, dedup_key, wake_at, recoveries"
)
_SELECT_RUN = f"SELECT {_RUN_COLUMNS} FROM agentsaga_runs"

#: The largest integer either backend stores or binds (a signed 64-bit integer): a larger one would
#: fail deep in the driver (SQLite: OverflowError; Postgres: out of range), naming nothing.
MAX_INT = 2**63 - 1


def _whole(name: str, value: Any, *, low: int = 0) -> int:
    """`value` as an int for the argument `name`, in `low..MAX_INT`; ValueError naming it if not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in {low}..2**63-1, got {value!r}")
    if not low <= value <= MAX_INT:
        raise ValueError(f"{name} must be in {low}..2**63-1 (a signed 64-bit integer), got {value}")
    return value


class Store:
    """The runs and journal of one database, and its parts; thread-safe. Build it with
    `open_store`."""

    leases: Leases
    queues: Queues
    wakeups: Wakeups
    signals: Signals
    breakers: Breakers
    slots: Slots
    failures: Failures
    stats: Stats

    def __init__(self, dialect: Dialect, *, retry_for: float, create: bool = True):
        self._d = dialect
        self._b = boundary = Boundary(dialect, retry_for=retry_for)
        # create=False: an existing schema at this version, checked and never changed (no DDL,
        # no migration, no version row written): what reading a database needs.
        schema = ensure_schema if create else check_schema
        try:
            boundary.run("open", lambda conn: schema(dialect, conn))
        except BaseException:
            boundary.close()
            raise
        self._fence = fence = Fence(dialect)
        self._journal = journal = Journal(dialect, fence)
        self._creates = Creates(dialect, boundary, journal)
        self.leases = Leases(dialect, boundary, fence)
        self.queues = Queues(dialect, boundary)
        self.wakeups = Wakeups(dialect, boundary, fence)
        self.signals = Signals(dialect, boundary, fence)
        self.breakers = Breakers(dialect, boundary)
        self.slots = Slots(dialect, boundary)
        self.failures = Failures(dialect, boundary, fence)
        self.stats = Stats(dialect, boundary)

    # -- identity ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL, password masked."""
        return self._d.url

    @property
    def dialect(self) -> str:
        """"sqlite" or "postgresql"."""
        return self._d.name

    def info(self) -> dict[str, Any]:
        """Dialect, URL, schema version, and the live connection's settings (SQLite pragmas,
        Postgres server version and schema): what `agentsaga` diagnostics print."""
        base = {"dialect": self.dialect, "url": self.url, "schema_version": SCHEMA_VERSION}
        return base | self._b.run("info", self._d.info)

    def close(self) -> None:
        """Close every connection; idempotent. The store cannot be used afterwards."""
        self._b.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Store {self.dialect} {self.url}>"

    # -- runs ----------------------------------------------------------------------------------

    def create_run(self, **create: Any) -> int:
        """Insert a run and its first events (and a snapshot of them) in one transaction; return
        the lease token. The arguments and the rules are `Creates.create_run`'s (`_create.py`)."""
        return self._creates.create_run(**create)

    def create_runs(self, creates: Sequence[dict[str, Any]]) -> list[int | DuplicateRunError]:
        """Group create: several runs in one transaction and one flush, each with its own verdict
        (`Creates.create_runs`, `_create.py`)."""
        return self._creates.create_runs(creates)

    def get_run(self, run_id: str) -> RunRecord:
        sql = _SELECT_RUN + " WHERE run_id = ?"
        row = self._b.run("get_run", lambda conn: self._d.fetchone(conn, sql, (run_id,)))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
        return RunRecord(*row)

    def list_runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        workflow: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = 100,
        offset: int = 0,
    ) -> list[RunRecord]:
        """Runs newest first (created_at, then creation order); `since <= created_at < until`;
        `limit=None` lists all. `limit` and `offset` are integers in 0..2**63-1 (else ValueError)."""
        if limit is not None:
            _whole("list_runs: limit", limit)
        _whole("list_runs: offset", offset)
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            if not statuses:
                return []
            where.append(f"status IN ({marks(len(statuses))})")
            params += statuses
        for clause, value in (("workflow = ?", workflow), ("created_at >= ?", since),
                              ("created_at < ?", until)):
            if value is not None:
                where.append(clause)
                params.append(value)
        sql = _SELECT_RUN + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY created_at DESC, pk DESC"
        if limit is None:
            sql += f" LIMIT {self._d.no_limit} OFFSET ?"
            params.append(offset)
        else:
            sql += " LIMIT ? OFFSET ?"
            params += [limit, offset]
        rows = self._b.run("list_runs", lambda conn: self._d.fetchall(conn, sql, params))
        return [RunRecord(*row) for row in rows]

    def count_by_status(self) -> dict[str, int]:
        sql = "SELECT status, COUNT(*) FROM agentsaga_runs GROUP BY status"
        rows = self._b.run("count_by_status", lambda conn: self._d.fetchall(conn, sql, ()))
        return {status: int(n) for status, n in rows}

    # -- journal -------------------------------------------------------------------------------

    def append(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        *,
        token: int,
        now: float,
        status: str | None = None,
        error: str | None = None,
        finished: bool = False,
        snapshot: NewSnapshot | None = None,
        keep_snapshots: int | None = None,
        release_lease: bool = False,
        consume_signals: Sequence[int] = (),
        workflow_version: tuple[str, str] | None = None,
    ) -> None:
        """Journal `events`, and optionally set status, write a snapshot, consume signals, set the
        run's `(version, fingerprint)` (a migrated run) and release the lease: all in one
        transaction, or nothing. Fenced by `token`."""
        if status is None and (error is not None or finished):
            raise ValueError("append: error and finished need a status")
        if keep_snapshots is not None and keep_snapshots < 0:
            raise ValueError("append: keep_snapshots must be >= 0")
        simple = (len(events) == 1 and status is None and snapshot is None
                  and not release_lease and not consume_signals and workflow_version is None)
        if not simple:
            events = list(events)
            check_batch(run_id, events)
        # If the session died while our COMMIT was in flight, the append may have landed and
        # the retry then collides with it; reading the rows back tells "that was us" (done)
        # from "that was someone else" (a real conflict).
        session_lost = False

        def lost() -> None:
            nonlocal session_lost
            session_lost = True

        journal = self._journal

        def work(conn: Any) -> None:
            try:
                if simple:
                    journal.append_one(conn, run_id, events[0], token)
                else:
                    journal.append_tx(conn, run_id, events, token, now, status, error, finished,
                                      snapshot, keep_snapshots, release_lease, consume_signals,
                                      workflow_version)
            except (ConflictError, FencedError):
                # Fenced too: had our commit landed before a takeover, it is still journaled.
                if session_lost and events and journal.already_journaled(conn, run_id, events):
                    return
                raise

        self._b.run("append", work, on_disconnect=lost)

    def append_many(self, appends: Sequence[dict[str, Any]]) -> list[BaseException | None]:
        """Group commit: several appends (each a dict of `append`'s arguments: `run_id`, `events`,
        `token`, `now`, and optionally `status`, `error`, `finished`, `snapshot`,
        `keep_snapshots`, `release_lease`, `consume_signals`, `workflow_version`), from any runs, in one transaction
        and one flush. Each append is fenced by its own token and gets its own verdict, in order:
        None (journaled) or the error `append` would have raised (`FencedError`,
        `RunNotFoundError`, `ConflictError`); an append after a failed one of the same run is
        not written and shares its error. The database being away raises, as `append` does."""
        items = [dict(a) for a in appends]
        for item in items:
            if item.get("status") is None and (item.get("error") is not None or item.get("finished")):
                raise ValueError("append_many: error and finished need a status")
            if item.get("keep_snapshots") is not None and item["keep_snapshots"] < 0:
                raise ValueError("append_many: keep_snapshots must be >= 0")
            item["events"] = list(item["events"])
            check_batch(item["run_id"], item["events"])
        if not items:
            return []
        session_lost = False

        def lost() -> None:
            nonlocal session_lost
            session_lost = True

        journal = self._journal
        try:
            results = self._b.run("append_many", lambda conn: journal.append_group(conn, items), on_disconnect=lost)
        except (GroupConflict, ConflictError):  # a duplicate key, or signals one item may not consume
            results = None
        if results is None:
            # One by one, each with its own verdict: a duplicate key in the group, or a session lost
            # while a COMMIT was in flight (the items that landed then read back as ours).
            results = []
            failed: dict[str, BaseException] = {}
            for item in items:
                if item["run_id"] in failed:
                    results.append(failed[item["run_id"]])
                    continue
                try:
                    self._append_item(item, session_lost)
                except (ConflictError, FencedError, RunNotFoundError) as exc:
                    failed[item["run_id"]] = exc
                    results.append(exc)
                else:
                    results.append(None)
        return results

    def _append_item(self, item: dict[str, Any], session_lost: bool) -> None:
        try:
            self.append(item["run_id"], item["events"], token=item["token"], now=item["now"],
                        status=item.get("status"), error=item.get("error"), finished=item.get("finished", False),
                        snapshot=item.get("snapshot"), keep_snapshots=item.get("keep_snapshots"),
                        release_lease=item.get("release_lease", False),
                        consume_signals=item.get("consume_signals") or (),
                        workflow_version=item.get("workflow_version"))
        except (ConflictError, FencedError):
            journal, run_id, events = self._journal, item["run_id"], item["events"]
            if session_lost and events and self._b.run(
                    "append_many", lambda conn: journal.already_journaled(conn, run_id, events)):
                return
            raise

    def events(
        self, run_id: str, *, after_seq: int = 0, until_seq: int | None = None
    ) -> list[EventRecord]:
        """Events with `after_seq < seq <= until_seq`, ascending; both seqs are integers in
        0..2**63-1 (else ValueError)."""
        _whole("events: after_seq", after_seq)
        if until_seq is not None:
            _whole("events: until_seq", until_seq)
        journal = self._journal
        return self._b.run("events", lambda conn: journal.read(conn, run_id, after_seq, until_seq))

    def last_seq(self, run_id: str) -> int:
        """The highest seq journaled for the run; 0 when it has no events."""
        sql = (
            "SELECT (SELECT MAX(seq) FROM agentsaga_events WHERE run_pk = r.pk)"
            " FROM agentsaga_runs r WHERE r.run_id = ?"
        )

        def work(conn: Any) -> int:
            row = self._d.fetchone(conn, sql, (run_id,))
            if row is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
            return int(row[0] or 0)

        return self._b.run("last_seq", work)

    # -- snapshots -----------------------------------------------------------------------------

    def snapshots(self, run_id: str) -> list[SnapshotRecord]:
        """All snapshots of the run, newest first."""
        return self._b.run("snapshots", lambda conn: self._snapshots(conn, run_id, None))

    def snapshot(self, run_id: str, seq: int) -> SnapshotRecord | None:
        """The snapshot taken at `seq`, or None."""
        _whole("snapshot: seq", seq)
        found = self._b.run("snapshot", lambda conn: self._snapshots(conn, run_id, seq))
        return found[0] if found else None

    def _snapshots(self, conn: Any, run_id: str, seq: int | None) -> list[SnapshotRecord]:
        pk = self._fence.require_run(conn, run_id)
        sql = (
            "SELECT seq, state, sha256, schema_version, trigger, created_at, kind, base_seq, base_sha256,"
            " root_seq, signature FROM agentsaga_snapshots WHERE run_pk = ?"
        )
        params: list[Any] = [pk]
        if seq is not None:
            sql += " AND seq = ?"
            params.append(seq)
        rows = self._d.fetchall(conn, sql + " ORDER BY seq DESC", params)
        return [SnapshotRecord(*row) for row in rows]

    def snapshot_catalog(self, run_id: str) -> list[SnapshotInfo]:
        """The run's snapshot catalog, newest first: every snapshot's metadata and validity flag,
        without its state (so a recovery reads only the states it tries)."""
        sql = (
            "SELECT seq, sha256, schema_version, trigger, created_at, workflow, version, fingerprint,"
            " agentsaga_version, python_version, config_hash, size_bytes, validity, validity_reason,"
            " checked_at, kind, base_seq, base_sha256, root_seq, signature"
            " FROM agentsaga_snapshots WHERE run_pk = ? ORDER BY seq DESC"
        )

        def work(conn: Any) -> list[SnapshotInfo]:
            pk = self._fence.require_run(conn, run_id)
            return [SnapshotInfo(*row) for row in self._d.fetchall(conn, sql, (pk,))]

        return self._b.run("snapshot_catalog", work)

    def mark_snapshot(
        self, run_id: str, seq: int, validity: str, *, reason: str | None, checked_at: float,
        keep_bad: bool = False,
    ) -> bool:
        """Set a snapshot's validity flag (one of `VALIDITY`) and why; return whether it exists.

        The flag is catalog metadata, not history: it is not fenced by the run's lease, and setting
        it never touches the journal. With `keep_bad`, a snapshot already marked `failed` or
        `quarantined` keeps its mark and reason (a recovery confirming what a check found)."""
        if validity not in VALIDITY:
            raise ValueError(f"mark_snapshot: validity must be one of {', '.join(VALIDITY)}, got {validity!r}")
        _whole("mark_snapshot: seq", seq)
        sql = (
            "UPDATE agentsaga_snapshots SET validity = ?, validity_reason = ?, checked_at = ?"
            " WHERE run_pk = ? AND seq = ?"
        )
        if keep_bad:
            sql += " AND validity NOT IN ('failed', 'quarantined')"

        def work(conn: Any) -> bool:
            pk = self._fence.require_run(conn, run_id)
            if self._d.execute(conn, sql, (validity, reason, checked_at, pk, seq)).rowcount:
                return True
            found = "SELECT 1 FROM agentsaga_snapshots WHERE run_pk = ? AND seq = ?"
            return self._d.fetchone(conn, found, (pk, seq)) is not None

        return self._b.run("mark_snapshot", work)

    def prune_snapshots(self, run_id: str, keep: int) -> int:
        """Delete all but the newest `keep` snapshots and the chains they need (the bases of
        incremental ones, back to their full snapshot); return how many were deleted."""
        if keep < 0:
            raise ValueError("prune_snapshots: keep must be >= 0")
        _whole("prune_snapshots: keep", keep)

        def work(conn: Any) -> int:
            pk = self._fence.require_run(conn, run_id)
            return self._d.execute(conn, PRUNE_SNAPSHOTS, (pk, pk, keep)).rowcount

        return self._b.run("prune_snapshots", work)

    # -- retention -----------------------------------------------------------------------------

    def delete_runs(self, run_ids: Sequence[str], *, statuses: Sequence[str] | None = None) -> int:
        """Delete whole runs (row, events, snapshots, signals); return how many were deleted.

        With `statuses`, a run is deleted only if its status is still one of them when the
        delete runs (gc decides from a listing; a run resumed since must not be deleted)."""
        ids = list(dict.fromkeys(run_ids))
        only = list(statuses) if statuses is not None else None
        if only is not None and not only:
            return 0
        d = self._d

        def work(conn: Any) -> int:
            deleted = 0
            with d.transaction(conn):
                for chunk in iter_chunks(ids, CHUNK):
                    # The run row first: deleting it takes the row lock appenders fence on, so
                    # no event can slip in for a run whose children are being deleted.
                    sql = f"DELETE FROM agentsaga_runs WHERE run_id IN ({marks(len(chunk))})"
                    params = list(chunk)
                    if only is not None:
                        sql += f" AND status IN ({marks(len(only))})"
                        params += only
                    pks = [r[0] for r in d.fetchall(conn, sql + " RETURNING pk", params)]
                    deleted += len(pks)
                    in_pks = marks(len(pks))
                    for table in ("events", "snapshots", "signals", "run_failures") if pks else ():
                        sql = f"DELETE FROM agentsaga_{table} WHERE run_pk IN ({in_pks})"
                        d.execute(conn, sql, pks)
            return deleted

        return self._b.run("delete_runs", work) if ids else 0
