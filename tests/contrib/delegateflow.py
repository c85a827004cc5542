"""A pydantic-ai agent whose tool delegates to another agent, inside an agentsaga step, for the
delegation tests and their child process.

The ``planner`` asks for its ``research`` tool, which runs the ``researcher`` agent: the
researcher asks for its ``lookup`` tool, then answers; the planner answers from that. Both models
are pydantic-ai's offline ``FunctionModel``, answering from the conversation alone. What the
outside world would see (a model request answered, a lookup made, with its key) is appended to the
ledger file named by ``AGENTSAGA_TEST_LEDGER``; ``AGENTSAGA_TEST_KILL=AGENT:N`` makes this process
SIGKILL itself when the N-th request of that agent in this process starts.

    python tests/contrib/delegateflow.py DB_URL RUN_ID run|resume
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from orchestrator import Orchestrator
from orchestrator.contrib.pydantic_ai import AgentsagaDurability, tool_context
from workflows import END, Workflow

_started: Counter[str] = Counter()  # model requests each agent started in this process


def ledger(*entry: object) -> None:
    with open(os.environ["AGENTSAGA_TEST_LEDGER"], "a", encoding="utf-8") as f:
        f.write(json.dumps(list(entry)) + "\n")


def _request(agent: str, messages: list[ModelMessage]) -> tuple[str, list[ToolReturnPart]]:
    _started[agent] += 1
    if os.environ.get("AGENTSAGA_TEST_KILL") == f"{agent}:{_started[agent]}":
        os.kill(os.getpid(), signal.SIGKILL)
    prompt = messages[0].parts[-1].content
    returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    ledger(agent, len([m for m in messages if isinstance(m, ModelResponse)]) + 1, prompt)
    return str(prompt), returns


def researcher_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt, returns = _request("researcher", messages)
    if not returns:
        return ModelResponse(parts=[ToolCallPart("lookup", {"q": prompt}, tool_call_id="l1")])
    return ModelResponse(parts=[TextPart(f"{prompt}: {returns[0].content}")])


def planner_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompt, returns = _request("planner", messages)
    if not returns:
        return ModelResponse(parts=[ToolCallPart("research", {"topic": "Lisbon"}, tool_call_id="r1")])
    return ModelResponse(parts=[TextPart(f"plan for {prompt!r} from {returns[0].content}")])


researcher = Agent(FunctionModel(researcher_model), name="researcher", capabilities=[AgentsagaDurability()])
planner = Agent(FunctionModel(planner_model), name="planner", capabilities=[AgentsagaDurability()])


@researcher.tool_plain
def lookup(q: str) -> str:
    ledger("lookup", q, tool_context().idempotency_key)
    return "seven hills"


@planner.tool_plain
async def research(topic: str) -> str:
    result = await researcher.run(f"research {topic}")  # the delegate: durable inside this tool's call
    return result.output


delegating = Workflow("delegating")


@delegating.step(start=True)
async def plan(ctx, state):
    result = await planner.run(state["prompt"])
    return {"answer": result.output}


delegating.edge("plan", END)


def main(argv: list[str]) -> int:
    url, run_id, verb = argv
    with Orchestrator(url, workflows=[delegating]) as orc:
        if verb == "run":
            result = orc.run(delegating, {"prompt": "a day in Lisbon"}, run_id=run_id)
        else:
            result = orc.resume(run_id)
    print(json.dumps({"status": result.status, "state": result.state, "error": result.error}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
