"""fold: the pure function from events to a run's state; the snapshot property (invariant 2)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import orchestrator.engine.durable  # noqa: F401  (registers the durable-call, wait and timer events with fold)
from orchestrator.engine import EventKind
from orchestrator.engine import apply, fold, RunState
from orchestrator.payload import loads as decode_json
from orchestrator.payload import canonical_dumps
from workflows import Workflow, reducers

STEPS = ["a", "b", "c", "d"]
wf = Workflow("prop", reducers={"log": reducers.append, "n": reducers.add})
reduce = wf.reduce


def started(start: list[str], state: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    return EventKind.RUN_STARTED, {"workflow": "prop", "input": state or {}, "start": start}


def completed(step: str, update: dict[str, Any], nxt: list[str], join: dict[str, list[str]] | None = None):
    data = {"step": step, "tick": 0, "attempt": 1, "input": {"state_at": 0}, "update": update, "next": nxt}
    if join:
        data["join"] = join
    return EventKind.STEP_COMPLETED, data


def numbered(events):
    return [(i + 1, kind, data) for i, (kind, data) in enumerate(events)]


def test_parallel_updates_merge_in_frontier_order_not_completion_order():
    # Given a tick with branches b and c that finish c first
    events = numbered([
        started(["b", "c"]),
        completed("c", {"log": "c", "who": "c"}, []),
        completed("b", {"log": "b", "who": "b"}, []),
    ])
    # When folded
    rs = fold(events, reduce)
    # Then updates were merged as b then c: frontier order
    assert rs.state["log"] == ["b", "c"]
    assert rs.state["who"] == "c"
    assert rs.frontier == [] and rs.tick == 1


def test_state_does_not_change_until_the_tick_completes():
    # Given one of two branches done
    rs = fold(numbered([started(["b", "c"], {"n": 1}), completed("b", {"n": 5}, ["d"])]), reduce)
    # Then the state is still the tick's input and b is recorded as done
    assert rs.state == {"n": 1}
    assert rs.pending == ["c"]


def test_join_waits_for_all_sources():
    # Given a -> [b, c]; b finishes in one tick, c takes two ticks; both join into d
    join = {"d": ["b", "c2"]}
    events = numbered([
        started(["a"]),
        completed("a", {}, ["b", "c"]),
        completed("b", {}, [], join),
        completed("c", {}, ["c2"]),
        completed("c2", {}, [], join),
    ])
    rs = fold(events[:4], reduce)
    # Then d is not scheduled after b alone
    assert rs.frontier == ["c2"] and rs.arrivals == {"d": ["b"]}
    # And it is once c2 arrives
    rs = fold(events, reduce)
    assert rs.frontier == ["d"] and rs.arrivals == {}


def test_failure_route_completes_the_step_and_records_the_error():
    events = numbered([
        started(["a"]),
        (EventKind.STEP_FAILED, {"step": "a", "attempt": 1, "error": {"type": "X", "message": "boom"}, "final": False}),
        (EventKind.STEP_FAILED, {"step": "a", "attempt": 2, "error": {"type": "X", "message": "boom"}, "final": True,
                         "route": "b"}),
    ])
    rs = fold(events[:2], reduce)
    assert rs.failures == {"a": 1}
    rs = fold(events, reduce)
    assert rs.frontier == ["b"]
    assert rs.routed_errors["b"]["message"] == "boom"


def test_a_retried_saga_stands_for_the_error_its_event_carries_and_an_older_event_folds_as_before():
    # Given a saga started by a declined payment whose compensation failed
    saga = [
        started(["a"]),
        (EventKind.SAGA_STARTED, {"reason": "failure", "after_seq": 0, "step": "pay",
                                  "error": {"type": "PermissionError", "message": "declined"}}),
        (EventKind.SAGA_FAILED, {"step": "book", "error": {"type": "RuntimeError", "message": "down"}}),
    ]
    # When it is retried: by this version (the event carries the saga's error), or by one before it
    now = fold(numbered([*saga, (EventKind.SAGA_RETRIED, {"by": "w", "error": {"type": "PermissionError",
                                                                                 "message": "declined"}})]), reduce)
    before = fold(numbered([*saga, (EventKind.SAGA_RETRIED, {"by": "w"})]), reduce)
    # Then the run stands again for the declined payment; an older journal folds as it did when it
    # was written (so the snapshots made from it still verify)
    assert (now.status, now.error) == ("compensating", {"type": "PermissionError", "message": "declined"})
    assert (before.status, before.error) == ("compensating", {"type": "RuntimeError", "message": "compensating 'book': down"})


def test_a_gap_in_the_journal_is_refused():
    rs = RunState()
    apply(rs, 1, *started(["a"]), reduce)
    try:
        apply(rs, 3, *completed("a", {}, []), reduce)
    except ValueError as exc:
        assert "expected seq 2" in str(exc)
    else:
        raise AssertionError("a gap was folded")


# -- the property -------------------------------------------------------------------------------
values = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none())


@st.composite
def histories(draw):
    """A valid event history: ticks whose steps complete in any order, with failures and joins."""
    events = [started(draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=3, unique=True)),
                      {"n": 0})]
    frontier = list(events[0][1]["start"])
    for _ in range(draw(st.integers(0, 8))):
        if not frontier:
            break
        order = draw(st.permutations(frontier))
        nxt: list[str] = []
        for step in order:
            # Things journaled inside a step before it completes: durable calls, waits, signals,
            # timers, a takeover by another process.
            for index in range(draw(st.integers(0, 2))):
                events.append(("CallCompleted", {"step": step, "tick": 0, "index": index, "kind": "llm",
                                                  "request": {"p": index}, "response": draw(values)}))
            if draw(st.booleans()):
                events.append(("WaitStarted", {"step": step, "tick": 0, "name": "ok", "timeout_at": None}))
                events.append((EventKind.RESUMED, {"owner": "w2", "lease": 2, "snapshot_seq": 0, "replayed": 0}))
                events.append(("SignalReceived", {"step": step, "tick": 0, "name": "ok", "data": draw(values),
                                                   "signal": 1, "sent_at": 0.0}))
            if draw(st.booleans()):
                events.append(("TimerStarted", {"step": step, "tick": 0, "index": 0, "wake_at": 5.0}))
                events.append((EventKind.RESUMED, {"owner": "w3", "lease": 3, "snapshot_seq": 0, "replayed": 0}))
            for _ in range(draw(st.integers(0, 2))):
                events.append((EventKind.STEP_FAILED, {"step": step, "attempt": 1, "final": False,
                                               "error": {"type": "E", "message": "x"}}))
            update = draw(st.dictionaries(st.sampled_from(["log", "n", "k", "m"]), values, max_size=3))
            if "n" in update and not isinstance(update["n"], int):
                update["n"] = 1
            targets = draw(st.lists(st.sampled_from(STEPS), max_size=2, unique=True))
            join = {"d": ["a", "b"]} if step in ("a", "b") and draw(st.booleans()) else None
            events.append(completed(step, update, targets, join))
            nxt.extend(t for t in targets if t not in nxt)
        frontier = nxt
    return numbered(events)


@settings(max_examples=200, deadline=None)
@given(histories(), st.data())
def test_fold_of_snapshot_plus_later_events_equals_fold_of_all(events, data):
    # Given any history and any cut point n
    n = data.draw(st.integers(1, len(events)))
    full = fold(events, reduce)
    # When a snapshot is taken at n (through the journal's JSON text, as the store keeps it)
    text = canonical_dumps(fold(events[:n], reduce).to_json())
    restored = RunState.from_json(decode_json(text))
    # Then folding the events after n onto it gives exactly the full fold
    assert fold(events[n:], reduce, start=restored).to_json() == full.to_json()


def test_a_cancelled_attempt_is_withdrawn_only_when_its_function_never_ran():
    # Given an effect's intent, then its attempt cancelled before or after its function was called
    intent = (EventKind.STEP_STARTED, {"step": "a", "tick": 0, "attempt": 1, "key": "r:a:0"})

    def cancelled(called: bool):
        return (EventKind.STEP_CANCELLED, {"step": "a", "tick": 0, "attempt": 1, "called": called, "key_left": False})

    before = fold(numbered([started(["a"]), intent, cancelled(False)]), reduce)
    after = fold(numbered([started(["a"]), intent, cancelled(True)]), reduce)
    # Then before: nothing is in flight and no attempt failed; after: the intent stays in doubt
    assert before.in_flight == {} and before.failures == {}
    assert after.in_flight["a"]["cancelled"] is True and after.failures == {}
    # and a snapshot of either folds back to the same state (invariant 2)
    for state in (before, after):
        assert RunState.from_json(decode_json(canonical_dumps(state.to_json()))).to_json() == state.to_json()


def test_a_final_failure_in_doubt_is_recorded_and_its_intent_ends():
    # Given an effect whose key left, then whose step failed for good with a doubt
    events = numbered([
        started(["a"]),
        (EventKind.STEP_STARTED, {"step": "a", "tick": 0, "attempt": 1, "key": "r:a:0"}),
        (EventKind.KEY_ISSUED, {"step": "a", "tick": 0, "attempt": 1}),
        (EventKind.STEP_FAILED, {"step": "a", "tick": 0, "attempt": 1, "error": {"type": "X", "message": "500"},
                                 "final": True, "doubt": {"key": "r:a:0", "reason": "its key had left"}}),
        (EventKind.RUN_FAILED, {"step": "a", "error": {"type": "InDoubtError", "message": "m"}}),
    ])
    run = fold(events, reduce)
    # Then the doubt is kept (with its seq), nothing stays in flight, and a snapshot folds back to it
    assert run.doubts == [{"seq": 4, "step": "a", "key": "r:a:0", "tick": 0, "reason": "its key had left"}]
    assert run.in_flight == {} and run.issued == {} and run.status == "failed"
    assert RunState.from_json(decode_json(canonical_dumps(run.to_json()))).to_json() == run.to_json()
    # and a run with none writes no "doubts" in its snapshots (those made before the field compare equal)
    assert "doubts" not in fold(events[:3], reduce).to_json()
