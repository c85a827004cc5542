"""Workflows for the cancel-with-an-effect-in-flight tests (test_cancel_in_doubt.py), in a module of
their own so that `agentsaga cancel --app tests/orchestrator/cancelflow.py` finds the same code the
test drives. The service's URL is in the run's input (`api`)."""

from __future__ import annotations

from workflows import END, Workflow


def cancel_flight(ctx, effect):
    ctx.http.delete(f"{effect.result['api']}/flights/{effect.result['flight']}")


def refund(ctx, effect):
    ctx.http.delete(f"{effect.result['api']}/payments/{effect.result['payment']}")


def pay(ctx, state):
    answer = ctx.http.post(f"{state['api']}/payments", json={"amount": 30}).json()  # the key goes with it
    return {"payment": answer["id"], "api": state["api"]}


def book_flight(ctx, state):
    answer = ctx.http.post(f"{state['api']}/flights", json={"to": "Lisbon"}).json()
    return {"flight": answer["id"], "api": state["api"]}


# The payment is the run's only effect.
checkout = Workflow("checkout")
checkout.step(pay, start=True, compensate=refund)
checkout.edge("pay", END)

# A flight booked (a completed effect) before the payment.
trip = Workflow("trip")
trip.step(book_flight, start=True, compensate=cancel_flight, resend=True)
trip.step(pay, compensate=refund)
trip.edge("book_flight", "pay")
trip.edge("pay", END)


def cancel_no_such_flight(ctx, effect):
    """A compensation the airline refuses for good (it knows no such flight: 404)."""
    ctx.http.delete(f"{effect.result['api']}/flights/no-such-flight")


# As ``trip``, with a flight whose cancellation always fails: a cancel ends compensation_failed.
trip_refused = Workflow("trip_refused")
trip_refused.step(book_flight, start=True, compensate=cancel_no_such_flight, resend=True)
trip_refused.step(pay, compensate=refund)
trip_refused.edge("book_flight", "pay")
trip_refused.edge("pay", END)


def pay_then_stall(ctx, state):
    """Pays, then stalls once the answer is journaled (it says so with a file): a process to kill there."""
    import pathlib
    import time

    answer = ctx.http.post(f"{state['api']}/payments", json={"amount": 30}).json()
    pathlib.Path(state["answered"]).write_text(answer["id"])
    while True:
        time.sleep(0.05)


# The payment's answer is journaled, the step's result never is.
checkout_answered = Workflow("checkout_answered")
checkout_answered.step(pay_then_stall, name="pay", start=True, compensate=refund)
checkout_answered.edge("pay", END)
