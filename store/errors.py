"""Errors raised by the store.

Every error the store raises is a `StoreError`; nothing from sqlite3, psycopg or SQLAlchemy
crosses the package boundary (the driver's exception is kept as `__cause__` for debugging).

    StoreError
     ├── ConfigError            malformed URL / unsupported scheme / bad option
     ├── SchemaVersionError     database made by a newer agentsaga; one lacking a table or column
     │                          (changed behind agentsaga's back); a file that is no SQLite
     │                          database; with create=False also one without the agentsaga
     │                          tables, or one that needs a migration
     ├── StoreUnavailableError  unreachable or locked after retrying with backoff for `retry_for` s
     ├── RunNotFoundError       unknown run id (carries .run_id)
     ├── DuplicateRunError      run id or dedup key already exists
     ├── ConflictError          duplicate (run, seq): another writer appended first
     ├── FencedError            the caller's lease token is stale (invariant 6)
     └── LeaseHeldError         a live lease is held by another owner

Attributes are keyword-only with defaults so that every error survives pickling
(`BaseException.__reduce__` rebuilds from `args` and restores `__dict__`): workers may ship
errors across process boundaries.
"""

from __future__ import annotations

__all__ = [
    "StoreError",
    "ConfigError",
    "SchemaVersionError",
    "StoreUnavailableError",
    "RunNotFoundError",
    "DuplicateRunError",
    "ConflictError",
    "FencedError",
    "LeaseHeldError",
]


class StoreError(Exception):
    """Base class of every error the store raises."""


class ConfigError(StoreError):
    """A malformed database URL, an unsupported scheme or a bad option, found before connecting."""


class SchemaVersionError(StoreError):
    """The database was created by a newer agentsaga than this one; or, opened with
    ``create=False`` (which never creates or migrates a schema), it holds no agentsaga tables
    (``found`` None) or an older schema that needs a migration (``found`` < ``supported``); or
    a statement met a table or column missing from it (its schema changed behind agentsaga's
    back), or the file is no SQLite database (``found`` None). ``absent`` is true exactly when it
    holds no agentsaga tables at all (what a mistyped path or an empty database looks like)."""

    def __init__(self, message: str, *, found: int | None = None, supported: int | None = None,
                 absent: bool = False):
        super().__init__(message)
        self.found = found
        self.supported = supported
        self.absent = absent


class StoreUnavailableError(StoreError):
    """The database stayed unreachable or locked after retrying for `retry_for` seconds."""

    def __init__(self, message: str, *, url: str | None = None):
        super().__init__(message)
        self.url = url


class RunNotFoundError(StoreError):
    """No run has this id."""

    def __init__(self, message: str, *, run_id: str | None = None):
        super().__init__(message)
        self.run_id = run_id


class DuplicateRunError(StoreError):
    """A run with this id, or with this dedup key, already exists."""

    def __init__(
        self, message: str, *, run_id: str | None = None, existing_run_id: str | None = None
    ):
        super().__init__(message)
        self.run_id = run_id
        self.existing_run_id = existing_run_id


class ConflictError(StoreError):
    """Another writer got there first: a duplicate (run, seq), snapshot or consumed signal."""

    def __init__(self, message: str, *, run_id: str | None = None, seq: int | None = None):
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq


class FencedError(StoreError):
    """The caller's lease token is stale: the run was leased again since (invariant 6)."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        token: int | None = None,
        current_token: int | None = None,
    ):
        super().__init__(message)
        self.run_id = run_id
        self.token = token
        self.current_token = current_token


class LeaseHeldError(StoreError):
    """Another owner holds a lease on the run that has not expired."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        owner: str | None = None,
        expires_at: float | None = None,
    ):
        super().__init__(message)
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at

    def until(self, now: float) -> str:
        """`` until <UTC time> (in Ns)``, when the lease expires (empty when unknown), for messages."""
        if self.expires_at is None:
            return ""
        import datetime as _dt

        when = _dt.datetime.fromtimestamp(self.expires_at, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f" until {when} (in {max(0.0, self.expires_at - now):.0f}s)"
