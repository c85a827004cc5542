"""The app the compensation-registry tests hand to the command line and to workers (copied into a
temporary directory, so its ledger lands there): one effect undone by a registry at its top level."""

from pathlib import Path

from compensations import Compensations
from workflows import Workflow

LEDGER = Path(__file__).resolve().parent / "ledger.txt"

undo = Compensations()
trip = Workflow("trip")


@trip.step(effect=True)
def book_flight(ctx, state):
    return {"flight": "F1"}


@undo.compensates("book_flight")
def cancel_flight(ctx, effect):
    with LEDGER.open("a") as ledger:
        ledger.write(f"cancel {effect.result['flight']}\n")


@trip.step
def approve(ctx, state):
    return {"ok": ctx.wait_for("approval")["ok"]}


@trip.step
def pay(ctx, state):
    if not state["ok"]:
        raise ValueError("not approved")
    return {"paid": True}
