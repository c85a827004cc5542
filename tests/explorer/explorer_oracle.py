"""The explorer's oracles on the journal and the ledger: invariants 1-5, and the default in-doubt rule.

``invariant_problems`` holds any outcome (one crash, two crashes, any variant) to invariants 1-5
read off the journal and the booking service's ledger, besides what the processes saw as they went
(``World.violations``: a completed step starting again, a router asked again, a request leaving
before its intent or its key's issue was journaled, a compensation sent after it was confirmed):

1. no (step, tick, rollback epoch) is completed twice in the journal;
2. at each death and at the end, every stored snapshot folded with the events after it, and the
   state recovery restores (``restore_run``: the newest snapshot that verifies plus the tail),
   equal the fold of the whole journal; journal seqs are 1..n;
3. every step event (a start, a key's issue, a durable call, a wait, a completion, a failure) names
   a step of the frontier that the journaled routing decisions had scheduled at that point, in that
   tick, and not yet completed;
4. every attempt of one step execution journals the same key; every booking in the ledger was made
   with the key of an intent in the journal (or one of its request keys, ``key:i``), and every
   request for one booking (the booking and its replays) carried one key;
5. no effect has two ``CompensationCompleted``, no booking is cancelled twice, and a saga's
   cancellations come newest first.

``doubtful`` reads the default rule (docs/sagas.md, "In-doubt effects") off a journal as a dead
process left it: the effect steps whose intent (``StepStarted`` with its key) is durable, whose
execution is still open, and whose key was never journaled as issued (``KeyIssued``, in this attempt
or an earlier one of the same execution). Exactly those must be failed with ``InDoubtError``; a
crash before the intent was durable, or once the key had been issued, must not give that verdict.
``doubt_problems`` holds an outcome of the default variant to it.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from orchestrator.engine.fold import RunState, apply, fold
from orchestrator.engine.snapshots import resolve_chains, restore_run
from orchestrator.payload import codec
from store import RunNotFoundError

IN_DOUBT = "orchestrator.errors.InDoubtError"
#: events that belong to one step of the current tick (their ``step`` must be pending in the frontier)
STEP_EVENTS = ("StepStarted", "KeyIssued", "StepCompleted", "StepFailed", "CallCompleted", "CallFailed",
               "WaitStarted", "SignalReceived", "TimerStarted")


# -- invariant 2, read from the store while it is open ---------------------------------------------------
def fold_problems(store: Any, run_id: str, workflow: Any, when: str) -> list[str]:
    """Invariant 2 on the run as it stands in ``store``: every snapshot + the events after it, and what
    recovery restores, fold to the same state as the whole journal; seqs are 1..n."""
    try:
        events = [(e.seq, e.kind, codec.loads(e.data)) for e in store.events(run_id)]
    except RunNotFoundError:
        return []
    problems = []
    seqs = [seq for seq, _, _ in events]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"{when}: the journal's seqs are not 1..n: {seqs}")
        return problems
    whole = fold(events, workflow.reduce).to_json()
    snapshots, broken = resolve_chains(store.snapshots(run_id), run_id=run_id)
    for snap in snapshots:
        if snap.seq in broken:
            problems.append(f"{when}: the snapshot at seq {snap.seq} does not verify: {broken[snap.seq]}")
            continue
        start = RunState.from_json(json.loads(snap.state))
        tail = [e for e in events if e[0] > snap.seq]
        if fold(tail, workflow.reduce, start=start).to_json() != whole:
            problems.append(f"{when}: fold(snapshot at seq {snap.seq} + the events after it) != fold(all events)")
    restored, at, rejected = restore_run(store, run_id, workflow.reduce)
    if restored.to_json() != whole:
        problems.append(f"{when}: recovery restores (snapshot at seq {at} + tail) a state other than fold(all events)")
    if rejected:
        problems.append(f"{when}: recovery rejected snapshots {rejected}")
    return problems


# -- invariants 1-5 on the journal and the ledger ------------------------------------------------------
def _step_of(key: str | None, run_id: str) -> str | None:
    """The step a key (``run:step:tick...``) belongs to, if it is one of this run's."""
    if not key or not key.startswith(run_id + ":"):
        return None
    return key[len(run_id) + 1:].split(":")[0]


