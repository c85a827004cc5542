"""Creating runs: a run's row and its first events (and a snapshot of them, and signals already
waiting in its inbox) in one transaction,
one at a time (`create_run`) or many in one transaction and one flush (`create_runs`, the group
create). The Store's `create_run` and `create_runs` are these.

A create is retried by the boundary when its outcome is unknown (the connection dropped around the
COMMIT). A retry that meets its own row, written exactly as this call writes it, was the earlier
attempt landing (`_landed`): it returns the token instead of `DuplicateRunError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ._boundary import Boundary
from ._dialect import Dialect, ErrorKind, iter_chunks
from ._journal import Journal, check_batch, event_row, insert_events
from ._records import NewEvent, NewSnapshot
from ._signals import insert_in_transaction as insert_signals
from .errors import DuplicateRunError

__all__ = ["Creates"]

_INSERT_RUN = (
    "INSERT INTO agentsaga_runs (run_id, workflow, version, fingerprint, target, status,"
    " created_at, updated_at, parent_run_id, lease_owner, lease_token, lease_expires_at, queue,"
    " priority, dedup_key, finished_at, error, recoveries)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0) RETURNING pk"
)
# Many runs in one statement (group create): the rows are `_INSERT_RUN_ROW` repeated; a row whose id
# or dedup key is taken is skipped, not an error, and its absence from the answer says so.
_INSERT_RUN_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)"
_CREATE_CHUNK = 16  # rows per statement: 17 parameters each, under every driver's limit
_INSERT_RUNS = (
    "INSERT INTO agentsaga_runs (run_id, workflow, version, fingerprint, target, status,"
    " created_at, updated_at, parent_run_id, lease_owner, lease_token, lease_expires_at, queue,"
    " priority, dedup_key, finished_at, error, recoveries)"
    " VALUES {rows} ON CONFLICT DO NOTHING RETURNING run_id, pk"
)
# What identifies a created run beyond its id (see `Creates._landed`).
_SELECT_IDENTITY = (
    "SELECT workflow, target, created_at, parent_run_id, queue, priority, dedup_key"
    " FROM agentsaga_runs WHERE run_id = ?"
)
# Postgres: the run and its first event in one statement (a data-modifying WITH), so one round trip
# in autocommit instead of BEGIN, INSERT, INSERT, COMMIT. A statement is its own transaction.
_CREATE_RUN_ONE = (
    f"WITH r AS ({_INSERT_RUN})"
    " INSERT INTO agentsaga_events (run_pk, seq, kind, at, data) SELECT r.pk, ?, ?, ?, ? FROM r"
)


class _Row(NamedTuple):
    """A run's row as created, in `_INSERT_RUN`'s column order."""

    run_id: str
    workflow: str
    version: str
    fingerprint: str
    target: str
    status: str
    created_at: float
    updated_at: float
    parent_run_id: str | None
    lease_owner: str | None
    lease_token: int
    lease_expires_at: float | None
    queue: str | None
    priority: int
    dedup_key: str | None
    finished_at: float | None
    error: str | None


class _Plan(NamedTuple):
    """What a create writes: the run row, its first events and snapshot, the signals waiting in its
    inbox, and the lease token it returns."""

    row: _Row
    events: list[NewEvent]
    snapshot: NewSnapshot | None
    token: int
    signals: list[tuple[str, str, float]]


class Creates:
    """Creates runs (see the module docstring)."""

    def __init__(self, dialect: Dialect, boundary: Boundary, journal: Journal) -> None:
        self._d = dialect
        self._b = boundary
        self._journal = journal

    def create_run(
        self,
        *,
        run_id: str,
        workflow: str,
        version: str,
        fingerprint: str,
        target: str,
        created_at: float,
        events: Sequence[NewEvent],
        status: str = "pending",
        lease_owner: str | None = None,
        lease_ttl: float | None = None,
        parent_run_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        dedup_key: str | None = None,
        snapshot: NewSnapshot | None = None,
        finished_at: float | None = None,
        error: str | None = None,
        signals: Sequence[tuple[str, str, float]] = (),
    ) -> int:
        """Insert the run and its first events (and a snapshot of them) in one transaction;
        return the lease token (1 when created leased by `lease_owner`, else 0).

        `finished_at` and `error` bring in a run that has already ended elsewhere (a restore);
        `signals` ((name, JSON data, sent_at), oldest first) are queued unconsumed in its inbox in
        the same transaction (a restored run's pending signals).
        A taken run id or dedup key raises `DuplicateRunError`, except on a retry after an attempt
        whose COMMIT may have landed, when the row in the way is exactly this call's (`_landed`)."""
        row, events, snapshot, token, inbox = self._plan(
            run_id=run_id, workflow=workflow, version=version, fingerprint=fingerprint, target=target,
            created_at=created_at, events=events, status=status, lease_owner=lease_owner, lease_ttl=lease_ttl,
            parent_run_id=parent_run_id, queue=queue, priority=priority, dedup_key=dedup_key,
            snapshot=snapshot, finished_at=finished_at, error=error, signals=signals)
        d = self._d
        journal = self._journal

        one = d.name == "postgresql" and len(events) == 1 and snapshot is None and not inbox
        attempts = 0

        def work(conn: Any) -> int:
            nonlocal attempts
            attempts += 1
            try:
                if one:
                    e = events[0]
                    d.execute(conn, _CREATE_RUN_ONE, (*row, e.seq, e.kind, e.at, e.data))
                    return token
                with d.transaction(conn):
                    pk = d.fetchall(conn, _INSERT_RUN, row)[0][0]
                    if events:
                        insert_events(d, conn, [event_row(pk, e) for e in events])
                    if snapshot is not None:
                        journal.insert_snapshot(conn, pk, snapshot)
                    if inbox:
                        insert_signals(d, conn, pk, inbox)
            except d.driver_errors as exc:
                if d.classify(exc, conn) is not ErrorKind.UNIQUE:
                    raise
                # An earlier attempt failed with its outcome unknown (the boundary retries only
                # those): if its COMMIT landed, the row in the way is the one this call wrote.
                if attempts > 1 and self._landed(conn, row, events):
                    return token
                # The events had a brand-new run_pk: the duplicate is the run id or dedup key.
                self._raise_duplicate(conn, run_id, dedup_key, exc)
            return token

        return self._b.run("create_run", work)

    def create_runs(self, creates: Sequence[dict[str, Any]]) -> list[int | DuplicateRunError]:
        """Group create: several runs (each a dict of `create_run`'s arguments), with their first
        events and snapshots, in one transaction and one flush. Each gets its own verdict, in
        order: its lease token, or the `DuplicateRunError` `create_run` would have raised (its id
        or dedup key is taken, in the database or by an earlier item); the others are created. An
        item a retried attempt finds already written exactly as it writes it gets its token.
        Arguments that `create_run` refuses raise before anything is written; the database being
        away raises, as `create_run` does."""
        plans = [self._plan(**c) for c in creates]
        if not plans:
            return []
        d = self._d
        attempts = 0

        def work(conn: Any) -> list[int | DuplicateRunError]:
            nonlocal attempts
            attempts += 1
            taken: list[int] = []
            with d.pipeline(conn), d.transaction(conn):
                # Chunks of a fixed size (and a shorter last one): a few statement texts, short
                # enough for the driver to cache and prepare; every chunk is sent before any answer
                # is read (Postgres: one round trip for all of them).
                cursors = [
                    d.execute(conn, _INSERT_RUNS.format(rows=", ".join([_INSERT_RUN_ROW] * len(chunk))),
                              [v for plan in chunk for v in plan.row])
                    for chunk in iter_chunks(plans, _CREATE_CHUNK)
                ]
                pks: dict[str, int] = {}
                for cursor in cursors:
                    pks.update(cursor.fetchall())
                events: list[tuple[Any, ...]] = []
                for i, (row, evs, snapshot, _token, inbox) in enumerate(plans):
                    pk = pks.pop(row.run_id, None)  # popped: a second item with this id is a duplicate
                    if pk is None:
                        taken.append(i)
                        continue
                    events += [event_row(pk, e) for e in evs]
                    if snapshot is not None:
                        self._journal.insert_snapshot(conn, pk, snapshot)
                    if inbox:
                        insert_signals(d, conn, pk, inbox)
                if events:
                    insert_events(d, conn, events)
            results: list[int | DuplicateRunError] = [plan.token for plan in plans]
            # Ids this group holds: created now, or (after a retry) by its earlier attempt.
            mine = {plan.row.run_id for i, plan in enumerate(plans) if i not in taken}
            for i in taken:  # named after the commit, as create_run names its duplicate
                row = plans[i].row
                # As in create_run: after an attempt whose COMMIT may have landed, an item whose row
                # is exactly the one it writes was created then. An id an earlier item of the group
                # holds is a duplicate within the group, whatever it reads like.
                if attempts > 1 and row.run_id not in mine and self._landed(conn, row, plans[i].events):
                    mine.add(row.run_id)
                    continue
                try:
                    self._raise_duplicate(conn, row.run_id, row.dedup_key, None)
                except DuplicateRunError as dup:
                    results[i] = dup
            return results

        return self._b.run("create_runs", work)

    @staticmethod
    def _plan(
        *, run_id: str, workflow: str, version: str, fingerprint: str, target: str, created_at: float,
        events: Sequence[NewEvent], status: str = "pending", lease_owner: str | None = None,
        lease_ttl: float | None = None, parent_run_id: str | None = None, queue: str | None = None,
        priority: int = 0, dedup_key: str | None = None, snapshot: NewSnapshot | None = None,
        finished_at: float | None = None, error: str | None = None,
        signals: Sequence[tuple[str, str, float]] = (),
    ) -> _Plan:
        """`create_run`'s checks, and what it writes."""
        if lease_owner is not None and lease_ttl is None:
            raise ValueError("create_run: lease_owner needs lease_ttl")
        events = list(events)
        check_batch(run_id, events)
        if snapshot is not None and snapshot.seq not in {e.seq for e in events}:
            raise ValueError(f"create_run: the snapshot's seq {snapshot.seq} is not one of the events'")
        token = 1 if lease_owner is not None else 0
        expires = created_at + lease_ttl if lease_owner is not None and lease_ttl else None
        row = _Row(run_id, workflow, version, fingerprint, target, status, created_at, finished_at or created_at,
                   parent_run_id, lease_owner, token, expires, queue, priority, dedup_key, finished_at, error)
        inbox = [(name, data, sent_at) for name, data, sent_at in signals]
        return _Plan(row, events, snapshot, token, inbox)

    def _landed(self, conn: Any, row: _Row, events: Sequence[NewEvent]) -> bool:
        """True when the run `row` describes is in the database as this call
        wrote it, with `events` byte for byte: an earlier attempt whose reply was lost landed.

        Compared: the columns nothing changes after a create (workflow, target, created_at, parent,
        queue, priority, dedup key) and the first events, which are append-only and carry the
        input, version and fingerprint. Not compared: status, lease, version and fingerprint
        columns, which a worker claiming the run (or a migration) may have changed since."""
        found = self._d.fetchone(conn, _SELECT_IDENTITY, (row.run_id,))
        if found is None or tuple(found) != (row.workflow, row.target, row.created_at, row.parent_run_id, row.queue,
                                             row.priority, row.dedup_key):
            return False
        return not events or self._journal.already_journaled(conn, row.run_id, events)

    def _raise_duplicate(
        self, conn: Any, run_id: str, dedup_key: str | None, exc: BaseException | None
    ) -> None:
        d = self._d
        if d.fetchone(conn, "SELECT pk FROM agentsaga_runs WHERE run_id = ?", (run_id,)):
            raise DuplicateRunError(
                f"run {run_id!r} already exists", run_id=run_id, existing_run_id=run_id
            ) from exc
        found = None
        if dedup_key is not None:
            found = d.fetchone(
                conn, "SELECT run_id FROM agentsaga_runs WHERE dedup_key = ?", (dedup_key,)
            )
        existing = found[0] if found else None
        raise DuplicateRunError(
            f"run {run_id!r}: dedup key {dedup_key!r} is already used by run {existing!r}",
            run_id=run_id, existing_run_id=existing,
        ) from exc
