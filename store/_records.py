"""The values that cross the store's API: plain frozen dataclasses, no ORM objects.

Payload fields (`data`, `state`) are JSON *text*: the store never parses them, so the bytes a
caller wrote are the bytes it reads back (which is what lets the orchestrator hash snapshots).
Times are floats (epoch seconds) chosen by the caller's injected clock; the store never reads
the clock itself.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunRecord", "NewEvent", "EventRecord", "NewSnapshot", "SnapshotRecord", "SnapshotInfo", "VALIDITY"]

#: The validity flags of a snapshot in the catalog: not checked yet, checked and good, its bytes do
#: not verify (hash, layout, decoding), or intact bytes that must not be trusted (they disagree with
#: the journal, or a person set it aside).
VALIDITY = ("unchecked", "verified", "failed", "quarantined")


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One row of `agentsaga_runs` as the caller sees it."""

    run_id: str
    workflow: str
    version: str
    fingerprint: str
    target: str
    status: str
    created_at: float
    updated_at: float
    finished_at: float | None
    parent_run_id: str | None
    error: str | None
    lease_owner: str | None
    lease_token: int
    lease_expires_at: float | None
    queue: str | None
    priority: int
    dedup_key: str | None
    wake_at: float | None
    recoveries: int


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: `data` is JSON text, `at` epoch seconds."""

    seq: int
    kind: str
    data: str
    at: float


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A journaled event as read back."""

    seq: int
    kind: str
    data: str
    at: float


@dataclass(frozen=True, slots=True)
class NewSnapshot:
    """A snapshot to write with an append: `state` is JSON text hashed by the caller."""

    seq: int
    state: str
    sha256: str
    trigger: str
    created_at: float
    schema_version: int = 1
    #: catalog metadata (what wrote it, under which code and configuration); the store keeps it as given
    workflow: str = ""
    version: str = ""
    fingerprint: str = ""
    agentsaga_version: str = ""
    python_version: str = ""
    config_hash: str = ""
    #: bytes of `state` as UTF-8 (None: the store measures it)
    size_bytes: int | None = None
    #: "full" (the whole fold) or "incremental" (what changed since its base snapshot)
    kind: str = "full"
    #: an incremental's base: the seq and sha256 of the snapshot it applies to
    base_seq: int | None = None
    base_sha256: str | None = None
    #: the seq of the full snapshot its chain starts from (None: its own seq, a full snapshot)
    root_seq: int | None = None
    #: HMAC-SHA256 of the snapshot under the configured signing key, or None (unsigned)
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A stored snapshot as read back."""

    seq: int
    state: str
    sha256: str
    schema_version: int
    trigger: str
    created_at: float
    kind: str = "full"
    base_seq: int | None = None
    base_sha256: str | None = None
    root_seq: int | None = None
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """One entry of a run's snapshot catalog: everything about a snapshot but its state."""

    seq: int
    sha256: str
    schema_version: int
    trigger: str
    created_at: float
    workflow: str
    version: str
    fingerprint: str
    agentsaga_version: str
    python_version: str
    config_hash: str
    size_bytes: int | None
    validity: str
    validity_reason: str | None
    checked_at: float | None
    kind: str = "full"
    base_seq: int | None = None
    base_sha256: str | None = None
    root_seq: int | None = None
    signature: str | None = None