def invariant_problems(history: list[dict[str, Any]], ledger: list[dict[str, Any]], workflow: Any,
                       run_id: str) -> list[str]:
    """What in the final journal (``orc.history``) and the service's ledger breaks invariants 1, 3, 4, 5."""
    problems = []
    # 1. no step execution completed twice
    epoch = 0
    completed: Counter[tuple[str, int, int]] = Counter()
    for e in history:
        if e["kind"] == "RolledBack":
            epoch += 1
        elif e["kind"] == "StepCompleted":
            completed[(e["data"]["step"], e["data"]["tick"], epoch)] += 1
    for (step, tick, ep), n in completed.items():
        if n > 1:
            problems.append(f"step {step!r} (tick {tick}, epoch {ep}) completed {n} times in the journal (invariant 1)")
    # 3. every step event belongs to a step the journaled routing had scheduled, not yet completed
    run = RunState()
    for e in history:
        data = e["data"]
        if e["kind"] in STEP_EVENTS:
            step = data["step"]
            if step not in run.frontier or step in run.done:
                problems.append(f"seq {e['seq']} {e['kind']} of {step!r}: not a pending step of the journaled frontier "
                                f"{run.frontier} (done: {sorted(run.done)}) (invariant 3)")
            elif data.get("tick", run.tick) != run.tick:
                problems.append(f"seq {e['seq']} {e['kind']} of {step!r} is for tick {data['tick']}, the journal's "
                                f"tick is {run.tick} (invariant 3)")
        if e["kind"] == "StepCompleted" and not isinstance(data.get("next"), list):
            problems.append(f"seq {e['seq']} StepCompleted of {data['step']!r} carries no routing decision "
                            "(invariant 3)")
        try:
            apply(run, e["seq"], e["kind"], data, workflow.reduce)
        except Exception as exc:  # noqa: BLE001 - said as a problem, with the event
            problems.append(f"seq {e['seq']} {e['kind']} does not fold: {type(exc).__name__}: {exc}")
            break
    # 4. one key per step execution; every booking made with an intent's key, one key per booking
    epoch = 0
    keys: dict[tuple[str, int, int], set[str]] = {}
    intents: set[str] = set()
    for e in history:
        if e["kind"] == "RolledBack":
            epoch += 1
        elif e["kind"] == "StepStarted" and e["data"].get("key") is not None:
            d = e["data"]
            keys.setdefault((d["step"], d["tick"], epoch), set()).add(d["key"])
            intents.add(d["key"])
    for (step, tick, ep), ks in keys.items():
        if len(ks) > 1:
            problems.append(f"step {step!r} (tick {tick}, epoch {ep}) journaled several keys {sorted(ks)} "
                            "(invariant 4)")
    effect_steps = {n for n, s in workflow.steps.items() if s.effect}
    by_id: dict[str, set[str | None]] = {}
    # (a cancellation's replay names the booking too: it is told apart by its key)
    cancel_keys = {e.get("idempotency_key") for e in ledger if e["action"] in ("cancel", "cancel_repeat")}
    for entry in ledger:
        if entry["action"] == "book" or (entry["action"] == "replay" and entry.get("id") is not None
                                         and entry.get("idempotency_key") not in cancel_keys):
            by_id.setdefault(entry["id"], set()).add(entry.get("idempotency_key"))
        if entry["action"] != "book":
            continue
        key = entry.get("idempotency_key") or ""
        step = _step_of(key, run_id)
        if step in effect_steps and not any(key == k or key.startswith(f"{k}:") for k in intents):
            problems.append(f"booking {entry['id']} {entry['body']} was made with key {key!r}, which no "
                            "journaled intent carries (invariant 4)")
    for booking, ks in by_id.items():
        if len(ks) > 1:
            problems.append(f"booking {booking} was requested with several keys {sorted(map(str, ks))} (invariant 4)")
    problems += big_answer_problems(history, ledger, run_id)
    # 5. each effect compensated at most once, newest first
    done = Counter(e["data"]["effect"] for e in history if e["kind"] == "CompensationCompleted")
    for seq, n in done.items():
        if n > 1:
            problems.append(f"the effect journaled at seq {seq} was compensated {n} times (invariant 5)")
    cancels = Counter(e["id"] for e in ledger if e["action"] == "cancel")
    for booking, n in cancels.items():
        if n > 1:
            problems.append(f"{booking} was cancelled {n} times (invariant 5)")
    saga: list[int] = []
    for e in history:
        if e["kind"] == "SagaStarted":
            saga = []
        elif e["kind"] == "CompensationCompleted":
            saga.append(e["data"]["effect"])
            if saga != sorted(saga, reverse=True):
                problems.append(f"a saga compensated the effects at seqs {saga}: not newest first (invariant 5)")
    return problems


