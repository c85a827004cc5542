"""The journal's statements: appending under the fence, and reading events back.

`Store.append`, `Store.events` and `Store.create_run` are the public face; this module is the
work they hand to the boundary. It is split from `_api.py` so that the Store reads as the list of
what it offers, and this file as the one place that decides what a transaction on the journal
contains. Everything here takes the connection the caller's `Boundary` call holds and opens no
boundary call of its own: retries, error translation and the "did our COMMIT land?" check stay
with the caller, around the whole transaction.

Two shapes of append:
- `append_one`: one event, nothing else. The hot path: the dialect's single INSERT ... SELECT,
  fenced by the token in its WHERE clause, as one implicit transaction (about one commit).
- `append_tx`: anything more (several events, a status, a snapshot, consumed signals, a lease
  release) in one explicit transaction that first reads the run row (locked as the dialect says)
  to check the token.

SQL is written with `?` placeholders; the dialect rewrites them for its driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._dialect import CHUNK, Dialect, ErrorKind, iter_chunks, marks
from ._fence import Fence
from ._records import EventRecord, NewEvent, NewSnapshot
from ._signals import consume_in_transaction
from .errors import ConflictError, RunNotFoundError

__all__ = ["PRUNE_SNAPSHOTS", "GroupConflict", "Journal", "check_batch", "event_row", "insert_events"]

# Keep the newest K snapshots and every snapshot their chains need (generation clean-up): an
# incremental snapshot applies to its base, back to the full snapshot its chain starts from
# (`root_seq`), and a chain's links all lie between its root and itself, so what goes is what is
# older than the oldest root among the newest K. With K = 0 everything goes.
PRUNE_SNAPSHOTS = (
    "DELETE FROM agentsaga_snapshots WHERE run_pk = ? AND seq < COALESCE("
    "(SELECT MIN(COALESCE(newest.root_seq, newest.seq)) FROM"
    " (SELECT seq, root_seq FROM agentsaga_snapshots WHERE run_pk = ? ORDER BY seq DESC LIMIT ?) newest),"
    " seq + 1)"
)
_INSERT_SNAPSHOT = (
    "INSERT INTO agentsaga_snapshots (run_pk, seq, state, sha256, schema_version, trigger,"
    " created_at, workflow, version, fingerprint, agentsaga_version, python_version, config_hash,"
    " size_bytes, kind, base_seq, base_sha256, root_seq, signature)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_EVENTS = (
    "SELECT e.seq, e.kind, e.data, e.at FROM agentsaga_events e"
    " JOIN agentsaga_runs r ON r.pk = e.run_pk WHERE r.run_id = ? AND e.seq > ?"
)


class GroupConflict(Exception):
    """Internal: a duplicate key inside a group commit (rolled back); the caller goes item by item."""


def check_batch(run_id: str, events: Sequence[NewEvent]) -> None:
    """`ConflictError` if one batch names the same seq twice (before touching the database)."""
    seen: set[int] = set()
    for event in events:
        if event.seq in seen:
            raise ConflictError(
                f"run {run_id!r}: seq {event.seq} appears twice in one batch",
                run_id=run_id, seq=event.seq,
            )
        seen.add(event.seq)


_EVENT_COLUMNS = ("run_pk", "seq", "kind", "at", "data")
_EVENT_TYPES = ("bigint", "integer", "text", "double precision", "text")


def insert_events(d: Dialect, conn: Any, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert event rows (`event_row`'s shape) in one call, on the caller's connection."""
    d.bulk_insert(conn, "agentsaga_events", _EVENT_COLUMNS, _EVENT_TYPES, rows)


def event_row(pk: int, e: NewEvent) -> tuple[Any, ...]:
    """The row of event `e` of run `pk` (`insert_events`'s shape, columns in `_EVENT_COLUMNS` order)."""
    return (pk, e.seq, e.kind, e.at, e.data)


def snapshot_row(pk: int, s: NewSnapshot) -> tuple[Any, ...]:
    """The parameters of the snapshot INSERT for snapshot `s` of run `pk`."""
    size = s.size_bytes if s.size_bytes is not None else len(s.state.encode())
    return (pk, s.seq, s.state, s.sha256, s.schema_version, s.trigger, s.created_at, s.workflow,
            s.version, s.fingerprint, s.agentsaga_version, s.python_version, s.config_hash, size,
            s.kind, s.base_seq, s.base_sha256, s.root_seq, s.signature)


