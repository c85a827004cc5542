"""A tool-calling agent whose tool asks the model twice, for the nested crash tests, and its child
process that SIGKILLs itself.

    python tests/agents/nestedchild.py DB_URL RUN_ID KILL_AFTER

The step runs the tool loop (model call 0 asks for the ``look`` tool, call 1 is the tool, which
asks the model twice: calls 1.0 and 1.1; call 2 is the loop's answer) and then asks for a summary
(call 3). KILL_AFTER: ``call:POSITION`` dies right after the transaction holding the CallCompleted
at that position committed; ``none`` runs to the end. The model's base URL comes from
AGENT_TEST_LLM_URL; each time the tool starts it appends a line to AGENT_TEST_TOOL_LEDGER.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from orchestrator import Orchestrator
from orchestrator.agents import LLM, ToolContext, ToolRegistry, run_tool_loop
from orchestrator.testing import Reply, reply
from workflows import END, Workflow

API_KEY = "sk-test-0123456789abcdefghijklmnop"
agent = Workflow("nested-agent")
tools = ToolRegistry()


def llm() -> LLM:
    return LLM(base_url=os.environ["AGENT_TEST_LLM_URL"], model="scripted-model", api_key=API_KEY)


@tools.tool
def look(tctx: ToolContext, city: str) -> dict:
    """Look around a city."""
    with open(os.environ["AGENT_TEST_TOOL_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(f"look {city} {os.getpid()}\n")
    model = llm()
    old_town = model.chat(tctx.step, f"describe the old town of {city}").content
    river = model.chat(tctx.step, f"describe the river of {city}").content
    return {"old town": old_town, "river": river}


@agent.step(start=True)
def research(ctx, state):
    model = llm()
    out = run_tool_loop(ctx, model, f"research {state['city']}", tools)
    summary = model.chat(ctx, f"summarise: {out.content}").content
    return {"answer": out.content, "summary": summary, "looked": out.calls[0]["result"]}


agent.edge("research", END)


def script(body: dict, n: int) -> Reply:
    """The model, answering from the conversation alone: any process asking gets the same answer."""
    messages = body["messages"]
    first = messages[0]["content"]
    if first.startswith("describe the "):
        return reply(first.removeprefix("describe the ").replace(" of ", " in ") + ": lovely")
    if first.startswith("summarise: "):
        return reply(f"in short: {first.removeprefix('summarise: ')}")
    if any(m["role"] == "tool" for m in messages):
        return reply("researched " + first.removeprefix("research "))
    return Reply(tool_calls=[{"name": "look", "arguments": {"city": "Lisbon"}, "id": "call_look"}])


def main(argv: list[str]) -> int:
    url, run_id, kill_after = argv
    orc = Orchestrator(url, workflows=[agent])
    append = orc.store.append

    def append_then_maybe_die(run, events, **kw):
        out = append(run, events, **kw)
        for event in events:
            if event.kind == "CallCompleted" and kill_after == f"call:{json.loads(event.data)['index']}":
                os.kill(os.getpid(), signal.SIGKILL)
        return out

    orc.store.append = append_then_maybe_die
    print(orc.run(agent, {"city": "Lisbon"}, run_id=run_id).status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
