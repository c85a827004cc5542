"""Savepoints: a run as one portable, self-contained, verifiable file, and bringing it back.

A savepoint is gzip-compressed JSON (see docs/checkpoints.md for every field)::

    {"format": "agentsaga-savepoint", "format_version": 2, "name", "created_at", "agentsaga_version",
     "run": {run_id, workflow, version, fingerprint, status, created_at, finished_at, error, parent_run_id},
     "snapshot": {seq, state, sha256, schema_version, trigger, created_at} | null,
     "count": N, "header": "<sha256>", "events": [{"seq", "kind", "at", "data", "link"}, ...],
     "signal_count": M, "signals": [{"id", "name", "data", "sent_at", "link"}, ...],
     "head": "<sha256>", "signature": "<hmac-sha256 hex>" | null}

``signals`` are the run's pending ones: sent, not yet consumed (no ``SignalReceived`` journals
them), oldest first, in the order a wait receives them. Version 1 (before signals were carried)
has neither ``signals`` nor ``signal_count`` and is still read: its run restores with an empty inbox.

The hash chain: ``header`` (link 0) is the sha256 of the canonical header (format, name, run,
snapshot, ``count``, the number of events, and from version 2 ``signal_count``); each event's
``link`` is ``sha256(previous link + canonical event)``, and the signals' links go on from the last
event's the same way; ``head`` is the last link. Reading a savepoint recomputes the chain and names the first link that
does not match (the header, an event's seq, or a signal's place), so an accident (a truncated copy, a flipped byte,
an edited event or signal) is refused before anything is written. A hash detects accidents, not intent:
whoever edits a file can recompute the chain. With a signing key the head is signed (HMAC-SHA256),
and a reader with the key refuses an unsigned or wrongly signed file.

The events are the run's whole journal (the journal alone is the truth, and the target's history,
verify and rollback need it); the snapshot lets the target resume without folding them all.
Restoring writes the run row, every event, the snapshot and the pending signals in one
transaction, then journals a ``Restored`` event: the target either holds the whole run or nothing of it.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.engine.names import name_problem
from orchestrator.engine.snapshots import SNAPSHOT_SCHEMA, snapshot_problem
from orchestrator.errors import SavepointError
from store import EventRecord, NewEvent, NewSnapshot, RunRecord, SnapshotRecord

__all__ = ["FORMAT", "FORMAT_VERSION", "MAX_BYTES", "PendingSignal", "Savepoint", "build_savepoint", "read_savepoint",
           "write_savepoint"]

FORMAT = "agentsaga-savepoint"
#: The layout this code writes and reads (and every older one); a file of a newer layout is refused,
#: never guessed at. 2: the run's pending signals are carried (``signals``, ``signal_count``).
FORMAT_VERSION = 2
#: the first layout that carries signals
_SIGNALS_SINCE = 2

_RUN_FIELDS = ("run_id", "workflow", "version", "fingerprint", "status", "created_at", "finished_at", "error",
               "parent_run_id")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _header(doc: dict[str, Any]) -> dict[str, Any]:
    header = {"format": doc.get("format"), "format_version": doc.get("format_version"), "name": doc.get("name"),
              "created_at": doc.get("created_at"), "agentsaga_version": doc.get("agentsaga_version"),
              "run": doc.get("run"), "snapshot": doc.get("snapshot"), "count": doc.get("count")}
    if not isinstance(doc.get("format_version"), int) or doc["format_version"] >= _SIGNALS_SINCE:
        header["signal_count"] = doc.get("signal_count")  # version 1's header, and so its hash, is as it was
    return header


def _link(previous: str, event: dict[str, Any]) -> str:
    body = {"seq": event.get("seq"), "kind": event.get("kind"), "at": event.get("at"), "data": event.get("data")}
    return hashlib.sha256(previous.encode() + _canonical(body)).hexdigest()


def _signal_link(previous: str, signal: dict[str, Any]) -> str:
    # Keys of their own (no seq, no kind): a signal's body can never read as an event's.
    body = {"id": signal.get("id"), "name": signal.get("name"), "data": signal.get("data"),
            "sent_at": signal.get("sent_at")}
    return hashlib.sha256(previous.encode() + _canonical(body)).hexdigest()


def _sign(key: bytes, head: str) -> str:
    return hmac.new(key, head.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class PendingSignal:
    """A signal sent to the run and not yet consumed: ``id`` is its id where it was sent (the target
    gives it one of its own), ``data`` its JSON text as stored."""

    id: int
    name: str
    data: str
    sent_at: float


@dataclass(frozen=True)
class Savepoint:
    """A savepoint as read and verified: its name, the run's row fields, snapshot, journal and
    pending signals (oldest first; none from a version-1 file)."""

    name: str
    created_at: float
    run: dict[str, Any]
    snapshot: NewSnapshot | None
    events: list[NewEvent]
    head: str
    signed: bool
    signals: tuple[PendingSignal, ...] = ()

    @property
    def run_id(self) -> str:
        return self.run["run_id"]


def build_savepoint(name: str, rec: RunRecord, snapshot: SnapshotRecord | None, events: list[EventRecord], *,
                    now: float, agentsaga_version: str, key: bytes | None,
                    signals: list[PendingSignal] | tuple[PendingSignal, ...] = ()) -> dict[str, Any]:
    """The savepoint document of a run: ``events`` its whole journal, ``snapshot`` its newest verified
    one, ``signals`` its pending (sent, unconsumed) signals, oldest first."""
    if not isinstance(name, str) or not name.strip():
        raise SavepointError(f"a savepoint needs a name, got {name!r}")
    doc: dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "created_at": now,
        "agentsaga_version": agentsaga_version,
        "run": {f: getattr(rec, f) for f in _RUN_FIELDS},
        "snapshot": None if snapshot is None else {
            "seq": snapshot.seq, "state": snapshot.state, "sha256": snapshot.sha256,
            "schema_version": snapshot.schema_version, "trigger": snapshot.trigger, "created_at": snapshot.created_at},
        "events": [{"seq": e.seq, "kind": e.kind, "at": e.at, "data": e.data} for e in events],
    }
    doc["count"] = len(doc["events"])
    doc["signals"] = [{"id": s.id, "name": s.name, "data": s.data, "sent_at": s.sent_at} for s in signals]
    doc["signal_count"] = len(doc["signals"])
    link = doc["header"] = hashlib.sha256(_canonical(_header(doc))).hexdigest()
    for event in doc["events"]:
        link = event["link"] = _link(link, event)
    for signal in doc["signals"]:
        link = signal["link"] = _signal_link(link, signal)
    doc["head"] = link
    doc["signature"] = _sign(key, link) if key is not None else None
    return doc


def write_savepoint(path: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` compressed to ``path`` (a temporary file, fsynced, renamed into place: never half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    data = gzip.compress(_canonical(doc))
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # durable before the rename, and before an archive deletes the run
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SavepointError(f"cannot write savepoint {str(path)!r}: {exc.strerror or exc}") from None
    return path


#: the most bytes a savepoint may decompress to, unless the reader is given another bound: far above
#: any run's journal, and what the reader may hold in memory before it refuses a gzip bomb
MAX_BYTES = 256 * 1024 * 1024
_CHUNK = 1024 * 1024


def _decompress(path: Path, where: str, max_bytes: int) -> bytes:
    """The file's decompressed bytes, read a chunk at a time and refused past ``max_bytes`` (a file
    of a few kilobytes can decompress to gigabytes): memory never holds more than the bound."""
    parts: list[bytes] = []
    total = 0
    try:
        with open(path, "rb") as fh, gzip.GzipFile(fileobj=fh, mode="rb") as unzipped:
            while chunk := unzipped.read(_CHUNK):
                total += len(chunk)
                if total > max_bytes:
                    raise SavepointError(
                        f"{where} decompresses to more than {max_bytes:,} bytes, the most a savepoint may hold here: "
                        "refused before anything was written (a file that size is likely not a savepoint; if it is "
                        "one, raise the bound: restore --max-size, or restore(path, max_bytes=...))")
                parts.append(chunk)
    except IsADirectoryError:
        raise SavepointError(f"cannot read {where}: it is a directory, not a savepoint file") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise SavepointError(f"{where} is truncated or not a savepoint (it does not decompress: {exc})") from None
    except OSError as exc:
        raise SavepointError(f"cannot read {where}: {exc.strerror or exc}") from None
    return b"".join(parts)


def read_savepoint(path: Path, *, key: bytes | None, max_bytes: int | None = None) -> Savepoint:
    """Read, decompress and verify a savepoint file; ``SavepointError`` names what is wrong. The
    file may decompress to at most ``max_bytes`` (default ``MAX_BYTES``)."""
    where = f"savepoint {str(path)!r}"
    text = _decompress(Path(path), where, MAX_BYTES if max_bytes is None else max_bytes)
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SavepointError(f"{where} is truncated or damaged (its JSON does not parse: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SavepointError(f"{where} is not an agentsaga savepoint (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    version = doc.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise SavepointError(f"{where} has format version {version!r}; this agentsaga reads versions 1 to "
                             f"{FORMAT_VERSION} (a newer agentsaga wrote it: restore it with that version)")
    events = doc.get("events")
    run = doc.get("run")
    if not isinstance(events, list) or not isinstance(run, dict) or any(f not in run for f in _RUN_FIELDS):
        raise SavepointError(f"{where} is damaged: its run or events are missing")
    if version >= _SIGNALS_SINCE:
        signals = doc.get("signals")
        if not isinstance(signals, list):
            raise SavepointError(f"{where} is damaged: its signals are missing (a version-{version} savepoint "
                                 "carries the run's pending signals, even none)")
    elif "signals" in doc or "signal_count" in doc:
        raise SavepointError(f"{where} is damaged: it says format version {version}, which carries no signals, "
                             "but holds some")
    else:
        signals = []
    # The chain, first bad link named.
    if doc.get("count") != len(events):
        raise SavepointError(f"{where} holds {len(events)} events but its header says {doc.get('count')!r}: "
                             "it was truncated or events were removed")
    if version >= _SIGNALS_SINCE and doc.get("signal_count") != len(signals):
        raise SavepointError(f"{where} holds {len(signals)} signals but its header says {doc.get('signal_count')!r}: "
                             "it was truncated or signals were removed")
    link = hashlib.sha256(_canonical(_header(doc))).hexdigest()
    if doc.get("header") != link:
        raise SavepointError(f"{where}: hash chain broken at the header (name, run metadata or snapshot changed)")
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise SavepointError(f"{where}: event #{index + 1} is not an object")
        link = _link(link, event)
        if event.get("link") != link:
            raise SavepointError(f"{where}: hash chain broken at event seq {event.get('seq')!r} "
                                 f"(#{index + 1}): it was changed")
    for index, signal in enumerate(signals):
        if not isinstance(signal, dict):
            raise SavepointError(f"{where}: signal #{index + 1} is not an object")
        link = _signal_link(link, signal)
        if signal.get("link") != link:
            raise SavepointError(f"{where}: hash chain broken at signal #{index + 1} "
                                 f"({signal.get('name')!r}): it was changed")
    if doc.get("head") != link:
        raise SavepointError(f"{where}: hash chain broken at the head (it does not close the chain)")
    signature = doc.get("signature")
    if key is not None:
        if not signature:
            raise SavepointError(f"{where} is not signed, and a signing key is configured: refused")
        if not hmac.compare_digest(str(signature), _sign(key, link)):
            raise SavepointError(f"{where}: its signature does not match the configured signing key: refused")
    snapshot = None
    snap = doc.get("snapshot")
    try:
        if snap is not None:
            snapshot = NewSnapshot(seq=snap["seq"], state=snap["state"], sha256=snap["sha256"], trigger=snap["trigger"],
                                   created_at=snap["created_at"], schema_version=snap["schema_version"],
                                   workflow=run["workflow"], version=run["version"], fingerprint=run["fingerprint"])
        new_events = [NewEvent(seq=e["seq"], kind=e["kind"], data=e["data"], at=e["at"]) for e in events]
        pending = tuple(PendingSignal(id=s["id"], name=s["name"], data=s["data"], sent_at=s["sent_at"])
                        for s in signals)
    except (KeyError, TypeError) as exc:
        raise SavepointError(f"{where} is damaged: a record lacks {exc}") from None
    for index, signal in enumerate(pending):
        problem = _signal_problem(signal)
        if problem is None and index and signal.id <= pending[index - 1].id:
            problem = f"its id {signal.id} does not follow the previous one's ({pending[index - 1].id}): out of order"
        if problem is not None:
            raise SavepointError(f"{where}: signal #{index + 1} is damaged: {problem}")
    if [e.seq for e in new_events] != list(range(1, len(new_events) + 1)):
        raise SavepointError(f"{where}: its journal does not run from seq 1 without gaps")
    if snapshot is not None:
        problem = snapshot_problem(SnapshotRecord(snapshot.seq, snapshot.state, snapshot.sha256,
                                                  snapshot.schema_version, snapshot.trigger, snapshot.created_at))
        if problem is None and snap.get("kind", "full") != "full":
            problem = "it is not a full snapshot (a savepoint holds a self-contained one)"
        if problem is None and snapshot.schema_version != SNAPSHOT_SCHEMA:
            problem = f"layout {snapshot.schema_version}"
        if problem is not None or not 1 <= snapshot.seq <= len(new_events):
            raise SavepointError(f"{where}: its snapshot at seq {snapshot.seq} does not verify: {problem or 'outside the journal'}")
    return Savepoint(name=str(doc.get("name")), created_at=float(doc.get("created_at") or 0.0), run=run,
                     snapshot=snapshot, events=new_events, head=link, signed=bool(signature), signals=pending)


def _signal_problem(signal: PendingSignal) -> str | None:
    """What keeps a carried signal from being queued and received as it was sent, or None."""
    if not isinstance(signal.id, int) or isinstance(signal.id, bool):
        return f"its id is {signal.id!r}, not a whole number"
    if (problem := name_problem(signal.name)) is not None:
        return f"its name must be {problem}"
    if not isinstance(signal.sent_at, (int, float)) or isinstance(signal.sent_at, bool):
        return f"its sent_at is {signal.sent_at!r}, not a number"
    if not isinstance(signal.data, str):
        return "its data is not JSON text"
    try:
        json.loads(signal.data)
    except ValueError as exc:
        return f"its data is not JSON ({exc})"
    return None
