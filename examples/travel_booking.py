"""A three-booking saga: flight, hotel and car are booked over HTTP, the payment is declined, and
the run undoes the bookings newest first. The booking service's own ledger proves it.

    python examples/travel_booking.py            # SQLite in a temp dir
    python examples/travel_booking.py --db postgresql://postgres@127.0.0.1:5432/test

The booking service is a real HTTP server started on 127.0.0.1 (``orchestrator.testing``'s
``BookingService``, a test double your own saga tests can use too); it honours the
Idempotency-Key header that ``ctx.http`` sends for every effect step, so a booking re-sent after a
crash is recognised, not made twice.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from orchestrator import Orchestrator
from orchestrator.testing import BookingService
from workflows import END, Retry, Workflow

trip = Workflow("trip", version="1", description="book a flight, a hotel and a car, then pay")


def book(ctx, state, kind: str, body: dict) -> dict:
    r = ctx.http.post(f"{state['api']}/{kind}s", json=body)   # Idempotency-Key sent for you
    return {kind: {"id": r.json()["id"], "href": f"{state['api']}/{kind}s/{r.json()['id']}"}}


def cancel(ctx, effect):
    """The compensation: cancel whatever the effect booked (the service treats repeats as done)."""
    (booking,) = effect.result.values()
    ctx.http.delete(booking["href"])


# resend=True: each step reaches the service only through ctx.http, which sends the step's key with
# every request, so after a crash anywhere in the step a re-send is recognised (docs/sagas.md)
@trip.step(start=True, effect=True, compensate=cancel, resend=True, retry=Retry(attempts=3, initial=0.2))
def book_flight(ctx, state):
    return book(ctx, state, "flight", {"to": state["city"]})


@trip.step(effect=True, compensate=cancel, resend=True, retry=Retry(attempts=3, initial=0.2))
def book_hotel(ctx, state):
    return book(ctx, state, "hotel", {"city": state["city"], "nights": state["nights"]})


@trip.step(effect=True, compensate=cancel, resend=True, retry=Retry(attempts=3, initial=0.2))
def book_car(ctx, state):
    return book(ctx, state, "car", {"city": state["city"]})


@trip.step(effect=True, compensate=cancel, resend=True)
def pay(ctx, state):
    ctx.trace("charging the card for three bookings")
    return book(ctx, state, "payment", {"amount": 1200, "card": state["card"]})


trip.edge("book_flight", "book_hotel")
trip.edge("book_hotel", "book_car")
trip.edge("book_car", "pay")
trip.edge("pay", END)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default=None, help="database URL (default: a SQLite file in a temp dir)")
    args = parser.parse_args()
    db = args.db or f"sqlite:///{Path(tempfile.mkdtemp(prefix='agentsaga-trip-')) / 'trip.db'}"

    with BookingService() as service, Orchestrator(db, workflows=[trip]) as orc:
        service.fail_payments(402)                       # the card is declined
        result = orc.run(trip, {"api": service.url, "city": "Lisbon", "nights": 3, "card": "4242"})
        print(f"run {result.run_id}: {result.status}  ({result.error})\n")
        print("booking service ledger:")
        for entry in service.ledger():
            print(f"  {entry['action']:<15} {entry.get('kind', ''):<8} {entry.get('id', '')}")
        cancelled = [e["id"] for e in service.ledger() if e["action"] == "cancel"]
        print(f"\ncancelled, in order: {', '.join(cancelled)}")
    return 0 if result.status == "compensated" else 1


if __name__ == "__main__":
    sys.exit(main())
