"""A run that waits for a human's approval, sent from another process.

    python examples/approval.py            # starts run "refund": it asks, then waits (prints "waiting")
    python examples/approval.py approve    # from any process: approve, and drive the run to its end

Approving sends the signal and runs the same program again, which continues the waiting run: the
refund is made once, with the step's idempotency key. Approving again, once the run has ended (or
while the approval is being applied), sends nothing and prints the run's status. The refund goes
to $BOOKING_API (see orchestrator.testing's BookingService). The database is $AGENTSAGA_DB, else
agentsaga.db here.
"""

import os
import sys

from orchestrator import Orchestrator
from workflows import Workflow

refund = Workflow("refund")


@refund.step
def approve(ctx, state):
    return {"approved": ctx.wait_for("approval")["ok"]}


@refund.step
def pay(ctx, state):
    if state["approved"]:
        ctx.http.post(f"{os.environ['BOOKING_API']}/payments", json={"amount": -120})


if __name__ == "__main__":
    orc = Orchestrator()
    if sys.argv[1:] == ["approve"] and orc.result("refund").status == "waiting":  # else: already approved
        orc.signal("refund", "approval", {"ok": True})
    print(orc.run(refund, {"order": "A-1001"}, run_id="refund").status)
