"""Reading a run's state without its workflow's code (invariant 11).

``agentsaga show``, ``history``, ``verify``, ``report`` and ``orc.result`` on a run whose workflow is
not registered must still show a state that is right, without importing anything. Three things
make that possible:

- the newest snapshot that verifies holds the state exactly as the driving process folded it,
  with the workflow's own reducers; only the events after it need folding here;
- ``RunStarted`` records the kind of each field's reducer (``"reducers": [[field, kind], ...]``,
  see ``recorded_reducers``). The built-in ones (``append``, ``extend``, ``add``, ``merge`` from
  ``workflows.reducers``) are library code and are applied as recorded; a field whose reducer is
  the workflow's own function (``custom``) is merged by replacement, and so are all fields of a run
  started before reducers were recorded;
- the reading says what it did (``StateReading.describe``): "state from snapshot at seq 40 + 3
  events", and, when a field was merged without its reducer, "folded without reducers: fields
  merged by replacement: notes". A reader never guesses silently.

Nothing here calls user code, takes a lease or writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import Reduce, RunState
from orchestrator.engine.snapshots import restore_run
from orchestrator.payload import codec
from store import Store
from workflows import Workflow
from workflows.reducers import MISSING, add, append, extend, merge, replace

__all__ = ["StateReading", "RecordedReduce", "recorded_reducers", "reduce_for", "read_state"]

_BUILTIN = {"append": append, "extend": extend, "add": add, "merge": merge}


def recorded_reducers(wf: Workflow) -> list[list[str]]:
    """``[[field, kind], ...]`` for the fields whose reducer is not ``replace``: a built-in's name, or
    ``"custom"``. Journaled in ``RunStarted`` (always, ``[]`` included: an empty list says every
    field is replaced, which a reader can then reproduce exactly); a list of pairs rather than an
    object, so that a field called ``password`` is not taken for a secret by the redactor."""
    out = []
    for name, fn in sorted(wf.reducers.items()):
        if fn is replace:
            continue
        kind = next((k for k, builtin in _BUILTIN.items() if fn is builtin), "custom")
        out.append([name, kind])
    return out


class RecordedReduce:
    """A ``reduce`` from the reducer kinds a run recorded, noting the fields it had to replace.

    ``recorded`` is the ``reducers`` list of ``RunStarted``, or None when the run predates it (then
    every field is merged by replacement and counted as such)."""

    def __init__(self, recorded: list[Any] | None) -> None:
        self.recorded = recorded is not None
        self._fns: dict[str, Any] = {}
        self._custom: set[str] = set()
        for pair in recorded or ():
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str):
                fn = _BUILTIN.get(pair[1])
                if fn is None:
                    self._custom.add(pair[0])
                else:
                    self._fns[pair[0]] = fn
        #: fields merged by replacement although their reducer is unknown here
        self.replaced: set[str] = set()

    @property
    def unknown(self) -> frozenset[str] | None:
        """Fields whose merge this reduce cannot reproduce (None: any field, nothing was recorded)."""
        return frozenset(self._custom) if self.recorded else None

    def __call__(self, state: dict[str, Any], update: Mapping[str, Any]) -> None:
        for key, value in update.items():
            fn = self._fns.get(key)
            if fn is None:
                if not self.recorded or key in self._custom:
                    self.replaced.add(key)
                state[key] = value
            else:
                state[key] = fn(state.get(key, MISSING), value)


def reduce_for(store: Store, run_id: str) -> RecordedReduce:
    """The recorded reduce of a run (from its ``RunStarted``)."""
    first = store.events(run_id, after_seq=0, until_seq=1)
    recorded = None
    if first and first[0].kind == EventKind.RUN_STARTED:
        try:
            data = codec.loads(first[0].data)
        except ValueError:
            data = {}
        if isinstance(data, dict):
            # Absent from runs started before reducers were recorded: every field is then unknown.
            recorded = data.get("reducers")
    return RecordedReduce(recorded if isinstance(recorded, list) else None)


@dataclass(frozen=True, slots=True)
class StateReading:
    """A run's state and where it came from."""

    folded: RunState
    snapshot_seq: int  #: the snapshot the state started from (0: folded from the first event)
    replayed: int  #: events folded after it
    rejected: tuple[tuple[int, str], ...]  #: snapshots skipped because they did not verify
    with_code: bool  #: folded with the registered workflow's reducers
    replaced: tuple[str, ...] = ()  #: fields merged by replacement without their reducer

    def describe(self) -> str:
        where = (f"state from snapshot at seq {self.snapshot_seq} + {self.replayed} events" if self.snapshot_seq
                 else f"state folded from all {self.replayed} events (no snapshot verified)")
        if self.rejected:
            where += f" ({len(self.rejected)} snapshot(s) skipped: they do not verify)"
        if self.with_code:
            return where
        if self.replaced:
            return where + "; folded without reducers: fields merged by replacement: " + ", ".join(self.replaced)
        return where + "; folded without the workflow's code (no field needed its reducer)"


def read_state(store: Store, run_id: str, wf: Workflow | None, *, key: bytes | None = None) -> StateReading:
    """The run's state from its newest verified snapshot and the events after it, with ``wf``'s
    reducers when it is registered, else with the run's recorded reducers (see the module doc)."""
    reduce: Reduce
    recorded = None
    if wf is not None:
        reduce = wf.reduce
    else:
        recorded = reduce_for(store, run_id)
        reduce = recorded
    folded, snap_seq, rejected = restore_run(store, run_id, reduce, key=key)
    return StateReading(folded=folded, snapshot_seq=snap_seq, replayed=folded.seq - snap_seq,
                        rejected=tuple(rejected), with_code=wf is not None,
                        replaced=tuple(sorted(recorded.replaced)) if recorded is not None else ())
