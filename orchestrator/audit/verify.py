"""``verify``: does a run's journal fold cleanly, and does every snapshot agree with it?

Invariant 2 says the journal alone is the truth and a snapshot is only an optimisation. Recovery
already skips a snapshot whose hash does not verify; ``verify`` goes further, because a hash only
proves a snapshot was not changed *after* it was written: a snapshot that was written wrong (a bug
in a reducer that is not deterministic, say) or re-hashed after tampering passes the hash check.
So every snapshot is also compared with the fold of the journal at its seq, field by field.

The rules, each reported with the seq it concerns:

- journal: seq 1 is ``RunStarted``; seqs have no gaps; every ``data`` is a JSON object; every event
  folds (a known kind with the fields its kind needs). The fold stops at the first event that
  does not, and snapshots after it cannot be compared (that is said too).
- snapshot: its layout version is the one this code writes; the sha256 of its text matches the
  stored hash; its text decodes to a run state; its seq is within the journal; and it equals the
  fold of events 1..seq. Without the workflow's code (it is not registered here; reading never
  imports it) the user state is folded with the reducers the run recorded: fields whose reducer is
  the workflow's own function, or every field of a run that predates the record, are left out of
  the comparison and a note names them; the scheduler fields are always compared, because folding
  them never calls user code.
- run row: when either the row or the journal says the run has ended, they say the same end.

An incremental snapshot is compared as the full state its chain rebuilds. One whose chain cannot be
rebuilt is still its raw link, no run state: it is reported once, with where its chain breaks, and a
note says it was not compared. Problems are listed journal first, then snapshots by seq, then the run.

Each snapshot's verdict (``VerifyReport.verdicts``) is what ``Audit.verify`` records in the
checkpoint catalog: ``verified``, ``failed`` or ``quarantined`` (see docs/checkpoints.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.payload import codec
from orchestrator.engine.snapshots import resolve_chains, snapshot_problem
from orchestrator.engine.events import TERMINAL_STATUSES
from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, apply
from store import EventRecord, SnapshotRecord

__all__ = ["VerifyProblem", "VerifyReport", "verify_journal"]

_MAX_DIFFERENCES = 20
_SUBJECT_ORDER = {"journal": 0, "snapshot": 1, "run": 2}


@dataclass(frozen=True, slots=True)
class VerifyProblem:
    """One thing that does not verify: where (``seq``), what kind (``subject``) and how."""

    subject: str  #: "journal", "snapshot" or "run"
    seq: int | None
    message: str
    differences: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "run"
        return f"{self.subject} {where}: {self.message}"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What ``orc.verify(run_id)`` found. ``ok`` is True when there are no problems."""

    run_id: str
    events: int
    snapshots: int
    snapshots_verified: int
    problems: tuple[VerifyProblem, ...] = ()
    notes: tuple[str, ...] = field(default=())
    #: ``(seq, validity, reason)`` per snapshot with a verdict: "verified" (hash and the whole fold
    #: agree), "failed" (its bytes do not verify or decode) or "quarantined" (intact bytes that
    #: disagree with the journal); a snapshot that could not be compared whole has none
    verdicts: tuple[tuple[int, str, str | None], ...] = ()
    #: whether the verdicts were recorded in the catalog: None when not asked (``mark=False``), False
    #: when the database refused the write (a read-only file or role); the report stands either way
    recorded: bool | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "ok": self.ok, "events": self.events, "snapshots": self.snapshots,
            "snapshots_verified": self.snapshots_verified,
            "problems": [{"subject": p.subject, "seq": p.seq, "message": p.message,
                          "differences": list(p.differences)} for p in self.problems],
            "notes": list(self.notes),
            "verdicts": [{"seq": seq, "validity": validity, "reason": reason}
                         for seq, validity, reason in self.verdicts],
            "recorded": self.recorded,
        }

    def lines(self) -> list[str]:
        """A human report: a verdict, then one line per problem (indented differences under it)."""
        verdict = "OK" if self.ok else f"FAILED ({len(self.problems)} problem{'s' * (len(self.problems) != 1)})"
        out = [f"run {self.run_id}: {verdict}: {self.events} events fold cleanly" if self.ok
               else f"run {self.run_id}: {verdict}",
               f"snapshots: {self.snapshots_verified} of {self.snapshots} verified (hash and fold)"]
        for problem in self.problems:
            out.append(f"  {problem}")
            out.extend(f"      {d}" for d in problem.differences)
        out.extend(f"note: {n}" for n in self.notes)
        return out


