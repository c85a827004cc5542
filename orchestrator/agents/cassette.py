"""Cassettes: the recorded responses of a run's durable calls, for replaying it with no network.

    cassette = Cassette.from_run(orc, "r1")                    # from a previous run's journal
    cassette.save("tests/cassettes/research.json")             # or keep it as a file
    replayer = Orchestrator(url, workflows=[agent], replay=Cassette.load("tests/cassettes/research.json"))
    replayer.run(agent, same_input)                            # model and tool calls answered from it

A recorded call is keyed by ``(step, visit, index)``: the step, how many times that step had
completed before in the run (so a loop's iterations are told apart), and the call's position within
the step execution: its number (``0``, ``1``...) or, for a call made inside another durable call (a
tool that asks a model), the dotted position the journal gives it (``"1.0"`` inside call 1).
Cassettes recorded before calls could nest hold numbers only and replay unchanged. Under replay a
call answered from the cassette is not performed, so the calls recorded inside it are not asked for. That is what the engine knows when a call is made, and it does not depend on
run ids, ticks or timestamps, so a replay under another run id (or another database) finds its
calls. The engine asks ``lookup(step, visit, index, kind, request)`` instead of performing the
call; the request it passes is already in journal form (redacted, through the codec), the same
form the cassette recorded, so they compare as plain values.

A request that differs from the recorded one means the code (a prompt, a parameter, the tools)
changed since the recording: ``ReplayMismatchError``, whose message is a unified diff of the two
requests as pretty-printed JSON. No recording at all: ``ReplayMissingError``. Either is better than
a replay that silently answers a different question with a recorded answer.

One key can hold several recordings: a step that failed for good and was reached again through a
failure route runs again with the same visit number. ``lookup`` answers with the first recording
whose request matches, and shows the diff against the latest one if none does. A rollback
restores the visit counts of its checkpoint (``RolledBack`` carries them), as the engine does.

The file format is versioned JSON: ``{"format": "agentsaga-cassette", "version": 1, "source",
"calls": [{"step", "visit", "index", "kind", "request", "response"}]}``, values in the journal's
codec (datetimes and bytes stay tagged), indented so a reviewer can read a diff of it.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.engine.context import position_parts
from orchestrator.payload import codec
from orchestrator.payload.redact import same_request
from orchestrator.errors import ReplayError, ReplayMismatchError, ReplayMissingError

__all__ = ["Cassette", "CASSETTE_FORMAT", "CASSETTE_VERSION"]

CASSETTE_FORMAT = "agentsaga-cassette"
CASSETTE_VERSION = 1
_DIFF_LINES = 200  # a diff longer than this is cut (the first lines show where it starts)

Key = tuple[str, int, str]  # (step, visit, position as text: "2", "1.0")


def _pretty(value: Any) -> list[str]:
    plain = json.loads(codec.dumps(value, what="a cassette request"))
    return json.dumps(plain, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def _position(index: Any, i: int) -> str:
    """A recorded call's position as text: ``3`` and ``"3"`` are the same call, ``"1.0"`` one inside call 1."""
    text = str(index)
    parts = text.split(".")
    if isinstance(index, bool) or not isinstance(index, (int, str)) or not all(p.isascii() and p.isdigit() for p in parts):
        raise ReplayError(f"cassette call #{i} has index {index!r}: a call number (3) or a dotted position (\"1.0\")")
    return ".".join(str(int(p)) for p in parts)


