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

from typing import TYPE_CHECKING

from ._records import VALIDITY, EventRecord, NewEvent, NewSnapshot, RunRecord, SnapshotInfo, SnapshotRecord
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

if TYPE_CHECKING:
    from ._api import Store
    from ._open import open_store
    from ._version import SCHEMA_VERSION
    from ._url import default_url

# The names that need SQLAlchemy are imported when first used: a process that only handles the
# store's records and errors (``agentsaga --help``, ``import orchestrator``) starts without it.
_LAZY = {"Store": "._api", "open_store": "._open", "SCHEMA_VERSION": "._version", "default_url": "._url"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