def verify_journal(
    run_id: str,
    events: Sequence[EventRecord],
    snapshots: Sequence[SnapshotRecord],
    *,
    reduce: Callable[[dict[str, Any], Mapping[str, Any]], None] | None = None,
    run_status: str | None = None,
    unknown_fields: frozenset[str] | None = frozenset(),
    key: bytes | None = None,
) -> VerifyReport:
    """Fold ``events`` and compare each snapshot with the fold at its seq (see the module doc).

    ``reduce`` is the merge of user state (the workflow's, or one rebuilt from the run's record);
    ``unknown_fields`` the state fields it cannot reproduce, left out of snapshot comparisons (None:
    all of them, as when ``reduce`` is None). ``run_status`` is the status stored on the run row,
    checked against the folded one. An incremental snapshot is compared as the full state its chain
    rebuilds; with a signing ``key`` an unsigned or wrongly signed snapshot does not verify.
    """
    problems: list[VerifyProblem] = []
    notes: list[str] = []
    if reduce is None:
        unknown_fields = None
    if unknown_fields is None:
        notes.append("the run's workflow is not registered here and the run does not record its reducers: "
                     "snapshots' user state was not compared; everything else was")
    elif unknown_fields:
        notes.append("the run's workflow is not registered here: state fields "
                     + ", ".join(sorted(unknown_fields)) + " were not compared (their reducers are the "
                     "workflow's own code); everything else was")
    resolved, chain_problems = resolve_chains(snapshots, key=key, run_id=run_id)
    pending = sorted(resolved, key=lambda s: s.seq)
    last = events[-1].seq if events else 0
    verified = 0
    # What the catalog should record about each snapshot (see ``VerifyReport.verdicts``).
    verdicts: dict[int, tuple[str, str | None]] = {}
    # An incremental whose chain cannot be rebuilt is still its raw link (a delta, not a run state):
    # its problem says why, and comparing the link with the fold would only list every field as a
    # difference, so it is reported once and not compared.
    unbuilt = [s.seq for s in pending if s.kind != "full"]  # in seq order
    for snap in pending:
        problem = chain_problems.get(snap.seq) or snapshot_problem(snap)
        if problem is not None:
            problems.append(VerifyProblem("snapshot", snap.seq, problem))
            verdicts[snap.seq] = ("failed", problem)
        if snap.seq > last or snap.seq < 1:
            outside = f"is at seq {snap.seq}, outside the journal (1..{last})"
            problems.append(VerifyProblem("snapshot", snap.seq, outside))
            verdicts.setdefault(snap.seq, ("quarantined", outside))
    by_seq = {s.seq: s for s in pending}
    bad_hash = {p.seq for p in problems}
    folded = RunState()
    stopped: int | None = None
    for index, event in enumerate(events):
        seq = event.seq
        if index == 0 and (seq != 1 or event.kind != EventKind.RUN_STARTED):
            problems.append(VerifyProblem("journal", seq, f"the journal must open with RunStarted at seq 1, "
                                                          f"found {event.kind} at seq {seq}"))
        try:
            data = codec.loads(event.data)
        except Exception as exc:  # not JSON, or a codec tag that does not decode (e.g. a bad Decimal)
            problems.append(VerifyProblem("journal", seq, f"{event.kind}: data does not decode: "
                                                          f"{type(exc).__name__}: {exc}"))
            stopped = seq
            break
        if not isinstance(data, dict):
            problems.append(VerifyProblem("journal", seq, f"{event.kind}: data is a {type(data).__name__}, "
                                                          "not a JSON object"))
            stopped = seq
            break
        try:
            if reduce is None:
                apply(folded, seq, event.kind, data)
            else:
                apply(folded, seq, event.kind, data, reduce)
        except Exception as exc:  # any failure to fold is the finding, whatever its type
            problems.append(VerifyProblem("journal", seq, f"{event.kind} does not fold: "
                                                          f"{type(exc).__name__}: {exc}"))
            stopped = seq
            break
        snap = by_seq.get(seq)
        if snap is not None and snap.kind == "full":  # an unbuilt link is not a run state
            found = _compare(snap, folded, unknown=unknown_fields)
            if found is not None:
                problems.append(found)
                undecodable = "does not decode" in found.message or "not a run state" in found.message
                verdicts.setdefault(seq, ("failed" if undecodable else "quarantined", found.message))
            elif seq not in bad_hash:
                verified += 1
                if unknown_fields is not None and not unknown_fields:  # compared whole: trusted
                    verdicts[seq] = ("verified", None)
    if unbuilt:
        many = len(unbuilt) != 1
        notes.append(f"snapshot{'s' * many} at seq {', '.join(map(str, unbuilt))} {'were' if many else 'was'} "
                     f"not compared with the fold: {'their chains' if many else 'its chain'} cannot be rebuilt")
    if stopped is not None:
        later = [s.seq for s in pending if s.seq >= stopped and s.kind == "full"]
        if later:
            notes.append(f"snapshots at seq {', '.join(map(str, later))} were not compared with the fold: "
                         f"it stopped at seq {stopped}")
    elif run_status is not None and events and folded.status != run_status and (
            folded.status in TERMINAL_STATUSES or run_status in TERMINAL_STATUSES):
        # Only an end is compared: between active statuses the row may lead its journal (a lease
        # taken marks a pending run running before its Resumed event is appended).
        problems.append(VerifyProblem("run", None, f"the run row's status is {run_status!r} but the journal "
                                                   f"folds to {folded.status!r}"))
    # The journal first, then the snapshots in seq order (a broken link after the snapshot that broke
    # its chain), then the run row; each snapshot's own problems keep the order they were found in.
    problems.sort(key=lambda p: (_SUBJECT_ORDER.get(p.subject, len(_SUBJECT_ORDER)), p.seq or 0))
    return VerifyReport(run_id=run_id, events=len(events), snapshots=len(pending), snapshots_verified=verified,
                        problems=tuple(problems), notes=tuple(notes),
                        verdicts=tuple((seq, *verdicts[seq]) for seq in sorted(verdicts)))


