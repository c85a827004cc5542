"""Declaring compensations (on the step or by registry), check hooks, and compensation policies."""

from __future__ import annotations

import pytest

from compensations import (
    DEFAULT_COMPENSATION_POLICY,
    CompensationDefinitionError,
    CompensationPolicy,
    Compensations,
    resolve_check,
    resolve_compensation,
)
from workflows import DefinitionError, Retry, Workflow


class NotFound(Exception):
    pass


def cancel_flight(ctx, effect):
    return "cancelled"


def test_registry_entries_are_found_by_tool_name():
    # Given a registry declared the way a workflow file would
    saga = Compensations()

    @saga.compensates("book_flight")
    def undo(ctx, effect):
        return None

    @saga.check("book_flight")
    def happened(ctx, effect):
        return True

    # Then it finds them by name, and the decorators return the functions unchanged
    assert saga.get("book_flight") is undo
    assert saga.get_check("book_flight") is happened
    assert saga.get("nothing") is None
    assert saga.names() == ("book_flight",)
    assert "book_flight" in saga


def test_registering_a_name_twice_is_an_error_naming_it():
    saga = Compensations()
    saga.compensates("charge", cancel_flight)
    with pytest.raises(CompensationDefinitionError, match="'charge'.*already registered"):
        saga.compensates("charge", lambda ctx, effect: None)
    saga.check("charge", lambda ctx, effect: True)
    with pytest.raises(CompensationDefinitionError, match="check hook for 'charge'"):
        saga.check("charge", lambda ctx, effect: True)


def test_a_compensation_must_take_ctx_and_effect():
    saga = Compensations()
    with pytest.raises(CompensationDefinitionError, match="two arguments"):
        saga.compensates("x", lambda ctx: None)
    with pytest.raises(CompensationDefinitionError, match="callable"):
        saga.compensates("x", "not a function")
    with pytest.raises(CompensationDefinitionError, match="non-empty"):
        saga.compensates("", cancel_flight)


def test_definition_errors_are_also_workflow_definition_errors():
    with pytest.raises(DefinitionError):
        Compensations().compensates("x", lambda: None)


def test_the_step_own_compensation_wins_over_the_registry():
    # Given a step declaring its compensation and a registry with another for the same name
    trip = Workflow("trip", version="1")
    saga = Compensations()
    saga.compensates("book_flight", lambda ctx, effect: "registry")

    @trip.step(start=True, effect=True, compensate=cancel_flight)
    def book_flight(ctx, state):
        return {}

    # Then the step's own is used
    assert resolve_compensation(trip.steps["book_flight"], saga) is cancel_flight


def test_a_step_without_compensation_falls_back_to_the_registry_by_step_name():
    trip = Workflow("trip", version="1")
    saga = Compensations()
    undo = saga.compensates("book_hotel", lambda ctx, effect: None)
    check = saga.check("book_hotel", lambda ctx, effect: None)

    @trip.step(start=True, effect=True)
    def book_hotel(ctx, state):
        return {}

    step = trip.steps["book_hotel"]
    assert resolve_compensation(step, saga) is undo
    assert resolve_check(step, saga) is check
    assert resolve_compensation(step, None) is None


def test_a_step_can_name_a_registry_entry_and_a_missing_one_is_a_clear_error():
    trip = Workflow("trip", version="1")
    saga = Compensations()
    refund = saga.compensates("refund_card", lambda ctx, effect: None)

    @trip.step(start=True, effect=True, compensate="refund_card")
    def pay(ctx, state):
        return {}

    @trip.step(effect=True, compensate="refund_cash")
    def pay_cash(ctx, state):
        return {}

    assert resolve_compensation(trip.steps["pay"], saga) is refund
    with pytest.raises(CompensationDefinitionError, match="step 'pay_cash'.*'refund_cash'.*refund_card"):
        resolve_compensation(trip.steps["pay_cash"], saga)


def test_policy_defaults_retry_patiently_and_permanent_errors_fail_at_once():
    # Given the default policy and one that treats NotFound as permanent
    policy = CompensationPolicy(permanent=NotFound)
    # Then a transient error is retried up to the attempts, a permanent one never
    assert DEFAULT_COMPENSATION_POLICY.retry.attempts == 5
    assert policy.permanent == (NotFound,)
    assert policy.should_retry(ConnectionError("flaky"), attempt=1)
    assert policy.should_retry(ConnectionError("flaky"), attempt=4)
    assert not policy.should_retry(ConnectionError("flaky"), attempt=5)
    assert not policy.should_retry(NotFound("gone"), attempt=1)
    assert policy.backoff(1, 0.0) == 0.5


def test_policy_validation_names_the_field():
    with pytest.raises(CompensationDefinitionError, match="retry"):
        CompensationPolicy(retry=3)
    with pytest.raises(CompensationDefinitionError, match="permanent"):
        CompensationPolicy(permanent=("nope",))
    with pytest.raises(CompensationDefinitionError, match="permanent"):
        CompensationPolicy(permanent=42)


def test_a_registry_entry_can_carry_its_own_policy():
    patient = CompensationPolicy(retry=Retry(attempts=10))
    saga = Compensations()
    saga.compensates("charge", cancel_flight, policy=patient)
    saga.compensates("email", cancel_flight)
    assert saga.policy_for("charge") is patient
    assert saga.policy_for("email") is DEFAULT_COMPENSATION_POLICY
