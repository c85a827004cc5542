"""agentsaga's store: runs, an append-only journal and snapshots, on SQLite (the embedded
default) or Postgres, with its parts beside them: leases, queues (claims), wake-ups, signals,
breaker state, slots, failures and stats. Payloads are opaque JSON text.

    from store import open_store
    with open_store("sqlite:///agent.db") as store:
        token = store.create_run(run_id="r1", ..., events=[NewEvent(1, "RunStarted", "{}", now)],
                                 lease_owner="me", lease_ttl=30)
        store.leases.renew("r1", token=token, ttl=30, now=now)

The contract is docs/internals-store.md.
"""

from ._api import Store
from ._open import open_store
from ._records import (
    VALIDITY,
    EventRecord,
    NewEvent,
    NewSnapshot,
    RunRecord,
    SnapshotInfo,
    SnapshotRecord,
)
from ._schema import SCHEMA_VERSION
from ._url import default_url
from .errors import (
    ConfigError,
    ConflictError,
    DuplicateRunError,
    FencedError,
    LeaseHeldError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StoreUnavailableError,
)

__all__ = [
    "open_store",
    "default_url",
    "Store",
    "SCHEMA_VERSION",
    "RunRecord",
    "NewEvent",
    "EventRecord",
    "NewSnapshot",
    "SnapshotRecord",
    "SnapshotInfo",
    "VALIDITY",
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