class Cassette:
    """Recorded durable-call responses, looked up by ``(step, visit, index)``."""

    def __init__(self, calls: Iterable[Mapping[str, Any]] = (), *, source: Mapping[str, Any] | None = None) -> None:
        self.source = dict(source or {})
        self._calls: dict[Key, list[dict[str, Any]]] = {}
        self._order: list[dict[str, Any]] = []
        for i, call in enumerate(calls):
            missing = {"step", "visit", "index", "kind", "request", "response"} - call.keys()
            if missing:
                raise ReplayError(f"cassette call #{i} lacks {', '.join(sorted(missing))}")
            entry = {k: call[k] for k in ("step", "visit", "index", "kind", "request", "response")}
            self._calls.setdefault((entry["step"], int(entry["visit"]), _position(entry["index"], i)),
                                   []).append(entry)
            self._order.append(entry)

    # -- building ----------------------------------------------------------------------------------
    @classmethod
    def from_run(cls, orc_or_store: Any, run_id: str) -> Cassette:
        """The durable calls a run journaled (``CallCompleted`` events), from an Orchestrator or a Store."""
        store = getattr(orc_or_store, "store", orc_or_store)
        record = store.get_run(run_id)  # RunNotFoundError for an unknown id
        visits: dict[str, int] = {}
        calls: list[dict[str, Any]] = []
        for event in store.events(run_id):
            if event.kind == "CallCompleted":
                data = codec.loads(event.data)
                calls.append({"step": data["step"], "visit": visits.get(data["step"], 0), "index": data["index"],
                              "kind": data["kind"], "request": data["request"], "response": data["response"]})
            elif event.kind == "StepCompleted":
                step = codec.loads(event.data)["step"]
                visits[step] = visits.get(step, 0) + 1
            elif event.kind == "RolledBack":
                restored = codec.loads(event.data).get("restore", {}).get("visits")
                if isinstance(restored, dict):
                    visits = {str(k): int(v) for k, v in restored.items()}
        return cls(calls, source={"run_id": run_id, "workflow": record.workflow, "version": record.version})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Cassette:
        """Read a cassette file written by ``save``."""
        p = Path(path)
        try:
            data = codec.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ReplayError(f"cassette {str(p)!r} cannot be read: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ReplayError(f"cassette {str(p)!r} is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != CASSETTE_FORMAT:
            raise ReplayError(f"{str(p)!r} is not an agentsaga cassette (no \"format\": {CASSETTE_FORMAT!r})")
        if data.get("version") != CASSETTE_VERSION:
            raise ReplayError(f"cassette {str(p)!r} has format version {data.get('version')!r}; this agentsaga "
                              f"reads version {CASSETTE_VERSION}")
        return cls(data.get("calls") or [], source=data.get("source"))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the cassette as JSON (to a temporary file renamed into place), making its folder
        if need be (``tests/cassettes/research.json`` in a fresh checkout)."""
        doc = {"format": CASSETTE_FORMAT, "version": CASSETTE_VERSION, "source": self.source, "calls": self._order}
        text = json.dumps(json.loads(codec.dumps(doc, what="cassette")), indent=1, ensure_ascii=False)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, target)
        return target

    # -- replaying -----------------------------------------------------------------------------------
    def lookup(self, step: str, visit: int, index: int | str, kind: str, request: Any) -> Any:
        """The recorded response to call ``index`` (its position: ``2``, or ``"1.0"`` inside call 1),
        or ``ReplayMismatchError`` / ``ReplayMissingError``."""
        where = f"step {step!r} (visit {visit}), {kind} call {index}"
        recorded = self._calls.get((step, visit, str(index)))
        if not recorded:
            held = sorted({(v, i) for (s, v, i) in self._calls if s == step},
                          key=lambda held: (held[0], position_parts(held[1])))
            known = (", ".join(f"visit {v} call {i}" for v, i in held[:20]) if held
                     else "no calls for that step")
            # A ctx.http response over the journal's limit was handed to the step live and never
            # journaled (docs/sagas.md), so a recording cannot hold it: say so where it may be why.
            why = ("; an http call whose response was over 1 MiB when recorded is never journaled, so no "
                   "cassette holds it" if kind == "http" else "")
            raise ReplayMissingError(f"replay: the cassette has no recording for {where}; it holds {known}{why}")
        for entry in recorded:
            if entry["kind"] == kind and same_request(entry["request"], request):
                return copy.deepcopy(entry["response"])
        latest = recorded[-1]
        if latest["kind"] != kind:
            raise ReplayMismatchError(f"replay: {where} was recorded as a {latest['kind']!r} call, "
                                      f"but the code made a {kind!r} call")
        diff = list(difflib.unified_diff(_pretty(latest["request"]), _pretty(request),
                                         fromfile="recorded request", tofile="request made now", lineterm=""))
        if len(diff) > _DIFF_LINES:
            diff = diff[:_DIFF_LINES] + [f"... ({len(diff) - _DIFF_LINES} more diff lines)"]
        raise ReplayMismatchError(f"replay: the request of {where} differs from the recorded one "
                                  "(did a prompt, a parameter or the tools change?):\n" + "\n".join(diff))

    # -- reading -------------------------------------------------------------------------------------
    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every recorded call, in journal order."""
        return copy.deepcopy(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __repr__(self) -> str:
        return f"<Cassette {len(self)} calls from {self.source.get('run_id', '?')!r}>"
