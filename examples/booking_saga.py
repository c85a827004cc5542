"""A saga: book a flight, a hotel and a car, then pay; when the payment is declined, the bookings
are cancelled newest first. Each booking is an effect with a compensation. ctx.http sends the step's
idempotency key, so a booking or payment re-sent after a crash is recognised by the service, never
made twice.

    python -m orchestrator.testing.booking_service --port 8000 --fail-payments 402 &
    BOOKING_API=http://127.0.0.1:8000 python examples/booking_saga.py

Kill it at any moment and run the same command again: run "trip" continues where it stopped. The
database is $AGENTSAGA_DB, else agentsaga.db in the working directory.
"""

import os

from orchestrator import Orchestrator
from workflows import Workflow

trip = Workflow("trip")


def book(ctx, state):  # the step's name says what it books: flight, hotel, car, payment
    url = f"{state['api']}/{ctx.step}s"
    return {ctx.step: f"{url}/{ctx.http.post(url, json={'city': state['city']}).json()['id']}"}


def cancel(ctx, effect):
    ctx.http.delete(effect.result[effect.step])


# resend=True: a booking reaches the service only through ctx.http, which sends the step's key, so
# a process killed anywhere in the step (even before its request left) re-sends it safely on resume
for kind in ("flight", "hotel", "car"):
    trip.step(book, name=kind, compensate=cancel, resend=True)
trip.step(book, name="payment")

if __name__ == "__main__":
    result = Orchestrator().run(trip, {"api": os.environ["BOOKING_API"], "city": "Lisbon"}, run_id="trip")
    print(result.status)
