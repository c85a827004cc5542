"""A saga: book a flight, a hotel and a car, then pay; when the payment is declined, the bookings
are cancelled newest first. Each booking is an effect: ctx.http sends its idempotency key, so a
booking re-sent after a crash is recognised by the service, never made twice.

    python -m orchestrator.testing.booking_service --port 8000 --fail-payments 402 &
    BOOKING_API=http://127.0.0.1:8000 python examples/booking_saga.py

Kill it at any moment and run the same command again: run "trip" continues where it stopped. The
database is $AGENTSAGA_DB, else agentsaga.db in the working directory.
"""

import os
from functools import partial

from orchestrator import Orchestrator
from workflows import Workflow

trip = Workflow("trip")


def book(ctx, state, kind):
    url = f"{state['api']}/{kind}s"
    return {kind: f"{url}/{ctx.http.post(url, json={'city': state['city']}).json()['id']}"}


def cancel(ctx, effect):
    ctx.http.delete(*effect.result.values())


for kind in ("flight", "hotel", "car"):
    trip.step(partial(book, kind=kind), name=kind, compensate=cancel)
trip.step(partial(book, kind="payment"), name="pay", effect=True)

if __name__ == "__main__":
    result = Orchestrator().run(trip, {"api": os.environ["BOOKING_API"], "city": "Lisbon"}, run_id="trip")
    print(result.status)
