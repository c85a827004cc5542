"""The explorer's workflows and their scenarios (what the outside world does while they wait).

Together they use retries, several requests per effect, parallel branches with a join, waits and
signals, a durable timer, compensation, rollback and the tool-calling loop. Every booking body
names its logical request (``{"room": "A"}``, ``{"hold": "v2"}``), independently of the engine's
keys, so the booking service's ledger can tell a duplicated effect from a new one.

The ``fanout`` flow's parallel branches are async steps that talk to the world with the sync
``ctx.http`` (the loop is not yielded inside them), so the order of its crash points is the same on
every run: crash point k is one reproducible moment. The ``threads`` flow runs its branches on real
threads instead: its number of crash points is fixed, their order between the threads is not. Each flow is built per exploration (``FLOWS[name](world)``): its steps
close over that exploration's world (service URL, clock, execution ledger).
"""

from __future__ import annotations

from typing import Any

from orchestrator import Orchestrator, RunResult
from orchestrator.agents import LLM, ToolContext, ToolRegistry, run_tool_loop
from orchestrator.testing import Reply, reply
from workflows import END, Retry, Workflow, reducers


class Flow:
    """A workflow, its input, the status an uninterrupted run ends in, and its outside world."""

    workflow: Workflow
    status: str

    def input(self, world: Any) -> dict[str, Any]:
        return {}

    def prepare(self, world: Any) -> None:
        """Set the outside world up before the first process starts."""

    def outside(self, world: Any, orc: Orchestrator, run_id: str) -> RunResult:
        """The run waits: act as the outside world does, and continue it."""
        raise AssertionError(f"workflow {self.workflow.name!r} does not wait")


def _cancel(world: Any, kind: str, field: str):
    """A compensation cancelling the booking(s) an effect step returned under ``field``, newest first."""
    def cancel(ctx, effect):
        ids = effect.result[field]
        for booking in reversed(ids if isinstance(ids, list) else [ids]):
            ctx.http.delete(f"{world.api}/{kind}/{booking}")
    return cancel


class Trip(Flow):
    """A three-booking saga: a flight, two rooms in one effect, a payment retried after a 503, then a
    step that fails for good, so the saga cancels all of it, newest first."""

    status = "compensated"

    def __init__(self, world: Any) -> None:
        wf = Workflow("trip", version="1")

        @wf.step(start=True, effect=True, resend=True, compensate=_cancel(world, "flights", "flight"))
        def flight(ctx, state):
            world.executed(ctx)
            booked = ctx.http.post(f"{world.api}/flights", json={"flight": "LIS"}).json()
            return {"flight": booked["id"]}

        @wf.step(effect=True, resend=True, compensate=_cancel(world, "hotels", "rooms"))
        def rooms(ctx, state):
            world.executed(ctx)
            a = ctx.http.post(f"{world.api}/hotels", json={"room": "A"}).json()["id"]
            b = ctx.http.post(f"{world.api}/hotels", json={"room": "B"}).json()["id"]
            return {"rooms": [a, b]}

        @wf.step(effect=True, resend=True, compensate=_cancel(world, "payments", "payment"),
                 retry=Retry(attempts=3, initial=5.0, jitter=False))
        def pay(ctx, state):
            world.executed(ctx)
            paid = ctx.http.post(f"{world.api}/payments", json={"amount": 420}).json()
            return {"payment": paid["id"]}

        @wf.step()
        def ship(ctx, state):
            world.executed(ctx)
            raise RuntimeError("the warehouse is closed")

        wf.edge("flight", "rooms")
        wf.edge("rooms", "pay")
        wf.edge("pay", "ship")
        wf.edge("ship", END)
        self.workflow = wf

    def prepare(self, world: Any) -> None:
        world.service.fail_payments(503, times=1)  # the first payment meets an outage: the step retries


class Fanout(Flow):
    """Parallel branches joined: a car booked (an effect) beside a durable quote, then a merge."""

    status = "completed"

    def __init__(self, world: Any) -> None:
        wf = Workflow("fanout", version="1", reducers={"log": reducers.append})

        @wf.step(start=True)
        def plan(ctx, state):
            world.executed(ctx)
            return {"log": "plan"}

        @wf.step(effect=True, resend=True)
        async def car(ctx, state):
            world.executed(ctx)
            booked = ctx.http.post(f"{world.api}/cars", json={"car": "compact"}).json()
            return {"car": booked["id"], "log": "car"}

        @wf.step()
        async def quote(ctx, state):
            world.executed(ctx)
            price = ctx.durable_call("quote", {"city": "Lisbon"}, lambda: 99)
            return {"quote": price, "log": "quote"}

        @wf.step()
        def merge(ctx, state):
            world.executed(ctx)
            return {"total": state["quote"] + 1, "log": "merge"}

        wf.edge("plan", "car")
        wf.edge("plan", "quote")
        wf.edge(["car", "quote"], "merge")
        wf.edge("merge", END)
        self.workflow = wf


