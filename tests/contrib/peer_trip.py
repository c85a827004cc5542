"""One agent script, made durable by DBOS's pydantic-ai integration or by agentsaga's, for comparing their call logs.

    python tests/contrib/peer_trip.py dbos|agentsaga DB_URL RUN_ID run|recover

The agent, its model (tests/contrib/agentflow.py's ``trip_model``) and its tools are the same
under both engines; only the capability and the durable container differ (a ``@DBOS.workflow``,
an agentsaga step). The model requests answered and tools run go to the ledger file named by
``AGENTSAGA_TEST_LEDGER``; ``AGENTSAGA_TEST_KILL=model:2`` SIGKILLs the process during the
second model request, and ``recover`` lets each engine finish the interrupted run.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

from agentflow import ledger, trip_model  # noqa: E402

PROMPT = "book a trip to Lisbon"


def tools(agent: Agent) -> Agent:
    @agent.tool_plain
    def weather(city: str) -> str:
        ledger("tool", "weather", city)
        return f"sunny in {city}"

    @agent.tool_plain
    def book_hotel(city: str) -> dict:
        ledger("tool", "book_hotel", city)
        return {"hotel": f"H-{city[:3].upper()}"}

    @agent.tool_plain
    def book_car(city: str) -> dict:
        ledger("tool", "book_car", city)
        return {"car": f"C-{city[:3].upper()}"}

    return agent


def under_dbos(url: str, run_id: str, verb: str) -> str:
    from dbos import DBOS, DBOSConfig, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    DBOS(config=DBOSConfig(name="peer-trip", system_database_url=url))
    agent = tools(Agent(FunctionModel(trip_model), name="trip", capabilities=[DBOSDurability()]))

    @DBOS.workflow()
    async def trip(prompt: str) -> str:
        return (await agent.run(prompt)).output

    async def main() -> str:
        DBOS.launch()  # recovers this executor's interrupted workflows
        try:
            if verb == "run":
                with SetWorkflowID(run_id):
                    return await trip(PROMPT)
            handle = await DBOS.retrieve_workflow_async(run_id)
            return await handle.get_result()
        finally:
            DBOS.destroy()

    return asyncio.run(main())


def under_agentsaga(url: str, run_id: str, verb: str) -> str:
    from orchestrator import Orchestrator
    from orchestrator.contrib.pydantic_ai import AgentsagaDurability
    from workflows import END, Workflow

    agent = tools(Agent(FunctionModel(trip_model), name="trip", capabilities=[AgentsagaDurability()]))
    flow = Workflow("peer-trip")

    @flow.step(start=True)
    async def trip(ctx, state):
        return {"answer": (await agent.run(state["prompt"])).output}

    flow.edge("trip", END)
    with Orchestrator(url, workflows=[flow]) as orc:
        result = orc.run(flow, {"prompt": PROMPT}, run_id=run_id) if verb == "run" else orc.resume(run_id)
    return result.state["answer"]


if __name__ == "__main__":
    engine, url, run_id, verb = sys.argv[1:]
    print(json.dumps({"output": (under_dbos if engine == "dbos" else under_agentsaga)(url, run_id, verb)}))
