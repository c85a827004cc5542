"""``Compensations.combine``: one registry made of several (an app whose modules each hold one)."""

from __future__ import annotations

import pytest

from compensations import DEFAULT_COMPENSATION_POLICY, CompensationDefinitionError, CompensationPolicy, Compensations
from workflows import Retry

PATIENT = CompensationPolicy(retry=Retry(attempts=9))
QUICK = CompensationPolicy(retry=Retry(attempts=2))


def cancel_flight(ctx, effect):
    return "flight cancelled"


def cancel_hotel(ctx, effect):
    return "hotel cancelled"


def refund_flight(ctx, effect):
    return "refunded"


def was_booked(ctx, effect):
    return None


def test_the_combined_registry_holds_every_entry_with_its_own_policy():
    # Given two registries, one with a default policy of its own and a check hook
    flights = Compensations(policy=PATIENT)
    flights.compensates("book_flight", cancel_flight)
    flights.check("book_flight", was_booked)
    hotels = Compensations()
    hotels.compensates("book_hotel", cancel_hotel, policy=QUICK)
    # When they are combined
    both = Compensations.combine(flights, hotels)
    # Then every compensation and check hook is found, each with the policy it was registered with
    assert both.names() == ("book_flight", "book_hotel")
    assert both.get("book_flight") is cancel_flight and both.get("book_hotel") is cancel_hotel
    assert both.get_check("book_flight") is was_booked
    assert both.policy_for("book_flight") == PATIENT and both.policy_for("book_hotel") == QUICK
    # And the registries themselves are unchanged
    assert flights.names() == ("book_flight",) and hotels.names() == ("book_hotel",)


def test_the_default_policy_is_the_shared_one_else_the_librarys_or_the_one_given():
    # Given registries with the same default policy, and one with another
    a, b, c = Compensations(policy=PATIENT), Compensations(policy=PATIENT), Compensations(policy=QUICK)
    # Then an effect in none of them gets the shared default, the library's when they differ, or the one given
    assert Compensations.combine(a, b).policy_for("unregistered") == PATIENT
    assert Compensations.combine(a, c).policy_for("unregistered") == DEFAULT_COMPENSATION_POLICY
    assert Compensations.combine(a, c, policy=QUICK).policy_for("unregistered") == QUICK


def test_one_function_registered_in_two_registries_is_one_entry():
    # Given the same compensation and check hook registered in two registries
    a, b = Compensations(), Compensations()
    for registry in (a, b):
        registry.compensates("book_flight", cancel_flight)
        registry.check("book_flight", was_booked)
    # When they are combined, then it is one entry, not a conflict
    both = Compensations.combine(a, b)
    assert both.names() == ("book_flight",) and both.get("book_flight") is cancel_flight


def test_two_compensations_for_one_name_are_an_error_naming_the_name_and_both_functions():
    # Given two registries with different compensations for one effect
    a, b = Compensations(), Compensations()
    a.compensates("book_flight", cancel_flight)
    b.compensates("book_flight", refund_flight)
    # When they are combined, then the error names the effect and both definitions, with where they are
    with pytest.raises(CompensationDefinitionError) as err:
        Compensations.combine(a, b)
    message = str(err.value)
    assert message.startswith("two compensations for 'book_flight': 'cancel_flight' (")
    assert "'refund_flight' (" in message and f"{__file__}:" in message


def test_one_function_with_two_policies_and_two_check_hooks_are_errors():
    # Given one compensation registered with two policies
    a, b = Compensations(), Compensations()
    a.compensates("book_flight", cancel_flight, policy=QUICK)
    b.compensates("book_flight", cancel_flight, policy=PATIENT)
    # Then combining them is an error naming it
    with pytest.raises(CompensationDefinitionError, match="'book_flight'.*two different policies"):
        Compensations.combine(a, b)
    # And so are two different check hooks for one name
    c, d = Compensations(), Compensations()
    c.check("book_flight", was_booked)
    d.check("book_flight", lambda ctx, effect: None)
    with pytest.raises(CompensationDefinitionError, match="two check hooks for 'book_flight'"):
        Compensations.combine(c, d)


def test_closures_of_one_def_holding_different_values_are_different_compensations():
    # Given two compensations made by one factory, each undoing a different kind of booking
    def cancelling(kind):
        def cancel(ctx, effect):
            return kind
        return cancel

    a, b = Compensations(), Compensations()
    a.compensates("book", cancelling("flight"))
    b.compensates("book", cancelling("hotel"))
    # Then combining them is a conflict, not a silent choice of one
    with pytest.raises(CompensationDefinitionError, match="two compensations for 'book'"):
        Compensations.combine(a, b)


def test_only_registries_can_be_combined():
    with pytest.raises(CompensationDefinitionError, match="takes Compensations registries"):
        Compensations.combine(Compensations(), {"book_flight": cancel_flight})  # type: ignore[arg-type]
