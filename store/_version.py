"""The schema's version, its migrations, and opening a database: ``ensure_schema`` creates or
migrates the schema (an open that may write), ``check_schema`` only checks it (an open that may
not: ``open_store(create=False)``, what the reading verbs use).

Kept apart from the tables (``_schema.py``, SQLModel classes): a process that opens a database
already at this version (every read verb, every worker after the first) reads one row and never
imports SQLModel or SQLAlchemy's ORM.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import SchemaVersionError, StoreError

__all__ = ["CREATES_SCHEMA", "MIGRATES_SCHEMA", "MIGRATIONS", "SCHEMA_VERSION", "check_schema", "ensure_schema",
           "schema_mismatch"]

SCHEMA_VERSION = 3

# A migration from version v to v+1 is MIGRATIONS[v](execute, dialect_name): `execute(sql)` runs
# one statement inside the opening transaction (which holds the schema lock), so a migration is
# all or nothing and two processes never run it twice.
Migration = Callable[[Callable[[str], None], str], None]
MIGRATIONS: dict[int, Migration] = {}

#: What creates a schema, as the refusals say it: an open that may write. The CLI's verbs on a run
#: that must exist (resume, signal, cancel, ...) never create one: a database without the tables
#: cannot hold the run, and is refused naming it.
CREATES_SCHEMA = (
    "Orchestrator(url) or open_store(url) in Python, or a verb that drives runs: "
    "agentsaga run, enqueue, recover or worker"
)
#: What migrates a schema: every open that may write, the CLI's verbs on an existing run included.
MIGRATES_SCHEMA = (
    "Orchestrator(url) or open_store(url) in Python, or a verb that drives runs: "
    "agentsaga run, enqueue, resume, recover or worker"
)


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


#: The tables every agentsaga schema has had since version 1: finding any of them without a version
#: row means the schema is damaged, not absent.
_CORE_TABLES = ("agentsaga_runs", "agentsaga_events", "agentsaga_snapshots")


def _stored_version(dialect, conn) -> int | None:
    """The schema version recorded in the database; None when it holds no agentsaga schema at all.

    A schema with agentsaga tables but no version row (its meta table or the row deleted) is
    damage: raised as such, never stamped with a version it may not have."""
    row = None
    if dialect.fetchone(conn, dialect.table_exists_sql, ("agentsaga_meta",)) is not None:
        row = dialect.fetchone(
            conn, "SELECT value FROM agentsaga_meta WHERE key = ?", ("schema_version",)
        )
    if row is None:
        if any(dialect.fetchone(conn, dialect.table_exists_sql, (table,)) is not None
               for table in _CORE_TABLES):
            raise StoreError(
                f"{dialect.url} is damaged: it holds agentsaga tables but no schema version "
                "(agentsaga_meta.schema_version is missing); it is not opened, so that no version "
                "is guessed for it"
            )
        return None
    try:
        return int(row[0])
    except ValueError:
        raise StoreError(
            f"{dialect.url} is damaged: agentsaga_meta.schema_version is {row[0]!r}, not a number"
        ) from None


def _refuse_newer(dialect, found: int) -> None:
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"database schema version {found} is newer than this agentsaga supports "
            f"({SCHEMA_VERSION}): {dialect.url} was written by a newer agentsaga; upgrade "
            "agentsaga to use it",
            found=found,
            supported=SCHEMA_VERSION,
        )


def check_schema(dialect, conn) -> int:
    """The version of an existing schema that this code can use as it is; raise otherwise.

    What an open that may not write (``open_store(create=False)``) does instead of
    ``ensure_schema``: reads only, and creates, migrates or stamps nothing. A database without
    the agentsaga tables (another application's, an empty file, a new schema) and one whose
    schema needs a migration are both refused, naming the database."""
    found = _stored_version(dialect, conn)
    if found is None:
        raise SchemaVersionError(
            f"{dialect.url} holds no agentsaga tables: not an agentsaga database, or none was "
            f"written yet. Reading never creates them; the first open that may write does: {CREATES_SCHEMA}",
            found=None,
            supported=SCHEMA_VERSION,
            absent=True,
        )
    _refuse_newer(dialect, found)
    if found < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{dialect.url} has schema version {found} and this agentsaga reads version "
            f"{SCHEMA_VERSION}: it needs a migration, which an open for reading never makes. An "
            f"open that may write migrates it: {MIGRATES_SCHEMA}; read it after that",
            found=found,
            supported=SCHEMA_VERSION,
        )
    return found


def schema_mismatch(url: str, op: str, problem: str) -> SchemaVersionError:
    """The error for a statement that met a table or column missing from a database whose
    version row says it is current: a schema changed or dropped outside agentsaga (a table
    dropped, a column removed, a restore of part of it). Nothing is created or repaired for it:
    guessing what the missing parts held could lose or invent history."""
    return SchemaVersionError(
        f"{url} lacks part of the agentsaga schema (version {SCHEMA_VERSION}) it is marked with: "
        f"{problem} (in {op}). Its tables were changed outside agentsaga, which never repairs a "
        "schema by guessing: restore the database from a backup, or use another one. An empty "
        f"database gets the whole schema from the first open that may write: {CREATES_SCHEMA}",
        found=None,
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
        _refuse_newer(dialect, found)
        if found == SCHEMA_VERSION:
            return found
    from ._schema import PG_NOTIFY_DDL, ddl, meta_ddl  # creating or migrating: the tables are needed

    sa_dialect = dialect.sa_dialect
    with dialect.transaction(conn):
        for sql in dialect.schema_lock_sql:
            dialect.execute(conn, sql, ())
        # The meta table first (IF NOT EXISTS): on Postgres, creating it waits for a racing
        # creator's commit and makes its tables visible to this transaction, where a catalog lookup
        # alone (to_regclass) may still miss them. Damage found after it rolls it back.
        dialect.execute(conn, meta_ddl(sa_dialect), ())
        found = _stored_version(dialect, conn)  # again: another process may have won the race
        if found is None:
            for sql in ddl(sa_dialect):
                dialect.execute(conn, sql, ())
            for sql in PG_NOTIFY_DDL if dialect.name == "postgresql" else ():
                dialect.execute(conn, sql, ())
            dialect.execute(
                conn,
                "INSERT INTO agentsaga_meta (key, value) VALUES (?, ?)",
                ("schema_version", str(SCHEMA_VERSION)),
            )
            return None
        _refuse_newer(dialect, found)
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
