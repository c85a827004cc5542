"""The workflow of test_wait_timeout_journaled.py's SIGKILL test, in a module of its own so that the
child process the test kills drives the same code as the test. A page is a line appended to the
file named in the run's input (``pages``), so both processes can count them; a process started with
``TIMEOUTFLOW_STALL=<file>`` writes that file once it paged, then stalls (to be killed there)."""

from __future__ import annotations

import os
import pathlib
import time

from orchestrator.errors import WaitTimeoutError
from workflows import END, Workflow

escalate = Workflow("escalate-after-timeout")


def _page(path: str, run_id: str) -> dict:
    with open(path, "a") as out:
        out.write(f"{run_id}\n")
    return {"paged": True}


@escalate.step(start=True)
def approve(ctx, state):
    try:
        # a timeout of 0: timed out the first time it is asked
        answer = ctx.wait_for("approval", timeout=0)
        return {"approved": answer["ok"], "escalated": False}
    except WaitTimeoutError:
        ctx.durable_call("page", {"who": "manager"}, lambda: _page(state["pages"], ctx.run_id))
        stall = os.environ.get("TIMEOUTFLOW_STALL")
        if stall:  # the first process says it paged, then stalls here to be killed
            pathlib.Path(stall).write_text("paged")
            while True:
                time.sleep(0.05)
        answer = ctx.wait_for("approval")
        return {"approved": answer["ok"], "escalated": True}


escalate.edge("approve", END)
