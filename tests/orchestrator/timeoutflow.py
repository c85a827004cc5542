"""The escalating workflow of test_same_path_again.py, in a module of its own so that the child
process its SIGKILL test kills drives the same code as the test.

``approve`` waits for ``approval`` with a timeout; told it timed out, it pages the manager (a durable
call) and waits for the approval again. ``escalating(page, timeout)`` builds it with ``page(ctx,
state)`` as what a page does; ``escalate`` is the one the child process drives: a timeout of 0 (timed
out the first time it is asked), and a page that appends a line to the file named in the run's input
(``pages``), so both processes can count them. A process started with ``TIMEOUTFLOW_STALL=<file>``
writes that file once it paged, then stalls (to be killed there)."""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

from orchestrator.errors import WaitTimeoutError
from workflows import END, Workflow


def escalating(page: Callable[[Any, dict], Any], *, timeout: float, name: str = "escalate") -> Workflow:
    wf = Workflow(name)

    @wf.step(start=True)
    def approve(ctx, state):
        try:
            answer = ctx.wait_for("approval", timeout=timeout)
            return {"approved": answer["ok"], "escalated": False}
        except WaitTimeoutError:
            # the manager is paged once (a durable call), then the step waits for the approval again
            ctx.durable_call("page", {"who": "manager"}, lambda: page(ctx, state))
            stall = os.environ.get("TIMEOUTFLOW_STALL")
            if stall:  # the first process says it paged, then stalls here to be killed
                pathlib.Path(stall).write_text("paged")
                while True:
                    time.sleep(0.05)
            answer = ctx.wait_for("approval")
            return {"approved": answer["ok"], "escalated": True}

    wf.edge("approve", END)
    return wf


def _page_to_file(ctx: Any, state: dict) -> dict:
    with open(state["pages"], "a") as out:
        out.write(f"{ctx.run_id}\n")
    return {"paged": True}


escalate = escalating(_page_to_file, timeout=0)
