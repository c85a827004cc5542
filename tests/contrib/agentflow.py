"""A pydantic-ai trip agent inside an agentsaga workflow, for the contrib tests and their child process.

The model is pydantic-ai's offline ``FunctionModel``; it answers from the conversation alone, so
any process asking the same question gets the same answer. Everything the outside world would see
(a model request answered, a tool that ran, a booking undone) is appended to a ledger file named by
``AGENTSAGA_TEST_LEDGER``, outside the database, so a test counts side effects instead of trusting
the journal. ``AGENTSAGA_TEST_KILL`` makes this process SIGKILL itself at a chosen point:

- ``model:N``: when the N-th model request of the process starts (before it is answered);
- ``tool:NAME``: when tool NAME starts (before it does anything).

    python tests/contrib/agentflow.py DB_URL RUN_ID run|resume SCENARIO [PROMPT]
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from orchestrator import Orchestrator
from orchestrator.contrib.pydantic_ai import AgentsagaDurability, tool_context
from workflows import END, Workflow

_requests = 0  # model requests this process started
OUTAGE_AT: int | None = None  # a test sets it: the model request with this number raises


def ledger(*entry: object) -> None:
    path = os.environ.get("AGENTSAGA_TEST_LEDGER")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps([*entry, os.getpid()]) + "\n")


def read_ledger(path: str, *, pids: bool = False) -> list[list[object]]:
    """The ledger's entries, each without (or with, last) the pid of the process that wrote it."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        entries = [json.loads(line) for line in f if line.strip()]
    return entries if pids else [e[:-1] for e in entries]


def _maybe_die(point: str) -> None:
    if os.environ.get("AGENTSAGA_TEST_KILL") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]


def trip_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for the weather, then books (two tools in one answer), then answers from the results."""
    global _requests
    _requests += 1
    _maybe_die(f"model:{_requests}")
    answered = sum(1 for m in messages if isinstance(m, ModelResponse))
    prompt = messages[0].parts[-1].content  # the user's prompt
    if OUTAGE_AT == answered + 1:
        raise RuntimeError("model outage")
    ledger("model", answered + 1, prompt)
    returns = _returns(messages)
    if answered == 0:
        return ModelResponse(parts=[ToolCallPart("weather", {"city": "Lisbon"}, tool_call_id="w1")])
    if answered == 1 and "book" in str(prompt):
        return ModelResponse(parts=[ToolCallPart("book_hotel", {"city": "Lisbon"}, tool_call_id="h1"),
                                    ToolCallPart("book_car", {"city": "Lisbon"}, tool_call_id="c1")])
    facts = "; ".join(f"{r.tool_name}={json.dumps(r.content, sort_keys=True)}" for r in returns)
    return ModelResponse(parts=[TextPart(f"answer to {prompt!r} from {facts}")])


@dataclass
class Deps:
    """Live dependencies: never journaled, made again by whichever process runs the step."""

    pid: int
    city_code: str


def make_deps(ctx: object) -> Deps:
    return Deps(pid=os.getpid(), city_code="LIS")


def cancel(tctx, record: dict) -> None:
    """Undo one booking: the ledger says which, with the key the service would get."""
    ledger("cancel", record["tool"], record["key"], tctx.idempotency_key, tctx.deps.city_code)


durability = AgentsagaDurability(effects={"book_hotel": cancel, "book_car": cancel}, deps=make_deps)
agent = Agent(FunctionModel(trip_model), name="trip", deps_type=Deps, capabilities=[durability])


@agent.tool
def weather(ctx: RunContext[Deps], city: str) -> str:
    ledger("tool", "weather", city)
    return f"sunny in {city}"


@agent.tool
def book_hotel(ctx: RunContext[Deps], city: str) -> dict:
    _maybe_die("tool:book_hotel")
    key = tool_context().idempotency_key
    ledger("tool", "book_hotel", city, key, ctx.deps.pid)
    return {"hotel": f"H-{ctx.deps.city_code}", "key": key}


@agent.tool
def book_car(ctx: RunContext[Deps], city: str) -> dict:
    _maybe_die("tool:book_car")
    key = tool_context().idempotency_key
    ledger("tool", "book_car", city, key, ctx.deps.pid)
    return {"car": f"C-{ctx.deps.city_code}", "key": key}


trip = Workflow("pydantic-trip")
PROMPT_SUFFIX = ""  # a test changes it to stand for a prompt changed in the code


@trip.step(start=True, effect=True, compensate=durability.compensate)
async def plan(ctx, state):
    result = await agent.run(state["prompt"] + PROMPT_SUFFIX, deps=make_deps(ctx), run_id=state.get("agent_run_id"))
    if state.get("wait"):
        ctx.wait_for("go")  # parks the run; when it wakes, the step runs again from its first line
    return {"answer": result.output}


@trip.step()
def pay(ctx, state):
    if state.get("decline"):
        raise RuntimeError("card declined")
    ledger("pay")
    return {"paid": True}


trip.edge("plan", "pay")
trip.edge("pay", END)


def main(argv: list[str]) -> int:
    url, run_id, verb, *rest = argv
    with Orchestrator(url, workflows=[trip]) as orc:
        if verb == "run":
            state = json.loads(rest[0])
            result = orc.run(trip, state, run_id=run_id)
        else:
            result = orc.resume(run_id)
    print(json.dumps({"status": result.status, "state": result.state, "error": result.error}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
