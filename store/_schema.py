"""The tables (SQLModel classes) and their indexes; the version and migrations are `_version.py`'s.

The classes are the single description of the schema: `ddl()` compiles them to CREATE
statements for either dialect. Only creating a database imports this module (and SQLModel with
it): opening one at the current version reads its version row and nothing more. The store's queries are plain SQL against these column names
(see `_api.py` for why), so a column rename here must be mirrored there; the contract suite
catches a mismatch on both backends.

The tables live in their own SQLModel registry, so a user's `SQLModel.metadata.create_all()`
neither creates nor drops ours, and ours never picks up theirs.

No foreign keys, on purpose: every insert into a child table is already guarded by a lookup
of the run row in the same statement or transaction (that lookup is the fencing check), and
`delete_runs` removes the run row first, then its children, in one transaction. A declared
foreign key would add a second index probe and, on Postgres, a row lock per journal insert:
the hot path would pay for a guarantee it already has.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Index, Integer, Text, text
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.orm import registry
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import Field, SQLModel


__all__ = ["ddl", "meta_ddl", "PG_NOTIFY_DDL"]

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid (no extra index, and
# AUTOINCREMENT allowed); Postgres gets a BIGSERIAL.
_PK = BigInteger().with_variant(Integer(), "sqlite")
_DEFAULT_0 = {"server_default": text("0")}
_DEFAULT_EMPTY = {"server_default": text("''")}
# Parts of a composite key, not generated ids.
_NO_AUTOINCREMENT = {"autoincrement": False}


class _Base(SQLModel, registry=registry()):
    pass


class MetaRow(_Base, table=True):
    __tablename__ = "agentsaga_meta"

    key: str = Field(primary_key=True)
    value: str


class RunRow(_Base, table=True):
    __tablename__ = "agentsaga_runs"
    __table_args__ = (
        Index("ix_agentsaga_runs_created", "created_at"),
        Index("ix_agentsaga_runs_status_created", "status", "created_at"),
        Index("ix_agentsaga_runs_workflow_created", "workflow", "created_at"),
        Index("ix_agentsaga_runs_claim", "status", "lease_expires_at"),
        # When the next parked run is due: what an idle worker sleeps until (store/_wakeups.py).
        Index("ix_agentsaga_runs_wake", "status", "wake_at"),
        Index(
            "ux_agentsaga_runs_dedup",
            "dedup_key",
            unique=True,
            sqlite_where=text("dedup_key IS NOT NULL"),
            postgresql_where=text("dedup_key IS NOT NULL"),
        ),
        # AUTOINCREMENT: a deleted run's pk is never handed to a new run, so nothing that
        # remembered a pk (a log line, a half-finished gc) can point at the wrong run.
        {"sqlite_autoincrement": True},
    )

    pk: int | None = Field(default=None, primary_key=True, sa_type=_PK)
    run_id: str = Field(unique=True)
    workflow: str
    version: str
    fingerprint: str
    target: str
    status: str
    created_at: float
    updated_at: float
    finished_at: float | None = None
    parent_run_id: str | None = None
    error: str | None = Field(default=None, sa_type=Text)
    lease_owner: str | None = None
    lease_token: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs=_DEFAULT_0)
    lease_expires_at: float | None = None
    queue: str | None = None
    priority: int = Field(default=0, sa_column_kwargs=_DEFAULT_0)
    dedup_key: str | None = None
    wake_at: float | None = None
    recoveries: int = Field(default=0, sa_column_kwargs=_DEFAULT_0)


class EventRow(_Base, table=True):
    __tablename__ = "agentsaga_events"
    # An ordinary rowid table, measured against WITHOUT ROWID (bench/core.py, peers.py): a
    # WITHOUT ROWID row over ~1 KB spills into an overflow page of its own, mostly empty (4.7 KB a
    # step for 1 KB outputs against 1.4 KB here), and even small events came out smaller here.

    run_pk: int = Field(primary_key=True, sa_type=BigInteger, sa_column_kwargs=_NO_AUTOINCREMENT)
    seq: int = Field(primary_key=True, sa_column_kwargs=_NO_AUTOINCREMENT)
    kind: str
    at: float
    data: str = Field(sa_type=Text)


class SnapshotRow(_Base, table=True):
    __tablename__ = "agentsaga_snapshots"

    run_pk: int = Field(primary_key=True, sa_type=BigInteger, sa_column_kwargs=_NO_AUTOINCREMENT)
    seq: int = Field(primary_key=True, sa_column_kwargs=_NO_AUTOINCREMENT)
    state: str = Field(sa_type=Text)
    sha256: str
    schema_version: int
    trigger: str
    created_at: float
    # The checkpoint catalog (schema version 2): what wrote the snapshot and what checking it found.
    workflow: str = Field(default="", sa_column_kwargs=_DEFAULT_EMPTY)
    version: str = Field(default="", sa_column_kwargs=_DEFAULT_EMPTY)
    fingerprint: str = Field(default="", sa_column_kwargs=_DEFAULT_EMPTY)
    agentsaga_version: str = Field(default="", sa_column_kwargs=_DEFAULT_EMPTY)
    python_version: str = Field(default="", sa_column_kwargs=_DEFAULT_EMPTY)
    config_hash: str = Field(default="", sa_column_kwargs=_DEFAULT_EMPTY)
    size_bytes: int | None = Field(default=None, sa_type=BigInteger)
    validity: str = Field(default="unchecked", sa_column_kwargs={"server_default": text("'unchecked'")})
    validity_reason: str | None = Field(default=None, sa_type=Text)
    checked_at: float | None = None
    # Incremental and signed snapshots (schema version 3): full or incremental, the base an
    # incremental applies to, the full snapshot its chain starts from, the HMAC signature.
    kind: str = Field(default="full", sa_column_kwargs={"server_default": text("'full'")})
    base_seq: int | None = Field(default=None, sa_type=BigInteger)
    base_sha256: str | None = None
    root_seq: int | None = Field(default=None, sa_type=BigInteger)
    signature: str | None = None


class BreakerRow(_Base, table=True):
    __tablename__ = "agentsaga_breakers"

    name: str = Field(primary_key=True)
    state: str = Field(sa_type=Text)
    version: int
    updated_at: float


class SignalRow(_Base, table=True):
    __tablename__ = "agentsaga_signals"
    __table_args__ = (
        Index("ix_agentsaga_signals_run_consumed", "run_pk", "consumed"),
        {"sqlite_autoincrement": True},
    )

    pk: int | None = Field(default=None, primary_key=True, sa_type=_PK)
    run_pk: int = Field(sa_type=BigInteger)
    name: str
    data: str = Field(sa_type=Text)
    sent_at: float
    consumed: bool = Field(
        default=False, sa_type=Boolean, sa_column_kwargs={"server_default": text("false")}
    )


class SlotRow(_Base, table=True):
    """One unit of a cluster-wide concurrency limit (a tool's in-flight calls): held until it
    expires, so a holder that dies frees it without anyone's help (store/_slots.py)."""

    __tablename__ = "agentsaga_slots"

    name: str = Field(primary_key=True)
    idx: int = Field(primary_key=True, sa_column_kwargs=_NO_AUTOINCREMENT)
    holder: str | None = None
    expires_at: float | None = None


class QueueStartRow(_Base, table=True):
    """When runs of a rate-limited queue were handed out: the sliding window the limit counts."""

    __tablename__ = "agentsaga_queue_starts"
    __table_args__ = (Index("ix_agentsaga_queue_starts_queue_at", "queue", "at"),)

    pk: int | None = Field(default=None, primary_key=True, sa_type=_PK)
    queue: str
    at: float


class RunFailureRow(_Base, table=True):
    """Why recovering a run failed (store/_failures.py): a driver error, the run's move to
    `dead`, or a retry by hand. Opaque JSON `error`, like every payload."""

    __tablename__ = "agentsaga_run_failures"
    __table_args__ = (
        Index("ix_agentsaga_run_failures_run", "run_pk", "pk"),
        {"sqlite_autoincrement": True},
    )

    pk: int | None = Field(default=None, primary_key=True, sa_type=_PK)
    run_pk: int = Field(sa_type=BigInteger)
    at: float
    owner: str | None = None
    kind: str
    error: str = Field(sa_type=Text)
    recoveries: int = Field(default=0, sa_column_kwargs=_DEFAULT_0)
    status: str | None = None  # the run's status when written (for `dead`: the one to restore)


_TABLES = [
    RunRow.__table__,
    EventRow.__table__,
    SnapshotRow.__table__,
    BreakerRow.__table__,
    SignalRow.__table__,
    SlotRow.__table__,
    QueueStartRow.__table__,
    RunFailureRow.__table__,
]

# Postgres only: wake listening workers (LISTEN/NOTIFY) whenever a run may have become claimable:
# created, its lease released, its timer moved (a signal's wake), its status set back (a retry).
# The trigger sends the notification in the transaction that made the change, so it is delivered
# exactly when the change is visible. The channel is per schema (a hash: identifiers stop at 63
# bytes), the payload the run's queue. Renewals (lease_expires_at) and appends never fire it.
PG_NOTIFY_DDL = (
    "CREATE OR REPLACE FUNCTION agentsaga_runs_notify() RETURNS trigger LANGUAGE plpgsql AS $f$"
    " BEGIN PERFORM pg_notify('agentsaga_' || left(md5(TG_TABLE_SCHEMA), 16), coalesce(NEW.queue, ''));"
    " RETURN NULL; END $f$",
    "DROP TRIGGER IF EXISTS agentsaga_runs_notify ON agentsaga_runs",
    "CREATE TRIGGER agentsaga_runs_notify AFTER INSERT OR UPDATE OF lease_owner, wake_at, status"
    " ON agentsaga_runs FOR EACH ROW WHEN (NEW.lease_owner IS NULL AND NEW.finished_at IS NULL)"
    " EXECUTE FUNCTION agentsaga_runs_notify()",
)


def ddl(sa_dialect: SADialect) -> list[str]:
    """CREATE ... IF NOT EXISTS statements for the whole schema except the meta table."""
    out: list[str] = []
    for table in _TABLES:
        out.append(str(CreateTable(table, if_not_exists=True).compile(dialect=sa_dialect)))
        for index in sorted(table.indexes, key=lambda i: i.name or ""):
            out.append(str(CreateIndex(index, if_not_exists=True).compile(dialect=sa_dialect)))
    return out


def meta_ddl(sa_dialect: SADialect) -> str:
    return str(CreateTable(MetaRow.__table__, if_not_exists=True).compile(dialect=sa_dialect))
