"""The workflow bench/agents.py's takeover measurement gives worker processes (``bench/_agents_flows.py:held``).

``held``: a first step that says it has begun (a file beside the gate) and then waits for the gate
file, so a worker can be SIGKILLed while it holds the run mid-step; a second trivial step.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from workflows import END, Workflow

held = Workflow("held")


@held.step(name="first", start=True)
async def _first(ctx, state):
    gate = Path(state["gate"])
    gate.with_name(f"{gate.name}.inside.{ctx.run_id}").touch()
    while not gate.exists():
        await asyncio.sleep(0.01)
    return {"first": True}


@held.step(name="second")
def _second(ctx, state):
    return {"second": True}


held.edge("first", "second")
held.edge("second", END)