def _compare(snap: SnapshotRecord, folded: RunState, *, unknown: frozenset[str] | None) -> VerifyProblem | None:
    expected_text = codec.canonical_dumps(folded.to_json())
    if unknown is not None and not unknown and snap.state == expected_text:
        return None
    try:
        stored = codec.loads(snap.state)
    except Exception as exc:  # as for events: any failure to decode is the finding
        return VerifyProblem("snapshot", snap.seq, f"its state does not decode: {type(exc).__name__}: {exc}")
    expected = codec.loads(expected_text)
    if not isinstance(stored, dict):
        return VerifyProblem("snapshot", snap.seq, f"its state is a {type(stored).__name__}, not a run state")
    try:  # a snapshot written before a field was added reads with that field's default
        stored = codec.loads(codec.canonical_dumps(RunState.from_json(stored).to_json()))
    except TypeError:
        pass  # fields this version does not know: the diff below names them
    if unknown is None:
        stored = {k: v for k, v in stored.items() if k != "state"}
        expected.pop("state", None)
    elif unknown:
        for side in (stored, expected):
            if isinstance(side.get("state"), dict):
                side["state"] = {k: v for k, v in side["state"].items() if k not in unknown}
    differences = _diff(stored, expected, "")
    if not differences:
        return None
    shown = differences[:_MAX_DIFFERENCES]
    if len(differences) > _MAX_DIFFERENCES:
        shown.append(f"... and {len(differences) - _MAX_DIFFERENCES} more")
    return VerifyProblem("snapshot", snap.seq,
                         f"differs from the fold of the journal at seq {snap.seq} "
                         f"({len(differences)} difference{'s' * (len(differences) != 1)})", tuple(shown))


def _diff(stored: Any, expected: Any, path: str) -> list[str]:
    """Paths where the snapshot (``stored``) and the fold (``expected``) disagree."""
    if isinstance(stored, dict) and isinstance(expected, dict):
        out: list[str] = []
        for key in sorted(set(stored) | set(expected), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in expected:
                out.append(f"{where}: in the snapshot ({_show(stored[key])}), not in the journal's fold")
            elif key not in stored:
                out.append(f"{where}: missing from the snapshot (the fold has {_show(expected[key])})")
            else:
                out.extend(_diff(stored[key], expected[key], where))
        return out
    if isinstance(stored, list) and isinstance(expected, list) and len(stored) == len(expected):
        out = []
        for i, (a, b) in enumerate(zip(stored, expected)):
            out.extend(_diff(a, b, f"{path}[{i}]"))
        return out
    if stored == expected and type(stored) is type(expected):
        return []
    return [f"{path or '(root)'}: snapshot has {_show(stored)}, the journal folds to {_show(expected)}"]


def _show(value: Any, width: int = 80) -> str:
    try:
        text = codec.dumps(value)
    except Exception:  # a diff must never fail on the value it reports
        text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"
