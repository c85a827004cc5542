"""The saga planner, pure: what is undone, in which order, and what cannot be."""

from __future__ import annotations

import pytest

from compensations import EffectRecord, PlanError, plan_compensations


def effect(seq, step, tick, *, branch=0, call=-1, name=None, key=None, **extra) -> EffectRecord:
    return EffectRecord(seq=seq, step=step, tick=tick, branch=branch, call=call, name=name or step,
                        key=key or f"run:{step}:{tick}:{call}", result={"id": seq}, **extra)


def names(plan) -> list[str]:
    return [p.effect.name for p in plan.items]


def test_sequential_effects_are_undone_newest_first():
    # Given three bookings made one after another
    effects = [effect(3, "book_flight", 1), effect(5, "book_hotel", 2), effect(8, "book_car", 3)]
    # When the saga plans their compensation
    plan = plan_compensations(effects)
    # Then the car is cancelled first and the flight last
    assert names(plan) == ["book_car", "book_hotel", "book_flight"]
    assert plan.uncompensable == ()


def test_parallel_branches_are_undone_in_reverse_frontier_order_whatever_order_they_finished():
    # Given one tick whose frontier was [flight, hotel, car], finishing car, flight, hotel
    finished = [effect(4, "car", 2, branch=2), effect(5, "flight", 2, branch=0), effect(6, "hotel", 2, branch=1)]
    # When planned (and planned again from the records in another order)
    plan = plan_compensations(finished)
    again = plan_compensations(reversed(finished))
    # Then the order is reverse frontier order, not completion order, and is the same both times
    assert names(plan) == ["car", "hotel", "flight"]
    assert names(again) == names(plan)


def test_a_later_tick_is_undone_before_every_branch_of_an_earlier_one():
    # Given a parallel tick 1 (two branches) and a single effect in tick 2 that finished first by seq
    effects = [effect(9, "a", 1, branch=0), effect(10, "b", 1, branch=1), effect(7, "c", 2)]
    # Then tick 2 comes first whatever its seq
    assert names(plan_compensations(effects)) == ["c", "b", "a"]


def test_calls_inside_a_step_are_undone_in_reverse_and_before_the_whole_step_effect():
    # Given a step that is itself an effect and made three tool calls
    effects = [
        effect(2, "book", 1, call=0, name="reserve_seat"),
        effect(3, "book", 1, call=1, name="charge"),
        effect(4, "book", 1, call=2, name="email"),
        effect(5, "book", 1, call=-1, name="book"),
    ]
    # Then the calls are undone newest first, then the step's own effect
    assert names(plan_compensations(effects)) == ["email", "charge", "reserve_seat", "book"]


def test_calls_made_inside_a_call_are_undone_after_it_and_before_the_calls_before_it():
    # Given a step whose call 1 (a trip) booked a hotel and a car inside it (calls 1.0 and 1.1, which
    # completed before it), between a seat (call 0) and an email (call 2); the records come in any order
    effects = [
        effect(6, "book", 1, call=1, name="trip"),
        effect(2, "book", 1, call=0, name="seat"),
        effect(4, "book", 1, call="1.1", name="car"),
        effect(3, "book", 1, call="1.0", name="hotel"),
        effect(7, "book", 1, call=2, name="email"),
        effect(5, "book", 1, call="1.1.0", name="child seat"),
    ]
    # Then the order is newest first by position, a call before the calls made inside it
    assert names(plan_compensations(effects)) == ["email", "trip", "car", "child seat", "hotel", "seat"]
    # And a call made inside another is named by its position
    assert "book call 1.0" in effects[3].label()


def test_after_seq_limits_the_plan_to_effects_recorded_after_a_checkpoint():
    # Given effects before and after a checkpoint at seq 6
    effects = [effect(3, "a", 1), effect(5, "b", 2), effect(7, "c", 3), effect(9, "d", 4)]
    # When planning a rollback to seq 6
    plan = plan_compensations(effects, after_seq=6)
    # Then only the effects after it are undone, newest first; an effect *at* the seq is kept
    assert names(plan) == ["d", "c"]
    assert names(plan_compensations(effects, after_seq=5)) == ["d", "c"]
    assert names(plan_compensations(effects, after_seq=4)) == ["d", "c", "b"]


def test_already_compensated_effects_are_skipped_and_partial_attempts_carried():
    # Given a compensation that ran for the car, and one started but not confirmed for the hotel
    effects = [
        effect(3, "flight", 1),
        effect(5, "hotel", 2, compensation_attempts=2),
        effect(8, "car", 3, compensated=True, compensation_attempts=1),
    ]
    # When planned again (resuming after a crash mid-compensation)
    plan = plan_compensations(effects)
    # Then the car is not undone twice, and the hotel keeps its attempt count
    assert names(plan) == ["hotel", "flight"]
    assert plan.items[0].effect.compensation_attempts == 2


def test_effects_without_compensation_are_listed_never_dropped():
    # Given one effect that nothing can undo, between two that can
    effects = [effect(3, "flight", 1), effect(5, "email", 2, compensable=False), effect(8, "car", 3)]
    # When planned
    plan = plan_compensations(effects)
    # Then it is listed as uncompensable and the others are still planned
    assert [e.name for e in plan.uncompensable] == ["email"]
    assert names(plan) == ["car", "flight"]
    assert plan.describe()["uncompensable"][0]["key"] == "run:email:2:-1"


def test_handler_names_are_attached_for_the_journal():
    plan = plan_compensations([effect(3, "flight", 1)], handler_name=lambda e: f"cancel_{e.name}")
    assert plan.items[0].handler_name == "cancel_flight"
    assert plan.describe()["compensate"][0]["handler"] == "cancel_flight"


def test_nothing_to_undo_is_an_empty_plan():
    assert plan_compensations([]).empty
    assert plan_compensations([effect(3, "a", 1, compensated=True)]).empty


def test_two_pending_effects_sharing_a_key_are_an_error_naming_it():
    # Given two pending effects with one idempotency key (the same effect journaled twice)
    effects = [effect(3, "a", 1, key="k-1"), effect(5, "b", 2, key="k-1")]
    # Then planning refuses rather than undoing one effect twice
    with pytest.raises(PlanError, match="'k-1'"):
        plan_compensations(effects)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_after_seq_must_be_a_non_negative_integer(bad):
    with pytest.raises(PlanError, match="after_seq"):
        plan_compensations([], after_seq=bad)