class Threads(Flow):
    """Parallel sync branches on real threads, each an effect: when one branch's thread dies, its
    sibling is left running, and everything it does afterwards must be fenced off. The order of
    crash points between the two threads is the scheduler's: point k names a moment of this run."""

    status = "completed"

    def __init__(self, world: Any) -> None:
        wf = Workflow("threads", version="1")

        @wf.step(start=True)
        def split(ctx, state):
            world.executed(ctx)
            return {}

        @wf.step(effect=True, resend=True)
        def outbound(ctx, state):
            world.executed(ctx)
            return {"flight": ctx.http.post(f"{world.api}/flights", json={"flight": "out"}).json()["id"]}

        @wf.step(effect=True, resend=True)
        def rental(ctx, state):
            world.executed(ctx)
            return {"car": ctx.http.post(f"{world.api}/cars", json={"car": "rental"}).json()["id"]}

        @wf.step()
        def done(ctx, state):
            world.executed(ctx)
            return {"both": [state["flight"], state["car"]]}

        wf.edge("split", "outbound")
        wf.edge("split", "rental")
        wf.edge(["outbound", "rental"], "done")
        wf.edge("done", END)
        self.workflow = wf


class Approval(Flow):
    """A draft (its writer fails once: the step retries) held at a hotel, waiting for a human's
    approval: the reviewer first rolls it back with feedback (the hold is cancelled, a second draft
    is made and held), then approves; a durable timer cools off before the draft is published
    through ``ctx.http`` from a plain step."""

    status = "completed"

    def __init__(self, world: Any) -> None:
        wf = Workflow("approval", version="1")

        @wf.step(start=True, retry=Retry(attempts=3, initial=2.0, jitter=False))
        def draft(ctx, state):
            world.executed(ctx)
            version = f"v{state.get('feedback', 0) + 1}"
            text = ctx.durable_call("writer", {"version": version}, lambda: world.flaky("writer", f"draft {version}"))
            return {"draft": version, "text": text}

        @wf.step(effect=True, resend=True, compensate=_cancel(world, "hotels", "hold"))
        def hold(ctx, state):
            world.executed(ctx)
            held = ctx.http.post(f"{world.api}/hotels", json={"hold": state["draft"]}).json()
            return {"hold": held["id"]}

        @wf.step()
        def approve(ctx, state):
            world.executed(ctx)
            return {"approved_by": ctx.wait_for("approval")["by"]}

        @wf.step()
        def cool(ctx, state):
            world.executed(ctx)
            ctx.sleep(60)
            return {"cooled": True}

        @wf.step()
        def publish(ctx, state):
            world.executed(ctx)
            posted = ctx.http.post(f"{world.api}/cars", json={"publish": state["draft"]}).json()
            return {"published": posted["id"]}

        wf.edge("draft", "hold")
        wf.edge("hold", "approve")
        wf.edge("approve", "cool")
        wf.edge("cool", "publish")
        wf.edge("publish", END)
        self.workflow = wf

    def outside(self, world: Any, orc: Orchestrator, run_id: str) -> RunResult:
        history = orc.history(run_id)
        waiting = [e for e in history if e["kind"] in ("WaitStarted", "TimerStarted")][-1]
        if waiting["kind"] == "TimerStarted":
            world.clock.now = max(world.clock.now, waiting["data"]["wake_at"])  # the timer comes due
            return orc.resume(run_id)
        if not any(e["kind"] == "SagaStarted" and e["data"].get("reason") == "rollback" for e in history):
            # The reviewer rejects the first draft: back to before it, with feedback.
            return orc.rollback(run_id, to="draft", input={"feedback": 1})
        if not orc.store.signals.pending(run_id, "approval"):  # a sender that checks before re-sending
            orc.signal(run_id, "approval", {"by": "ann"})
        return orc.resume(run_id)


class Agent(Flow):
    """The tool-calling loop: the model books two venues through an effect tool, then the event is
    cancelled by a later step and the saga undoes the tools' bookings newest first."""

    status = "compensated"

    def __init__(self, world: Any) -> None:
        tools = ToolRegistry()
        api = world.api

        def cancel(tctx: ToolContext, record: dict) -> None:
            tctx.http.delete(f"{api}/hotels/{record['result']['id']}")

        @tools.tool(effect=True, compensate=cancel)
        def book(tctx: ToolContext, venue: str) -> dict:
            """Book a venue."""
            return tctx.http.post(f"{api}/hotels", json={"venue": venue}).json()

        llm = LLM(base_url=world.chat_url, model="scripted", max_attempts=1, breaker=False)
        wf = Workflow("agent", version="1")

        @wf.step(start=True, effect=True, resend=True, compensate=tools.compensate)
        def reserve(ctx, state):
            world.executed(ctx)
            out = run_tool_loop(ctx, llm, "book two venues", tools)
            return out.update(answer=out.content)

        @wf.step()
        def confirm(ctx, state):
            world.executed(ctx)
            raise RuntimeError("the client called the event off")

        wf.edge("reserve", "confirm")
        wf.edge("confirm", END)
        self.workflow = wf


def chat_script(request: dict[str, Any], n: int) -> Any:
    """The model, answering from the conversation: the same answers whatever was replayed before."""
    if any(m.get("role") == "tool" for m in request.get("messages", [])):
        return reply("booked both venues")
    return Reply(tool_calls=[{"name": "book", "arguments": {"venue": "Alfama Hall"}, "id": "call_alfama"},
                             {"name": "book", "arguments": {"venue": "Belem Loft"}, "id": "call_belem"}])


FLOWS: dict[str, type[Flow]] = {"trip": Trip, "fanout": Fanout, "threads": Threads, "approval": Approval,
                                "agent": Agent}