class _Later:
    """The run-row changes, snapshots and prunings of a group commit's items, written together:
    the row changes in item order (consecutive ones of one shape as one statement), then every
    snapshot, then every pruning (after the snapshots, as each item's own pruning follows its
    snapshot; each touches only its run's rows). Same outcome as item by item, a few statements
    instead of three per finishing run."""

    def __init__(self, dialect: Dialect) -> None:
        self._d = dialect
        self._updates: list[tuple[str, tuple[Any, ...]]] = []
        self._snapshots: list[tuple[Any, ...]] = []
        self._prunes: list[tuple[Any, ...]] = []

    def update(self, conn: Any, sql: str, params: tuple[Any, ...]) -> None:
        self._updates.append((sql, params))

    def snapshot(self, conn: Any, sql: str, params: tuple[Any, ...]) -> None:
        self._snapshots.append(params)

    def prune(self, conn: Any, sql: str, params: tuple[Any, ...]) -> None:
        self._prunes.append(params)

    def write(self, conn: Any) -> None:
        d = self._d
        updates = self._updates
        start = 0
        while start < len(updates):
            sql = updates[start][0]
            end = start + 1
            while end < len(updates) and updates[end][0] == sql:
                end += 1
            d.executemany(conn, sql, [params for _, params in updates[start:end]])
            start = end
        if self._snapshots:
            d.executemany(conn, _INSERT_SNAPSHOT, self._snapshots)
        if self._prunes:
            d.executemany(conn, PRUNE_SNAPSHOTS, self._prunes)


