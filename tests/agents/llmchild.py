"""A two-model-call agent for the crash tests, and its child process that SIGKILLs itself.

    python tests/agents/llmchild.py DB_URL RUN_ID KILL_AFTER

KILL_AFTER: "llm:N" dies right after the transaction holding the N-th (1-based) model call's
CallCompleted committed; "none" runs to the end. The model's base URL comes from AGENT_TEST_LLM_URL.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from orchestrator import Orchestrator
from orchestrator.agents import LLM
from workflows import END, Workflow

API_KEY = "sk-test-0123456789abcdefghijklmnop"
agent = Workflow("paid-agent")


def llm() -> LLM:
    return LLM(base_url=os.environ["AGENT_TEST_LLM_URL"], model="scripted-model", api_key=API_KEY)


@agent.step(start=True)
def think(ctx, state):
    model = llm()
    draft = model.chat(ctx, [{"role": "user", "content": f"Draft an answer to: {state['q']}"}])
    final = model.chat(ctx, [{"role": "user", "content": f"Improve this draft: {draft.content}"}])
    return {"draft": draft.content, "final": final.content}


@agent.step()
def finish(ctx, state):
    return {"done": True}


agent.edge("think", "finish")
agent.edge("finish", END)


def main(argv: list[str]) -> int:
    url, run_id, kill_after = argv
    orc = Orchestrator(url, workflows=[agent])
    append, seen = orc.store.append, []

    def append_then_maybe_die(run, events, **kw):
        out = append(run, events, **kw)
        for event in events:
            if event.kind == "CallCompleted" and json.loads(event.data)["kind"] == "llm":
                seen.append(event.seq)
                if kill_after == f"llm:{len(seen)}":
                    os.kill(os.getpid(), signal.SIGKILL)
        return out

    orc.store.append = append_then_maybe_die
    print(orc.run(agent, {"q": "why journal model calls?"}, run_id=run_id).status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
