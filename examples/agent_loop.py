"""An agent loop that survives SIGKILL: plan -> act (two searches in parallel) -> observe -> decide.

    python examples/agent_loop.py                 # crash a run midway, resume it, show the journal
    python examples/agent_loop.py --db postgresql://postgres@127.0.0.1:5432/test

The tools are deterministic stand-ins (no network), so the run's result is always the same. What
the example shows: the first process is killed with SIGKILL while a step is running; a second
process resumes the run by id, the completed steps are not executed again (see the ledger: one line
per execution, kept outside the database), and the final state equals an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from orchestrator import Orchestrator
from workflows import END, Retry, Workflow, reducers

agent = Workflow(
    "research-loop",
    version="1",
    reducers={"notes": reducers.append},
    description="plan, search two sources in parallel, observe, decide whether to search again",
)

LEDGER = os.environ.get("AGENT_LOOP_LEDGER")  # where each step execution is counted
CRASH_AT = os.environ.get("AGENT_LOOP_CRASH_AT")  # "step:visit" -> SIGKILL this process there


def executed(ctx, step: str) -> None:
    """Count the execution in the ledger, and die here if this is the chosen crash point."""
    if LEDGER:
        with open(LEDGER, "a", encoding="utf-8") as fh:
            fh.write(f"{step}\n")
            fh.flush()
            os.fsync(fh.fileno())
    if CRASH_AT == f"{step}:{ctx.attempt}:{_visits(step)}":
        os.kill(os.getpid(), signal.SIGKILL)


def _visits(step: str) -> int:
    if not LEDGER or not Path(LEDGER).exists():
        return 0
    return Path(LEDGER).read_text(encoding="utf-8").split().count(step)


@agent.step(start=True)
def plan(ctx, state):
    executed(ctx, "plan")
    question = state["question"]
    ctx.trace("split the question into two searches", question=question)
    return {"queries": [f"{question} overview", f"{question} details"], "round": 0}


@agent.step(retry=Retry(attempts=3, initial=0.01, max_backoff=0.05))
def search_web(ctx, state):
    executed(ctx, "search_web")
    query = state["queries"][state["round"] % len(state["queries"])]
    ctx.trace("searched the web", query=query)
    return {"notes": f"web: {len(query)} results for {query!r} (round {state['round']})"}


@agent.step(retry=Retry(attempts=3, initial=0.01, max_backoff=0.05))
async def search_docs(ctx, state):
    executed(ctx, "search_docs")
    query = state["queries"][-1]
    ctx.trace("searched the docs", query=query)
    return {"notes": f"docs: {sum(map(ord, query)) % 7} pages for {query!r} (round {state['round']})"}


@agent.step()
def observe(ctx, state):
    executed(ctx, "observe")
    ctx.trace("read what the searches found", notes=len(state["notes"]))
    return {"round": state["round"] + 1}


@agent.step()
def answer(ctx, state):
    executed(ctx, "answer")
    ctx.trace("enough evidence; writing the answer")
    return {"answer": f"{state['question']}: {len(state['notes'])} notes over {state['round']} rounds"}


def decide(state):
    """Search again until three rounds are done."""
    return "act" if state["round"] < 3 else "answer"


@agent.step()
def act(ctx, state):
    executed(ctx, "act")
    return None


agent.edge("plan", "act")
agent.edge("act", "search_web")          # two edges from one step: a parallel fan-out
agent.edge("act", "search_docs")
agent.edge(["search_web", "search_docs"], "observe")   # a join: observe waits for both
agent.route("observe", decide, targets=["act", "answer"])
agent.edge("answer", END)


def run_child(db: str, run_id: str, ledger: str, crash_at: str | None) -> int:
    env = dict(os.environ, AGENT_LOOP_LEDGER=ledger)
    if crash_at:
        env["AGENT_LOOP_CRASH_AT"] = crash_at
    cmd = [sys.executable, __file__, "--db", db, "--run-id", run_id, "--child"]
    return subprocess.run(cmd, env=env).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default=None, help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--run-id", default="research-1")
    parser.add_argument("--crash-at", default="search_docs:1:3", help="step:attempt:visit to SIGKILL at")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:  # the process that gets killed
        with Orchestrator(args.db, workflows=[agent]) as orc:
            res = orc.run(agent, {"question": "why do agents need durable runs"}, run_id=args.run_id)
            print(f"child finished: {res.status}")
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="agentsaga-demo-"))
    db = args.db or f"sqlite:///{workdir / 'agent.db'}"
    ledger = str(workdir / "ledger.txt")
    run_id = args.run_id if args.db is None else f"{args.run_id}-{os.getpid()}"
    print(f"database: {db}\nledger:   {ledger}\n")

    print(f"1. starting run {run_id!r}; the process will be killed inside step {args.crash_at}")
    code = run_child(db, run_id, ledger, args.crash_at)
    print(f"   child exited with {code} ({'SIGKILL' if code == -signal.SIGKILL else 'no crash'})")
    before = Counter(Path(ledger).read_text().split())

    print(f"2. resuming run {run_id!r} in this process")
    os.environ["AGENT_LOOP_LEDGER"] = ledger
    globals()["LEDGER"] = ledger
    with Orchestrator(db, workflows=[agent]) as orc:
        res = orc.resume(run_id)
        history = orc.history(run_id)
    after = Counter(Path(ledger).read_text().split())

    print(f"   status: {res.status}\n   answer: {res.state.get('answer')}\n")
    completed = Counter(e["data"]["step"] for e in history if e["kind"] == "StepCompleted")
    print(f"{'step':<12} {'completed':>9} {'executed':>9}  (executions before the crash + after)")
    for step in ["plan", "act", "search_web", "search_docs", "observe", "answer"]:
        print(f"{step:<12} {completed[step]:>9} {after[step]:>9}  ({before[step]} + {after[step] - before[step]})")
    extra = sum(after.values()) - sum(completed.values())
    print(f"\nexecutions beyond completions: {extra} (steps that were running when the process died)")
    print(f"journal: {len(history)} events; try `agentsaga runs --db {db}`")
    return 0 if res.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
