"""A workflow app whose import leaves a mark, and the child process that crashes a run of it.

    python tests/orchestrator/markedapp.py DB_URL RUN_ID

Importing this module with ``AGENTSAGA_TEST_MARKER`` set writes that file: a test that reads runs
with the app configured everywhere (``AGENTSAGA_APP``, ``agentsaga.toml``, the run row's old
``target`` column) proves nothing imported it. The child drives a run until its third step and
SIGKILLs itself there, leaving the run ``running`` with a lease that expires after a second, a
snapshot, and events after the snapshot: the shape of a crashed worker's run.
"""

from __future__ import annotations

import os
import signal
import sys

from workflows import END, Workflow, reducers

if os.environ.get("AGENTSAGA_TEST_MARKER"):
    with open(os.environ["AGENTSAGA_TEST_MARKER"], "a", encoding="utf-8") as fh:
        fh.write(f"imported by pid {os.getpid()}\n")


def keep_best(current, update):
    """The workflow's own reducer: a reader without this code cannot reproduce it."""
    return update if current is reducers.MISSING else max(current, update)


wf = Workflow("marked", version="7", reducers={"log": reducers.append, "best": keep_best})


@wf.step(start=True)
def one(ctx, state):
    return {"log": "one", "best": 5}


@wf.step()
def two(ctx, state):
    return {"log": "two", "best": 3}


@wf.step()
def three(ctx, state):
    if os.environ.get("MARKEDAPP_CRASH") == "three":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"log": "three", "best": 9}


wf.edge("one", "two")
wf.edge("two", "three")
wf.edge("three", END)


def main(argv: list[str]) -> int:
    url, run_id = argv
    from orchestrator import Orchestrator

    os.environ["MARKEDAPP_CRASH"] = "three"
    with Orchestrator(url, workflows=[wf], snapshot_every=2, lease_ttl=1.0) as orc:
        orc.run(wf, {"log": []}, run_id=run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
