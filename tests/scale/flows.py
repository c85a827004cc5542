"""Workflows the scale tests enqueue and their worker processes import (as ``tests/scale/flows.py:NAME``).

Inputs carry what a test varies: ``api`` (the booking service's URL), ``pause`` (seconds each
step sleeps) and ``gate`` (a file path: a step given one waits until the test creates the file,
so that the test, not the machine's speed, decides when the step ends; see ``gated`` below).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from workflows import END, Retry, Workflow, reducers


def wait_for_gate(path: str) -> None:
    """Block until the file ``path`` exists (the test creates it when it is ready for the step to end)."""
    while not os.path.exists(path):
        time.sleep(0.01)


# -- mixed: a plain step, two parallel branches (one an effect), a join, a final effect -------------
mixed = Workflow("mixed", reducers={"log": reducers.append})


@mixed.step(start=True)
def plan(ctx, state):
    if "gate" in state:
        wait_for_gate(state["gate"])
    time.sleep(state.get("pause", 0))
    return {"log": "plan"}


# resend=True: these effects reach the world only through ctx.http, which sends the step's key with
# every request, so re-sending one whose outcome is unknown is always recognised by the service; a
# worker killed before the first request would otherwise leave the effect in doubt (docs/sagas.md).
@mixed.step(effect=True, resend=True, retry=Retry(attempts=5, initial=0.05, max_backoff=0.5))
def flight(ctx, state):
    r = ctx.http.post(f"{state['api']}/flights", json={"to": state["city"]})
    time.sleep(state.get("pause", 0))
    return {"flight": r.json()["id"], "log": "flight"}


@mixed.step()
def notes(ctx, state):
    time.sleep(state.get("pause", 0))
    return {"log": "notes"}


@mixed.step(effect=True, resend=True, retry=Retry(attempts=5, initial=0.05, max_backoff=0.5))
def hotel(ctx, state):
    r = ctx.http.post(f"{state['api']}/hotels", json={"city": state["city"]})
    return {"hotel": r.json()["id"], "log": "hotel"}


mixed.edge("plan", "flight")
mixed.edge("plan", "notes")
mixed.edge(["flight", "notes"], "hotel")
mixed.edge("hotel", END)

# -- slow: one effect that, after its request was answered, waits for a gate (SIGSTOP lands inside it) --
slow = Workflow("slow")


@slow.step(start=True, effect=True)
def book(ctx, state):
    r = ctx.http.post(f"{state['api']}/flights", json={"to": "Oslo"})
    wait_for_gate(state["gate"])
    return {"flight": r.json()["id"]}


slow.edge("book", END)

# -- fanout: three parallel calls to the service per run (for limits on in-flight calls) ------------
fanout = Workflow("fanout", reducers={"ids": reducers.append})


@fanout.step(start=True)
def start(ctx, state):
    if "gate" in state:
        wait_for_gate(state["gate"])
    return {}


def _call(kind):
    def call(ctx, state):
        r = ctx.http.post(f"{state['api']}/{kind}", json={"n": state.get("n", 0)})
        return {"ids": r.json()["id"]}

    call.__name__ = kind
    return call


for _kind in ("flights", "hotels", "cars"):
    fanout.step(name=_kind)(_call(_kind))
    fanout.edge("start", _kind)
    fanout.edge(_kind, END)

# -- steps: ten trivial steps (the benchmark's unit of work) ---------------------------------------------
ten = Workflow("ten")


@ten.step(start=True)
def s0(ctx, state):
    return {"i": 1}


for _i in range(1, 10):
    def _step(ctx, state):
        return {"i": state["i"] + 1}

    _step.__name__ = f"s{_i}"
    ten.step(name=f"s{_i}")(_step)
    ten.edge(f"s{_i - 1}", f"s{_i}")
ten.edge("s9", END)

# -- poison: kills whatever process drives it --------------------------------------------------------------
poison = Workflow("poison")


@poison.step(start=True)
def die(ctx, state):
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


poison.edge("die", END)

# -- lingering: a step that sleeps (a worker stopped meanwhile must finish or hand it back) -------------
lingering = Workflow("lingering")


@lingering.step(start=True)
def first(ctx, state):
    time.sleep(state.get("pause", 0))
    return {"first": True}


@lingering.step()
def second(ctx, state):
    time.sleep(state.get("pause", 0))
    return {"second": True}


lingering.edge("first", "second")
lingering.edge("second", END)

# -- gated: a first step that waits for a file the test creates ------------------------------------------
# Tests that need runs to be *inside* a step at some moment (to see two workers each holding runs, or
# to stop a worker while its runs are mid-step) hold them there on a gate instead of a sleep: a sleep
# only bets that the machine is fast enough, a gate makes the moment certain. The wait is an await,
# so a worker that hands its runs back at shutdown cancels it (a sync step could not be interrupted).
gated = Workflow("gated")


@gated.step(name="first", start=True)
async def _gated_first(ctx, state):
    gate = Path(state["gate"])
    gate.with_name(f"{gate.name}.inside.{ctx.run_id}").touch()  # the test sees the step has begun
    while not gate.exists():
        await asyncio.sleep(0.01)
    return {"first": True}


@gated.step(name="second")
def _gated_second(ctx, state):
    return {"second": True}


gated.edge("first", "second")
gated.edge("second", END)


# -- held_inline / held_thread: a sync step that waits for a gate, inline or on a thread ----------------
# To stop a worker while a step it cannot interrupt still runs: alone in its tick with no timeout the
# step runs inline on its slot's loop; with a timeout it runs on a thread. The step marks when it is
# inside and when it returns, so a test sees both moments instead of guessing them.
def _held(ctx, state):
    gate = Path(state["gate"])
    gate.with_name(f"{gate.name}.inside.{ctx.run_id}").touch()
    wait_for_gate(state["gate"])
    gate.with_name(f"{gate.name}.returned.{ctx.run_id}").touch()
    return {"held": True}


def _after(ctx, state):
    return {"after": True}


held_inline = Workflow("held_inline")
held_inline.step(name="hold", start=True)(_held)
held_inline.step(name="after")(_after)
held_inline.edge("hold", "after")
held_inline.edge("after", END)

held_thread = Workflow("held_thread")
held_thread.step(name="hold", start=True, timeout=600)(_held)
held_thread.step(name="after")(_after)
held_thread.edge("hold", "after")
held_thread.edge("after", END)
