"""Which seqs a rollback may return to (docs/sagas.md "Rollback to a checkpoint"), over every seq.

A rollback point is a seq between ticks whose state holds only effects still in force
(``orchestrator/engine/rollback.py``). These tests do not hand-pick seqs: they roll a journaled run
back to each of its seqs in turn, and check that every seq is either accepted, after which the run
goes on to a consistent end (its effects in force are exactly those its state holds, none undone
twice, the journal verifies), or refused with a message naming the run, the seq, its event and the
nearest points, and nothing appended or called.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator import Orchestrator, RunStateError
from workflows import END, Retry, Workflow

sys.path.insert(0, str(Path(__file__).parent))

from ledger_helpers import Ledger  # noqa: E402


def trip(ledger: Ledger) -> Workflow:
    """An effect step, a parallel tick (one branch failing its first attempt) joined into a step that
    waits for a person's approval, then a second effect (which fails on a declined card)."""
    wf = Workflow("trip")

    def cancel(ctx, effect):
        ledger.cancel(next(iter(effect.result.values())))

    @wf.step(start=True, effect=True, compensate=cancel)
    def book_flight(ctx, state):
        return {"flight": ledger.book("flight", ctx.idempotency_key)}

    @wf.step(retry=Retry(attempts=2, initial=0, jitter=0))
    def search_hotels(ctx, state):
        if ctx.attempt == 1:
            raise ConnectionError("hotel search timed out")
        return {"hotels": ["h1", "h2"]}

    @wf.step()
    def search_cars(ctx, state):
        return {"cars": ["c1"]}

    @wf.step()
    def approve(ctx, state):
        return {"approved": ctx.wait_for("approval")["ok"]}

    @wf.step(effect=True, compensate=cancel)
    def ship_tickets(ctx, state):
        if state.get("card") == "declined":
            raise PermissionError("card declined")
        return {"shipment": ledger.book("shipment", ctx.idempotency_key)}

    wf.edge("book_flight", "search_hotels")
    wf.edge("book_flight", "search_cars")
    wf.edge(["search_hotels", "search_cars"], "approve")
    wf.edge("approve", "ship_tickets")
    wf.edge("ship_tickets", END)
    return wf


def finish(orc: Orchestrator, run_id: str):
    """Drive the run to its end the way a person would: approve whenever it waits."""
    result = orc.result(run_id)
    for _ in range(3):
        if result.status != "waiting":
            break
        orc.signal(run_id, "approval", {"ok": True})
        result = orc.resume(run_id)
    return result


def journaled_trip(orc: Orchestrator, wf: Workflow, run_id: str, card: str = "ok") -> list[tuple[int, str]]:
    assert orc.run(wf, {"card": card}, run_id=run_id).status == "waiting"
    assert finish(orc, run_id).status == ("completed" if card == "ok" else "compensated")
    return [(e["seq"], e["kind"]) for e in orc.history(run_id)]


def consistent(ledger: Ledger, result) -> bool:
    """What is in force in the world is exactly what the run's end says: its bookings when it
    completed, nothing when it compensated."""
    held = {result.state["flight"], result.state["shipment"]} if result.status == "completed" else set()
    return ledger.in_force(result.run_id) == held


def between_ticks(history: list[dict]) -> set[int]:
    """The seqs a person reading the journal calls "between ticks": the start, the completion that
    ended each tick (the last one journaled for its tick), and the run's completion after the last."""
    ends: dict[int, int] = {}
    for e in history:
        if e["kind"] == "StepCompleted":
            ends[e["data"]["tick"]] = e["seq"]
    return {1, *ends.values(), *(e["seq"] for e in history if e["kind"] == "RunCompleted")}


