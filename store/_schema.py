"""The tables (SQLModel classes), their indexes, the schema version and its migrations.

The classes are the single description of the schema: `ddl()` compiles them to CREATE
statements for either dialect. The store's queries are plain SQL against these column names
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

from collections.abc import Callable

from sqlalchemy import BigInteger, Boolean, Index, Integer, Text, text
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.orm import registry
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import Field, SQLModel

from .errors import SchemaVersionError, StoreError

__all__ = ["SCHEMA_VERSION", "MIGRATIONS", "ddl", "ensure_schema"]

SCHEMA_VERSION = 3

# A migration from version v to v+1 is MIGRATIONS[v](execute, dialect_name): `execute(sql)` runs
# one statement inside the opening transaction (which holds the schema lock), so a migration is
# all or nothing and two processes never run it twice.
Migration = Callable[[Callable[[str], None], str], None]
MIGRATIONS: dict[int, Migration] = {}


def _v1_to_v2(execute: Callable[[str], None], dialect_name: str) -> None:
    """The checkpoint catalog: snapshots gain what wrote them and a validity flag. Existing
    snapshots get their run's workflow, version and fingerprint and their size; the versions of
    agentsaga and Python that wrote them are unknown (empty), and they are `unchecked`."""
    for column in ("workflow", "version", "fingerprint", "agentsaga_version", "python_version", "config_hash"):
        execute(f"ALTER TABLE agentsaga_snapshots ADD COLUMN {column} VARCHAR NOT NULL DEFAULT ''")
    big = "INTEGER" if dialect_name == "sqlite" else "BIGINT"
    execute(f"ALTER TABLE agentsaga_snapshots ADD COLUMN size_bytes {big}")
    execute("ALTER TABLE agentsaga_snapshots ADD COLUMN validity VARCHAR NOT NULL DEFAULT 'unchecked'")
    execute("ALTER TABLE agentsaga_snapshots ADD COLUMN validity_reason TEXT")
    execute("ALTER TABLE agentsaga_snapshots ADD COLUMN checked_at FLOAT")
    size = "LENGTH(CAST(state AS BLOB))" if dialect_name == "sqlite" else "OCTET_LENGTH(state)"
    execute(
        "UPDATE agentsaga_snapshots SET"
        " workflow = (SELECT r.workflow FROM agentsaga_runs r WHERE r.pk = agentsaga_snapshots.run_pk),"
        " version = (SELECT r.version FROM agentsaga_runs r WHERE r.pk = agentsaga_snapshots.run_pk),"
        " fingerprint = (SELECT r.fingerprint FROM agentsaga_runs r WHERE r.pk = agentsaga_snapshots.run_pk),"
        f" size_bytes = {size}"
        " WHERE EXISTS (SELECT 1 FROM agentsaga_runs r WHERE r.pk = agentsaga_snapshots.run_pk)"
    )


MIGRATIONS[1] = _v1_to_v2


def _v2_to_v3(execute: Callable[[str], None], dialect_name: str) -> None:
    """Incremental and signed snapshots: each snapshot says whether it is full or incremental, its
    base (seq and sha256) and the full snapshot its chain starts from, and its HMAC signature.
    Existing snapshots are full, their own root, and unsigned."""
    big = "INTEGER" if dialect_name == "sqlite" else "BIGINT"
    execute("ALTER TABLE agentsaga_snapshots ADD COLUMN kind VARCHAR NOT NULL DEFAULT 'full'")
    execute(f"ALTER TABLE agentsaga_snapshots ADD COLUMN base_seq {big}")
    execute("ALTER TABLE agentsaga_snapshots ADD COLUMN base_sha256 VARCHAR")
    execute(f"ALTER TABLE agentsaga_snapshots ADD COLUMN root_seq {big}")
    execute("ALTER TABLE agentsaga_snapshots ADD COLUMN signature VARCHAR")


MIGRATIONS[2] = _v2_to_v3

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
_PG_NOTIFY_DDL = (
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


def _meta_ddl(sa_dialect: SADialect) -> str:
    return str(CreateTable(MetaRow.__table__, if_not_exists=True).compile(dialect=sa_dialect))


def _stored_version(dialect, conn) -> int | None:
    """The schema version recorded in the database; None for a fresh database."""
    if dialect.fetchone(conn, dialect.table_exists_sql, ("agentsaga_meta",)) is None:
        return None
    row = dialect.fetchone(
        conn, "SELECT value FROM agentsaga_meta WHERE key = ?", ("schema_version",)
    )
    if row is None:
        return None
    try:
        return int(row[0])
    except ValueError:
        raise StoreError(
            f"agentsaga_meta.schema_version is {row[0]!r}, not a number: the database is damaged"
        ) from None


def _refuse_newer(found: int) -> None:
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"database schema version {found} is newer than this agentsaga supports "
            f"({SCHEMA_VERSION})",
            found=found,
            supported=SCHEMA_VERSION,
        )


def ensure_schema(dialect, conn) -> int | None:
    """Create or migrate the schema on `conn`; return the version found (None: fresh).

    The common case, a database already at this version, is two reads: no DDL and no lock,
    so opening never waits for a busy writer and needs no CREATE privilege. Otherwise one
    transaction first takes the dialect's schema lock, so processes racing to open a fresh
    database take turns: the first creates everything, the others find the version row.
    """
    found = _stored_version(dialect, conn)
    if found is not None:
        _refuse_newer(found)
        if found == SCHEMA_VERSION:
            return found
    sa_dialect = dialect.sa_dialect
    with dialect.transaction(conn):
        for sql in dialect.schema_lock_sql:
            dialect.execute(conn, sql, ())
        dialect.execute(conn, _meta_ddl(sa_dialect), ())
        found = _stored_version(dialect, conn)  # again: another process may have won the race
        if found is None:
            for sql in ddl(sa_dialect):
                dialect.execute(conn, sql, ())
            for sql in _PG_NOTIFY_DDL if dialect.name == "postgresql" else ():
                dialect.execute(conn, sql, ())
            dialect.execute(
                conn,
                "INSERT INTO agentsaga_meta (key, value) VALUES (?, ?)",
                ("schema_version", str(SCHEMA_VERSION)),
            )
            return None
        _refuse_newer(found)
        for version in range(found, SCHEMA_VERSION):
            migration = MIGRATIONS.get(version)
            if migration is None:
                raise StoreError(f"no migration registered from schema version {version}")
            migration(lambda sql: dialect.execute(conn, sql, ()), dialect.name)
        if found != SCHEMA_VERSION:
            dialect.execute(
                conn,
                "UPDATE agentsaga_meta SET value = ? WHERE key = ?",
                (str(SCHEMA_VERSION), "schema_version"),
            )
        return found
