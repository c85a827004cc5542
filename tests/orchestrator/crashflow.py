"""A workflow for crash tests, and the child process that runs it and gets killed.

    python tests/orchestrator/crashflow.py DB_URL RUN_ID LEDGER CRASH

CRASH says where the process SIGKILLs itself:
    mid:STEP:N     inside STEP, on its N-th execution, after the ledger line is written
    after:STEP:N   right after the transaction holding STEP's N-th completion has committed
    branch         inside 'right' once 'left' (its parallel sibling) has committed its completion
    snapshot       right after the first transaction that wrote a snapshot
    in-snapshot    inside the first transaction that writes a snapshot: its row is inserted, the
                   transaction (the events with it) is not committed
    in-incremental the same inside the first transaction that writes an incremental snapshot
    none           run to the end
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

from workflows import END, Workflow, reducers

wf = Workflow("crashflow", version="1", reducers={"log": reducers.append, "total": reducers.add})

# Read at call time from the environment, so a resuming process (which imports this file as its
# --app) counts into the same ledger.
def _ledger() -> str:
    return os.environ["CRASHFLOW_LEDGER"]


def _crash() -> str:
    return os.environ.get("CRASHFLOW_CRASH", "none")

left_committed = threading.Event()


def executed(step: str) -> int:
    """Record one execution of ``step`` in the ledger (fsynced); return its execution count."""
    with open(_ledger(), "a", encoding="utf-8") as fh:
        fh.write(step + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    count = Path(_ledger()).read_text(encoding="utf-8").split().count(step)
    if _crash() == f"mid:{step}:{count}":
        os.kill(os.getpid(), signal.SIGKILL)
    return count


@wf.step(start=True)
def begin(ctx, state):
    executed("begin")
    return {"log": f"begin{state.get('round', 0)}"}


@wf.step()
def left(ctx, state):
    executed("left")
    return {"log": "left", "total": 1}


@wf.step()
def right(ctx, state):
    if _crash() == "branch":
        # No timeout: going on without 'left' committed would test another interleaving than the
        # one asked for; if it never commits, the parent's timeout on this process reports the hang.
        left_committed.wait()
        executed("right")
        os.kill(os.getpid(), signal.SIGKILL)
    executed("right")
    return {"log": "right", "total": 10}


@wf.step()
def merge(ctx, state):
    executed("merge")
    return {"round": state.get("round", 0) + 1, "log": f"merge{state['total']}"}


@wf.step()
def finish(ctx, state):
    executed("finish")
    return {"done": True}


wf.route("begin", lambda s: ["left", "right"], targets=["left", "right"])
wf.edge(["left", "right"], "merge")
wf.route("merge", lambda s: "begin" if s["round"] < 3 else "finish", targets=["begin", "finish"])
wf.edge("finish", END)


def main(argv: list[str]) -> int:
    url, run_id, ledger, crash = argv
    os.environ["CRASHFLOW_LEDGER"] = ledger
    os.environ["CRASHFLOW_CRASH"] = crash
    CRASH = crash
    from orchestrator import Orchestrator

    orc = Orchestrator(url, workflows=[wf], snapshot_every=4)
    real_append = orc.store.append
    completions: dict[str, int] = {}

    def append(run, events, **kw):
        real_append(run, events, **kw)
        # The transaction has committed: this is the moment between a step's end and the next.
        if CRASH == "snapshot" and kw.get("snapshot") is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        for event in events:
            if event.kind == "StepCompleted":
                step = json.loads(event.data)["step"]
                completions[step] = completions.get(step, 0) + 1
                if step == "left":
                    left_committed.set()
                if CRASH == f"after:{step}:{completions[step]}":
                    os.kill(os.getpid(), signal.SIGKILL)

    orc.store.append = append  # type: ignore[method-assign]
    if CRASH in ("in-snapshot", "in-incremental"):
        dialect = orc.store._d  # the crash point is inside the store's transaction
        real_execute = dialect.execute

        def execute(conn, sql, params):
            done = real_execute(conn, sql, params)
            if sql.startswith("INSERT INTO agentsaga_snapshots") and (
                    CRASH == "in-snapshot" or "incremental" in params):
                os.kill(os.getpid(), signal.SIGKILL)
            return done

        dialect.execute = execute
    result = orc.run(wf, {"round": 0}, run_id=run_id)
    print(result.status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