# -- answers too large to journal --------------------------------------------------------------------
def big_answer_problems(history: list[dict[str, Any]], ledger: list[dict[str, Any]], run_id: str) -> list[str]:
    """A ``ctx.http`` answer over 1 MiB (the service's ``GET /catalog/PART``, a ``fetch`` in its ledger)
    is no call of the journal: no ``CallCompleted`` or ``CallFailed`` records it. The step that made it
    fetches it again whenever it runs again, and every send of one request carries the same key: its
    position's (invariant 4: a request is re-sent with its key, never under a new one). For an effect
    step, that key extends the intent's journaled key."""
    problems = []
    for e in history:
        if e["kind"] in ("CallCompleted", "CallFailed") and "/catalog/" in json.dumps(e["data"]):
            problems.append(f"seq {e['seq']} {e['kind']} of {e['data'].get('step')!r} journals a call whose answer "
                            "is over 1 MiB: such a call is made live and journaled as none")
    intents = {e["data"]["key"] for e in history if e["kind"] == "StepStarted" and e["data"].get("key")}
    sent: dict[str, list[str | None]] = {}
    for entry in ledger:
        if entry["action"] == "fetch":
            sent.setdefault(entry["part"], []).append(entry.get("idempotency_key"))
    for part, keys in sent.items():
        if len(set(keys)) > 1:
            problems.append(f"the big answer {part!r} was requested with several keys {keys}: a re-send must carry "
                            "the key of the first (invariant 4)")
        key = keys[0] or ""
        step = _step_of(key, run_id)
        if step is None:
            problems.append(f"the big answer {part!r} was requested with key {keys[0]!r}, not one of the run's")
        elif any(e["kind"] == "StepStarted" and e["data"]["step"] == step and e["data"].get("key")
                 for e in history) and not any(key.startswith(f"{k}:") or key == k for k in intents):
            problems.append(f"the big answer {part!r} of the effect {step!r} was requested with key {key!r}, "
                            "which no journaled intent carries (invariant 4)")
    return problems


def http_positions(history: list[dict[str, Any]]) -> list[tuple[str, int, int, str, str]]:
    """Where each journaled HTTP call sits: (step, tick, rollback epoch, position, path), sorted."""
    epoch, out = 0, []
    for e in history:
        if e["kind"] == "RolledBack":
            epoch += 1
        elif e["kind"] == "CallCompleted" and e["data"].get("kind") == "http":
            d = e["data"]
            url = (d.get("response") or {}).get("url") or ""
            path = "/" + url.split("://", 1)[-1].partition("/")[2]
            out.append((d["step"], d["tick"], epoch, str(d["index"]), path))
    return sorted(out)


# -- the default in-doubt rule -------------------------------------------------------------------------
def doubtful(journal: list[dict[str, Any]]) -> dict[str, str]:
    """The effect steps the default rule must fail as in doubt, given the journal a dead process left
    (step -> its key): intent durable, execution open, key never journaled as issued in it."""
    open_: dict[str, dict[str, Any]] = {}
    issued: dict[str, set[str]] = {}
    for e in journal:
        kind, data = e["kind"], e["data"]
        step = data.get("step")
        if kind == "StepStarted" and data.get("key") is not None:
            open_[step] = {"key": data["key"], "issued": data["key"] in issued.get(step, set())}
        elif kind == "KeyIssued" and step in open_:
            open_[step]["issued"] = True
            issued.setdefault(step, set()).add(open_[step]["key"])
        elif kind == "StepCompleted":
            open_.pop(step, None)
            issued.pop(step, None)
        elif kind == "StepFailed":
            if not data.get("in_doubt"):
                open_.pop(step, None)
            if data.get("final"):
                open_.pop(step, None)
                issued.pop(step, None)
        elif kind == "RolledBack":
            open_.clear()
            issued.clear()
    return {step: intent["key"] for step, intent in open_.items() if not intent["issued"]}