@pytest.mark.parametrize("card", ["ok", "declined"])
def test_every_seq_of_a_run_is_either_a_rollback_point_that_ends_consistently_or_refused_changing_nothing(
        orc_factory, card):
    # Given a trip whose journal has an effect's intent, a failed attempt and a sibling's completion
    # inside a parallel tick, a wait for a signal, and a second effect that completed (card ok), or
    # failed so that the saga cancelled the flight (card declined)
    ledger = Ledger()
    wf = trip(ledger)
    orc = orc_factory(wf)
    reference = journaled_trip(orc, wf, "ref", card)
    kinds = [kind for _, kind in reference]
    assert {"StepStarted", "StepFailed", "WaitStarted", "SignalReceived", "Resumed"} <= set(kinds)
    # (once the flight is cancelled, only the start holds no undone effect)
    expected = between_ticks(orc.history("ref")) if card == "ok" else {1}
    status = orc.get_run("ref").status
    accepted, refused = [], []
    for seq, kind in reference:
        run_id = f"p{seq}"
        assert [k for _, k in journaled_trip(orc, wf, run_id, card)] == kinds
        before = orc.history(run_id)
        booked, cancelled = dict(ledger.booked), list(ledger.cancelled)
        # When the run is rolled back to that seq
        try:
            orc.rollback(run_id, to=seq)
        except RunStateError as exc:
            # Then a refusal names the run, the seq and its event, and changes nothing
            refused.append(seq)
            message = str(exc)
            assert f"run {run_id!r} cannot roll back to seq {seq} ({kind}" in message, message
            assert "the nearest" in message and "Nothing was changed" in message
            assert orc.history(run_id) == before
            assert orc.get_run(run_id).status == status
            assert ledger.booked == booked and ledger.cancelled == cancelled
            continue
        # Or the run goes on to a consistent end: what is in force is what its state holds
        accepted.append(seq)
        result = finish(orc, run_id)
        assert result.status == status, (seq, result.error)
        assert consistent(ledger, result), seq
        undone = [e["data"]["effect"] for e in orc.history(run_id) if e["kind"] == "CompensationCompleted"]
        assert len(undone) == len(set(undone)), seq  # no effect undone twice
        assert orc.verify(run_id).ok, seq
    # And the seqs accepted are exactly those between ticks: the repro's StepStarted among the refused
    assert accepted == sorted(expected)
    assert refused == [seq for seq, _ in reference if seq not in expected]
    assert reference[1] == (2, "StepStarted") and 2 in refused
    assert "SagaStarted" not in kinds or {s for s, k in reference if k.startswith(("Saga", "Compensation"))} <= set(
        refused)


def test_a_rollback_inside_the_tick_of_an_effect_is_refused_and_names_the_nearest_points(orc_factory):
    # Given a trip whose payment is declined, so its booking was compensated
    undone = []
    wf = Workflow("trip")

    @wf.step(start=True, compensate=lambda ctx, effect: undone.append(effect.result["booking"]))
    def book(ctx, state):
        return {"booking": "b1"}

    @wf.step()
    def pay(ctx, state):
        raise ValueError("declined")

    wf.edge("book", "pay")
    wf.edge("pay", END)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="r1").status == "compensated"
    history = [(e["seq"], e["kind"]) for e in orc.history("r1")]
    assert history[:3] == [(1, "RunStarted"), (2, "StepStarted"), (3, "StepCompleted")]
    # When it is rolled back to book's intent, seq 2
    with pytest.raises(RunStateError) as refused:
        orc.rollback("r1", to=2)
    # Then the refusal says where the seq lies and where the nearest points are; nothing is journaled
    assert str(refused.value).startswith(
        "run 'r1' cannot roll back to seq 2 (StepStarted of step 'book'): it lies inside tick 0, after step 'book' "
        "began")
    assert "the nearest is seq 1 (RunStarted, the run's start)" in str(refused.value)
    # And seq 3, after book's completion, is refused too: the booking its state holds was cancelled
    with pytest.raises(RunStateError, match=r"seq 3 \(StepCompleted of step 'book'\): its state holds what was "
                                            r"compensated since: the effect of step 'book' \(seq 3\), undone at seq 7"):
        orc.rollback("r1", to=3)
    assert [(e["seq"], e["kind"]) for e in orc.history("r1")] == history
    assert orc.get_run("r1").status == "compensated" and undone == ["b1"]


def test_after_a_rollback_the_points_it_cut_out_hold_effects_undone_and_are_refused(orc_factory):
    # Given a completed trip rolled back to its start (both bookings cancelled) and completed again
    ledger = Ledger()
    wf = trip(ledger)
    orc = orc_factory(wf)
    journaled_trip(orc, wf, "t1")
    first = between_ticks(orc.history("t1"))
    orc.rollback("t1", to=1)
    assert finish(orc, "t1").status == "completed"
    history = orc.history("t1")
    rolled = next(e["seq"] for e in history if e["kind"] == "RolledBack")
    # When it is rolled back to a point of the first pass that held the first flight
    flight_done = min(s for s in first if s > 1)
    with pytest.raises(RunStateError, match=f"cannot roll back to seq {flight_done} .*undone at seq"):
        orc.rollback("t1", to=flight_done)
    # Then nothing changed; while the RolledBack itself (the start's state again) is a point
    assert orc.history("t1") == history
    result = finish(orc, "t1") if orc.rollback("t1", to=rolled).status == "waiting" else orc.result("t1")
    assert result.status == "completed" and consistent(ledger, result)
    assert orc.verify("t1").ok
