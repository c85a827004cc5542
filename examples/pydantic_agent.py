"""A pydantic-ai agent made durable by agentsaga: killed mid-run, resumed, its bookings undone on failure.

    pip install 'agentsaga[pydantic-ai]'
    python examples/pydantic_agent.py                  # crash a run during a model request, resume it
    python examples/pydantic_agent.py --decline        # the payment fails: the agent's bookings are undone
    python examples/pydantic_agent.py --db postgresql://postgres@127.0.0.1:5432/test

Offline: the model is pydantic-ai's FunctionModel, answering from the conversation. The agent is
written as pydantic-ai agents are; AgentsagaDurability makes each model request and tool call a
durable call of the step that runs it. The first process is SIGKILLed during the agent's second
model request; a second process resumes the run: the first request and the weather tool are not
repeated (the ledger, kept outside the database, counts what the outside world saw).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

from orchestrator import Orchestrator
from orchestrator.contrib.pydantic_ai import AgentsagaDurability, tool_context
from workflows import END, Workflow

LEDGER = os.environ.get("PYDANTIC_AGENT_LEDGER")  # what the outside world saw, one JSON line each
CRASH = os.environ.get("PYDANTIC_AGENT_CRASH")  # "model:2" -> SIGKILL this process there
requests = 0


def seen(*what: object) -> None:
    if LEDGER:
        with open(LEDGER, "a", encoding="utf-8") as f:
            f.write(json.dumps(what) + "\n")


def model(messages, info) -> ModelResponse:
    """Weather first, then a hotel and a car in one answer, then a summary of what the tools said."""
    global requests
    requests += 1
    if CRASH == f"model:{requests}":
        os.kill(os.getpid(), signal.SIGKILL)
    answered = sum(1 for m in messages if isinstance(m, ModelResponse))
    seen("model request", answered + 1)
    if answered == 0:
        return ModelResponse(parts=[ToolCallPart("weather", {"city": "Lisbon"})])
    if answered == 1:
        return ModelResponse(parts=[ToolCallPart("book_hotel", {"city": "Lisbon"}),
                                    ToolCallPart("book_car", {"city": "Lisbon"})])
    said = [p.content for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    return ModelResponse(parts=[TextPart(f"Booked: {said[1]['ref']} and {said[2]['ref']}; it will be {said[0]}.")])


@dataclass
class Deps:
    """Live dependencies (a booking client, in real life): never journaled, made again on resume."""

    agency: str


def make_deps(ctx) -> Deps:
    return Deps(agency="offline-agency")


def cancel(tctx, record: dict) -> None:
    """Undo one booking; the key is the booking's own plus ':compensate'."""
    seen("cancel", record["tool"], record["result"]["ref"], tctx.idempotency_key)


durability = AgentsagaDurability(effects={"book_hotel": cancel, "book_car": cancel}, deps=make_deps)
agent = Agent(FunctionModel(model), name="travel", deps_type=Deps, capabilities=[durability])


@agent.tool_plain
def weather(city: str) -> str:
    seen("tool", "weather", city)
    return "sunny"


@agent.tool
def book_hotel(ctx: RunContext[Deps], city: str) -> dict:
    key = tool_context().idempotency_key  # send it to the service: a re-sent booking is recognised
    seen("tool", "book_hotel", city, key)
    return {"ref": f"hotel-{city.lower()}", "agency": ctx.deps.agency}


@agent.tool
def book_car(ctx: RunContext[Deps], city: str) -> dict:
    key = tool_context().idempotency_key
    seen("tool", "book_car", city, key)
    return {"ref": f"car-{city.lower()}", "agency": ctx.deps.agency}


trip = Workflow("pydantic-travel", version="1")


@trip.step(start=True, effect=True, compensate=durability.compensate)
async def plan(ctx, state):
    result = await agent.run(state["request"], deps=make_deps(ctx))  # durable: inside a step
    return {"plan": result.output}


@trip.step()
def pay(ctx, state):
    if state.get("decline"):
        raise RuntimeError("card declined")
    seen("pay")
    return {"paid": True}


trip.edge("plan", "pay")
trip.edge("pay", END)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temporary directory)")
    parser.add_argument("--decline", action="store_true", help="fail the payment: the bookings are undone")
    parser.add_argument("--child", nargs=3, metavar=("VERB", "DB", "RUN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    state = {"request": "Plan my weekend in Lisbon", "decline": args.decline}
    if args.child:  # a process of its own: the one that gets killed, then the one that resumes
        verb, db, run_id = args.child
        with Orchestrator(db, workflows=[trip]) as orc:
            result = orc.run(trip, state, run_id=run_id) if verb == "run" else orc.resume(run_id)
        print(json.dumps({"status": result.status, "state": result.state}))
        return 0
    work = tempfile.mkdtemp(prefix="pydantic-agent-")
    db = args.db or f"sqlite:///{work}/agent.db"
    ledger = os.path.join(work, "ledger.jsonl")
    env = dict(os.environ, PYDANTIC_AGENT_LEDGER=ledger)
    run_id = f"travel-{os.getpid()}"
    flags = ["--decline"] if args.decline else []
    child = subprocess.run([sys.executable, __file__, "--child", "run", db, run_id, *flags],
                           env={**env, "PYDANTIC_AGENT_CRASH": "model:2"})
    print(f"first process: killed by signal {-child.returncode} during the agent's second model request")
    resumed = subprocess.run([sys.executable, __file__, "--child", "resume", db, run_id, *flags], env=env,
                             capture_output=True, text=True)
    if resumed.returncode != 0:
        print(resumed.stderr, file=sys.stderr)
        return 1
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    print(f"second process: resumed the run, status {result['status']}")
    print(f"answer: {result['state'].get('plan')}")
    print("what the outside world saw (the ledger):")
    with open(ledger, encoding="utf-8") as f:
        for line in f:
            print("  " + " ".join(str(x) for x in json.loads(line)))
    print(f"the journal: agentsaga history {run_id} --db {db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