def in_doubt_failures(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The final ``StepFailed`` events whose error is ``InDoubtError``."""
    return [e["data"] for e in history
            if e["kind"] == "StepFailed" and e["data"].get("final") and e["data"]["error"]["type"] == IN_DOUBT]


def doubt_problems(outcome: Any, reference: Any, flow: Any) -> list[str] | None:
    """The default rule's verdict against what the deaths left: None when no effect was left in doubt
    (the outcome must then be the reference's, checked elsewhere), else what is wrong with the
    in-doubt ending (empty: nothing)."""
    expected: set[str] = set()
    for journal in outcome.deaths:
        expected |= set(doubtful(journal))
    failures = in_doubt_failures(outcome.history)
    named = {f["step"] for f in failures}
    if not expected:
        if failures:
            return [f"{sorted(named)} failed as in doubt, but no death left an effect's intent durable with its key "
                    "not yet issued: the effect was re-sent or settled, or never begun"]
        return None
    problems = []
    if not failures:
        problems.append(f"{sorted(expected)} had their intent durable and their key not issued when a process "
                        f"died, and none was failed as in doubt: {outcome.result.status} {outcome.result.error}")
    if named - expected:
        problems.append(f"{sorted(named - expected)} failed as in doubt; only {sorted(expected)} were")
    result = outcome.result
    routed = [f for f in failures if f.get("route")]
    ref_booked = sorted(_body(e) for e in reference.ledger if e["action"] == "book")
    booked = sorted(_body(e) for e in outcome.ledger if e["action"] == "book")
    keys = {step: key for journal in outcome.deaths for step, key in doubtful(journal).items()}
    reached = [e for e in outcome.ledger for step in named if step in keys
               and ((e.get("idempotency_key") or "") + ":").startswith(keys[step] + ":")]
    if reached:
        # (with ctx.http the key is issued before the first request leaves: a step in doubt sent nothing)
        problems.append(f"a step failed as in doubt had reached the service: {reached}")
    if not set(booked) <= set(ref_booked):
        problems.append(f"bookings {booked} are not among the reference's {ref_booked}")
    if routed:
        # The failure route was taken: the run goes on along it to the reference's end, the route's
        # step seeing InDoubtError as the error that led there.
        if result.status != reference.result.status:
            problems.append(f"the in-doubt failure took its route, and the run ended {result.status} "
                            f"({result.error}), not {reference.result.status}")
        else:
            want = flow.doubt_routed(reference.result.state, routed[0]["step"])
            got = json.loads(json.dumps(result.state).replace(result.run_id, "RUN"))
            if got != json.loads(json.dumps(want).replace(reference.result.run_id, "RUN")):
                problems.append(f"after the in-doubt failure's route the state is {result.state}, expected {want}")
        return problems
    # No route: the run fails, compensating the effects it completed (docs/sagas.md).
    if result.status not in ("failed", "compensated"):
        problems.append(f"the run ended {result.status}, not failed or compensated, after {sorted(named)} was in doubt")
    if not result.error or not any(repr(step) in result.error for step in named):
        problems.append(f"the run's error does not name the step in doubt {sorted(named)}: {result.error}")
    made = [e for e in outcome.history if e["kind"] == "StepCompleted" and e["data"].get("compensable")]
    undone = {e["data"]["effect"] for e in outcome.history if e["kind"] == "CompensationCompleted"}
    left = [e["data"]["step"] for e in made if e["seq"] not in undone]
    if left:
        problems.append(f"the compensable effects of {left} were not compensated after the run failed in doubt")
    cancels = Counter(e["id"] for e in outcome.ledger if e["action"] == "cancel")
    compensable = {e["data"]["step"] for e in made}
    for entry in outcome.ledger:
        step = _step_of(entry.get("idempotency_key"), result.run_id)
        if entry["action"] == "book" and step in compensable and cancels[entry["id"]] != 1:
            problems.append(f"booking {entry['id']} of {step!r} was cancelled {cancels[entry['id']]} times, not once")
    return problems


def _body(entry: dict[str, Any]) -> str:
    return f"{entry['kind']} {json.dumps(entry.get('body'), sort_keys=True)}"


def rule_points(points: list[str]) -> list[int]:
    """The crash points (1-based) of a run at which a death leaves an effect's intent open (its
    ``StepStarted`` durable, its completion or failure not): where the in-doubt rule decides what the
    successor does. Read off the points' labels (``after append[StepStarted:pay]``...)."""
    open_: set[str] = set()
    out = []
    for k, label in enumerate(points, 1):
        if label.startswith("after append["):
            for item in label[len("after append["):label.rindex("]")].split(", "):
                kind, _, step = item.partition(":")
                if kind == "StepStarted":
                    open_.add(step)
                elif kind in ("StepCompleted", "StepFailed"):
                    open_.discard(step)
        if open_:
            out.append(k)
    return out
