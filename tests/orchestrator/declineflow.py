"""The charging workflow of test_same_path_again.py's user-error tests, in a module of its own so
that the child process its SIGKILL test kills drives the same code (and the same error class) as
the test.

``charge`` charges a card through a durable call; the card service declines with ``Declined`` (an
exception class of the user's, with arguments and attributes of its own). The step's ``Retry`` gives
up on ``Declined``: a declined card is not charged again. A process started with
``DECLINEFLOW_DIE=1`` SIGKILLs itself the moment the step has caught the decline (journaled as the
call's failure; the step's own failure is not): the crash between the two."""

from __future__ import annotations

import os
import signal

from workflows import END, Retry, Workflow


class Declined(Exception):
    """The card service said no; ``code`` and ``retry`` are what a handler reads."""

    def __init__(self, card: str, code: str) -> None:
        super().__init__(card, code)
        self.code = code
        self.retry = code == "insufficient_funds"


def _charge(state: dict) -> dict:
    with open(state["ledger"], "a") as out:  # the card service's ledger: one line per request
        out.write(f"charge {state['card']}\n")
    raise Declined(state["card"], "do_not_honor")


charge = Workflow("charge-declined")


@charge.step(start=True, retry=Retry(attempts=3, initial=0.01, give_up_on=(Declined,)))
def pay(ctx, state):
    try:
        return {"paid": ctx.durable_call("charge", {"card": state["card"]}, lambda: _charge(state))}
    except Declined:
        if os.environ.get("DECLINEFLOW_DIE"):
            os.kill(os.getpid(), signal.SIGKILL)
        raise


charge.edge("pay", END)