class Journal:
    """Appends and reads on a connection the caller holds; fenced through `fence`."""

    def __init__(self, dialect: Dialect, fence: Fence) -> None:
        self._d = dialect
        self._fence = fence

    # -- appending -----------------------------------------------------------------------------

    def append_one(self, conn: Any, run_id: str, event: NewEvent, token: int) -> None:
        d = self._d
        try:
            inserted = d.append_one(
                conn, (event.seq, event.kind, event.at, event.data, run_id, token)
            )
        except d.driver_errors as exc:
            if d.classify(exc, conn) is ErrorKind.UNIQUE:
                raise ConflictError(
                    f"run {run_id!r} already has an event at seq {event.seq}",
                    run_id=run_id, seq=event.seq,
                ) from exc
            raise
        if inserted != 1:  # the SELECT found no run with this token
            self._fence.raise_fenced_or_missing(conn, run_id, token)

    def append_tx(
        self, conn: Any, run_id: str, events: Sequence[NewEvent], token: int, now: float,
        status: str | None, error: str | None, finished: bool, snapshot: NewSnapshot | None,
        keep: int | None, release: bool, consume: Sequence[int],
        workflow_version: tuple[str, str] | None = None,
    ) -> None:
        d = self._d
        changes_run = status is not None or release or workflow_version is not None
        fence_sql = "SELECT pk, lease_token FROM agentsaga_runs WHERE run_id = ?"
        fence_sql += d.lock_update if changes_run else d.lock_share
        try:
            # Pipelined where the driver can: the fence read is one round trip, and every write
            # after it goes out with the COMMIT (Postgres: two round trips in all, not one each).
            with d.pipeline(conn), d.transaction(conn):
                row = d.fetchone(conn, fence_sql, (run_id,))
                if row is None:
                    raise RunNotFoundError(f"no run {run_id!r} in {self._d.url}", run_id=run_id)
                pk, current = row
                if current != token:
                    raise self._fence.fenced_error(run_id, token, current)
                if events:
                    insert_events(d, conn, [event_row(pk, e) for e in events])
                self._write_run(conn, pk, run_id, now, status, error, finished, snapshot, keep, release,
                                consume, workflow_version)
        except d.driver_errors as exc:
            if d.classify(exc, conn) is not ErrorKind.UNIQUE:
                raise
            # Named only now, after the rollback: Postgres answers no query inside an aborted
            # transaction.
            if d.unique_table(exc) == "snapshots" and snapshot is not None:
                raise ConflictError(
                    f"run {run_id!r} already has a snapshot at seq {snapshot.seq}",
                    run_id=run_id, seq=snapshot.seq,
                ) from None
            taken = self._existing_seqs(conn, run_id, [e.seq for e in events])
            seq = min(taken) if taken else None
            raise ConflictError(
                f"run {run_id!r} already has an event at seq {seq}", run_id=run_id, seq=seq
            ) from None

    def insert_snapshot(self, conn: Any, pk: int, snapshot: NewSnapshot) -> None:
        """Insert a snapshot of run `pk` inside the caller's transaction."""
        self._d.execute(conn, _INSERT_SNAPSHOT, snapshot_row(pk, snapshot))

    def _write_run(
        self, conn: Any, pk: int, run_id: str, now: float, status: str | None, error: str | None,
        finished: bool, snapshot: NewSnapshot | None, keep: int | None, release: bool,
        consume: Sequence[int], workflow_version: tuple[str, str] | None, later: _Later | None = None,
    ) -> None:
        """Everything an append writes besides its events, for run `pk` (already fenced), inside
        the caller's transaction: consumed signals, the run row's changes, the snapshot and its
        pruning. One code path for a direct append and for each item of a group commit (which
        passes `later`: the row changes, snapshots and prunings are then collected and written
        together, one statement per kind, by `later.write`)."""
        d = self._d
        run = d.execute if later is None else later.update
        snap = d.execute if later is None else later.snapshot
        prune = d.execute if later is None else later.prune
        if consume:
            consume_in_transaction(d, conn, pk, run_id, consume)
        if status is not None or release or workflow_version is not None:
            sets, params = [], []
            if status is not None:
                sets += ["status = ?", "error = ?", "updated_at = ?"]
                params += [status, error, now]
                if finished:
                    sets.append("finished_at = ?")
                    params.append(now)
            if release:
                sets += ["lease_owner = NULL", "lease_expires_at = NULL"]
            if workflow_version is not None:
                sets += ["version = ?", "fingerprint = ?"]
                params += list(workflow_version)
            run(conn, f"UPDATE agentsaga_runs SET {', '.join(sets)} WHERE pk = ?", (*params, pk))
        if snapshot is not None:
            snap(conn, _INSERT_SNAPSHOT, snapshot_row(pk, snapshot))
            if keep is not None:
                prune(conn, PRUNE_SNAPSHOTS, (pk, pk, keep))

    def append_group(self, conn: Any, items: Sequence[dict[str, Any]]) -> list[BaseException | None]:
        """Several runs' appends in one transaction (group commit): one fence read for all runs
        (row-locked as the dialect says, in run-id order), then every item's writes. An item whose
        token is stale or whose run is gone gets its error and writes nothing, and so does every
        later item of that run; the others commit together. A duplicate key (an append racing
        another writer, which the fence makes exceptional) raises `GroupConflict`: the caller
        then appends the items one by one, each with its own verdict."""
        d = self._d
        results: list[BaseException | None] = [None] * len(items)
        run_ids = sorted({item["run_id"] for item in items})
        try:
            # Pipelined where the driver can (see `append_tx`): the fence read, then every item's
            # writes and the COMMIT together, however many runs the group holds.
            with d.pipeline(conn), d.transaction(conn):
                fence: dict[str, tuple[int, int]] = {}
                for chunk in iter_chunks(run_ids, CHUNK):
                    where, params = d.where_in("run_id", chunk)
                    sql = f"SELECT run_id, pk, lease_token FROM agentsaga_runs WHERE {where} ORDER BY run_id{d.lock_update}"
                    for run_id, pk, token in d.fetchall(conn, sql, params):
                        fence[run_id] = (pk, token)
                failed: dict[str, BaseException] = {}
                rows: list[tuple[Any, ...]] = []
                later = _Later(d)
                for i, item in enumerate(items):
                    run_id, token = item["run_id"], item["token"]
                    if run_id in failed:
                        results[i] = failed[run_id]
                        continue
                    found = fence.get(run_id)
                    if found is None:
                        failed[run_id] = results[i] = RunNotFoundError(f"no run {run_id!r}", run_id=run_id)
                        continue
                    pk, current = found
                    if current != token:
                        failed[run_id] = results[i] = self._fence.fenced_error(run_id, token, current)
                        continue
                    rows += [event_row(pk, e) for e in item["events"]]
                    self._write_run(conn, pk, run_id, item["now"], item.get("status"), item.get("error"),
                                    bool(item.get("finished")), item.get("snapshot"), item.get("keep_snapshots"),
                                    bool(item.get("release_lease")), item.get("consume_signals") or (),
                                    item.get("workflow_version"), later)
                if rows:
                    insert_events(d, conn, rows)
                later.write(conn)
        except d.driver_errors as exc:
            if d.classify(exc, conn) is ErrorKind.UNIQUE:
                raise GroupConflict from None
            raise
        return results

    def already_journaled(self, conn: Any, run_id: str, events: Sequence[NewEvent]) -> bool:
        """True when every event is stored byte for byte at its seq (our lost COMMIT landed)."""
        seqs = [e.seq for e in events]
        stored = {r.seq: r for r in self.read(conn, run_id, min(seqs) - 1, max(seqs))}
        return all(
            (r := stored.get(e.seq)) is not None
            and (r.kind, r.data, r.at) == (e.kind, e.data, e.at)
            for e in events
        )

    def _existing_seqs(self, conn: Any, run_id: str, seqs: list[int]) -> list[int]:
        found: list[int] = []
        for chunk in iter_chunks(seqs, CHUNK):
            sql = (
                "SELECT e.seq FROM agentsaga_events e JOIN agentsaga_runs r ON r.pk = e.run_pk"
                f" WHERE r.run_id = ? AND e.seq IN ({marks(len(chunk))})"
            )
            found += [r[0] for r in self._d.fetchall(conn, sql, (run_id, *chunk))]
        return found

    # -- reading -------------------------------------------------------------------------------

    def read(
        self, conn: Any, run_id: str, after_seq: int, until_seq: int | None
    ) -> list[EventRecord]:
        """Events with `after_seq < seq <= until_seq`, ascending; RunNotFoundError if no run."""
        sql, params = _SELECT_EVENTS, [run_id, after_seq]
        if until_seq is not None:
            sql += " AND e.seq <= ?"
            params.append(until_seq)
        rows = self._d.fetchall(conn, sql + " ORDER BY e.seq", params)
        if not rows:
            self._fence.require_run(conn, run_id)  # "no events" and "no run" must not look alike
        return [EventRecord(*row) for row in rows]
