"""The explorer's workflows and their scenarios (what the outside world does while they wait).

Together they use retries, several requests per effect, parallel branches with a join, waits and
signals, a durable timer, compensation, rollback, a failure route with a router, the
tool-calling loop, answers too large to journal and timed steps. Every booking body names its logical request (``{"room": "A"}``,
``{"hold": "v2"}``), independently of the engine's keys, so the booking service's ledger can tell a
duplicated effect from a new one.

Every flow but ``agent`` comes in three *variants*, which only change the rule that settles an effect
left in doubt by a crash (docs/sagas.md, "In-doubt effects"): ``resend`` (its effect steps declare
``resend=True``: what the sweeps of test_sweep.py run), ``check`` (a ``check`` hook looks the step's
bookings up in the service's ledger, ``GET /ledger``, by the keys ``ctx.http`` sends) and
``default`` (neither: an effect whose intent was durable when the process died, and whose key had
not been journaled as issued, is failed as in doubt with ``InDoubtError``), built as
``FLOWS[name](world, variant=...)``. ``agent``'s step hands its bookings to a tool loop whose update
only the loop can build, so it has no ``check`` variant.

The ``fanout`` flow's parallel branches are async steps that talk to the world with the sync
``ctx.http`` (the loop is not yielded inside them), so the order of its crash points is the same on
every run: crash point k is one reproducible moment. The ``threads`` flow runs its branches on real
threads instead: its number of crash points is fixed, their order between the threads is not.
Each flow is built per exploration (``FLOWS[name](world)``): its steps close over that
exploration's world (service URL, clock, execution ledger).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
from explorer_harness import ExplorerService

from orchestrator import Orchestrator, RunResult, WaitTimeoutError
from orchestrator.agents import LLM, ToolContext, ToolRegistry, run_tool_loop
from orchestrator.errors import PermanentToolError
from orchestrator.testing import Reply, reply
from workflows import END, Retry, Workflow, reducers


#: the in-doubt rules an effect step can follow (see the module docstring)
VARIANTS = ("resend", "check", "default")


class Flow:
    """A workflow, its input, the status an uninterrupted run ends in, and its outside world."""

    workflow: Workflow
    status: str
    #: the variants the flow comes in
    variants: tuple[str, ...] = VARIANTS
    #: whether crash point k is the same moment on every run (False: the scheduler orders some points)
    deterministic = True

    def input(self, world: Any) -> dict[str, Any]:
        return {}

    def prepare(self, world: Any) -> None:
        """Set the outside world up before the first process starts."""

    def outside(self, world: Any, orc: Orchestrator, run_id: str) -> RunResult:
        """The run waits: act as the outside world does, and continue it."""
        raise AssertionError(f"workflow {self.workflow.name!r} does not wait")

    @classmethod
    def doubt_routed(cls, state: dict[str, Any], step: str) -> dict[str, Any]:
        """The final state when ``step``'s effect, failed as in doubt, took its failure route (the
        uninterrupted run ended in ``state``)."""
        raise AssertionError(f"{cls.__name__} has no failure route from an effect")


def rule(variant: str, check: Callable[..., Any]) -> dict[str, Any]:
    """The options an effect step declares in ``variant``: how an attempt left in doubt is settled."""
    if variant == "resend":
        return {"resend": True}
    if variant == "check":
        return {"check": check}
    if variant == "default":
        return {}
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def booked(world: Any, ctx: Any, *bodies: dict[str, Any], at: tuple[int, ...] | None = None) -> list[str] | None:
    """A check hook's look-up: the ids of the bookings a step's requests made, found in the service's
    ledger (``GET /ledger``, an outgoing call of the process that recovers) by the key ``ctx.http``
    sent with each (request i of the execution carries ``key`` for i == 0, else ``key:i``); None when
    one of them is not there (the step then runs again with the same key, and the requests that
    went out are answered from the journal or replayed by the service). ``at``: the positions of the
    bodies' requests among the execution's, when other requests come between them (by default 0, 1...).

    A booking under one of those keys for another request is not this step's: the hook raises
    (the engine then fails the step as in doubt, visibly)."""
    key = ctx.idempotency_key
    entries = httpx.get(f"{world.api}/ledger", timeout=30.0).json()
    made = {e["idempotency_key"]: e for e in entries if e["action"] == "book"}
    ids = []
    for i, body in zip(at or range(len(bodies)), bodies, strict=True):
        entry = made.get(key if i == 0 else f"{key}:{i}")
        if entry is None:
            return None
        if entry["body"] != body:
            raise RuntimeError(f"the booking made with key {entry['idempotency_key']!r} is {entry['body']}, "
                               f"not this step's request {body}")
        ids.append(entry["id"])
    return ids


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

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("trip", version="1")

        def flight_done(ctx, state):
            found = booked(world, ctx, {"flight": "LIS"})
            return found and {"flight": found[0]}

        def rooms_done(ctx, state):
            found = booked(world, ctx, {"room": "A"}, {"room": "B"})
            return found and {"rooms": found}

        def pay_done(ctx, state):
            found = booked(world, ctx, {"amount": 420})
            return found and {"payment": found[0]}

        @wf.step(start=True, effect=True, compensate=_cancel(world, "flights", "flight"), **rule(variant, flight_done))
        def flight(ctx, state):
            world.executed(ctx)
            booked = ctx.http.post(f"{world.api}/flights", json={"flight": "LIS"}).json()
            return {"flight": booked["id"]}

        @wf.step(effect=True, compensate=_cancel(world, "hotels", "rooms"), **rule(variant, rooms_done))
        def rooms(ctx, state):
            world.executed(ctx)
            a = ctx.http.post(f"{world.api}/hotels", json={"room": "A"}).json()["id"]
            b = ctx.http.post(f"{world.api}/hotels", json={"room": "B"}).json()["id"]
            return {"rooms": [a, b]}

        @wf.step(effect=True, compensate=_cancel(world, "payments", "payment"),
                 retry=Retry(attempts=3, initial=5.0, jitter=False), **rule(variant, pay_done))
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

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("fanout", version="1", reducers={"log": reducers.append})

        def car_done(ctx, state):
            found = booked(world, ctx, {"car": "compact"})
            return found and {"car": found[0], "log": "car"}

        @wf.step(start=True)
        def plan(ctx, state):
            world.executed(ctx)
            return {"log": "plan"}

        @wf.step(effect=True, **rule(variant, car_done))
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
    deterministic = False

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("threads", version="1")

        def outbound_done(ctx, state):
            found = booked(world, ctx, {"flight": "out"})
            return found and {"flight": found[0]}

        def rental_done(ctx, state):
            found = booked(world, ctx, {"car": "rental"})
            return found and {"car": found[0]}

        @wf.step(start=True)
        def split(ctx, state):
            world.executed(ctx)
            return {}

        @wf.step(effect=True, **rule(variant, outbound_done))
        def outbound(ctx, state):
            world.executed(ctx)
            return {"flight": ctx.http.post(f"{world.api}/flights", json={"flight": "out"}).json()["id"]}

        @wf.step(effect=True, **rule(variant, rental_done))
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
    """A draft (its writer fails once: the step retries) held at a hotel against a deposit (one
    effect step, two requests), waiting for a human's approval: the reviewer first rolls it back with
    feedback (the deposit is returned and the hold cancelled, a second draft is made and held), then
    approves; a durable timer cools off before the draft is published through ``ctx.http`` from a
    plain step. After the rollback, the hold's requests need keys of their own: neither the first
    hold's keys (``key``, ``key:1``) nor each other's."""

    status = "completed"

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("approval", version="1")

        def hold_done(ctx, state):
            found = booked(world, ctx, {"hold": state["draft"]}, {"deposit": state["draft"]})
            return found and {"hold": found[0], "deposit": found[1]}

        def release(ctx, effect):  # newest first: the deposit back, then the hold
            ctx.http.delete(f"{world.api}/payments/{effect.result['deposit']}")
            ctx.http.delete(f"{world.api}/hotels/{effect.result['hold']}")

        @wf.step(start=True, retry=Retry(attempts=3, initial=2.0, jitter=False))
        def draft(ctx, state):
            world.executed(ctx)
            version = f"v{state.get('feedback', 0) + 1}"
            text = ctx.durable_call("writer", {"version": version}, lambda: world.flaky("writer", f"draft {version}"))
            return {"draft": version, "text": text}

        @wf.step(effect=True, compensate=release, **rule(variant, hold_done))
        def hold(ctx, state):
            world.executed(ctx)
            held = ctx.http.post(f"{world.api}/hotels", json={"hold": state["draft"]}).json()
            deposit = ctx.http.post(f"{world.api}/payments", json={"deposit": state["draft"]}).json()
            return {"hold": held["id"], "deposit": deposit["id"]}

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
    variants = ("resend", "default")

    def __init__(self, world: Any, variant: str = "resend") -> None:
        if variant not in self.variants:
            raise ValueError(f"the agent flow comes in the variants {self.variants}, not {variant!r}")
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

        resend = {"resend": True} if variant == "resend" else {}

        @wf.step(start=True, effect=True, compensate=tools.compensate, **resend)
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


class Nested(Flow):
    """Durable calls made while another durable call is performed. ``survey`` runs the tool loop;
    its tool asks the model twice and books a room with ``ctx.http`` (calls 1.0, 1.1 and 1.2, inside
    the tool's call 1), then the loop's last model call and a top-level summary follow (calls 2 and
    3). ``compare`` gathers two async calls, each making two calls of its own while the other is
    under way (0.0, 0.1 and 1.0, 1.1, whichever runs first). Wherever the process dies, the resumed
    run asks and books nothing twice and renumbers nothing: the journal check (``check``) finds no
    call journaled twice or replaced, the booking ledger no room booked twice."""

    status = "completed"
    #: its effect step re-sends (``resend=True``): the rules are explored on the other flows; this one
    #: explores the numbering of calls made inside calls
    variants = ("resend",)

    def __init__(self, world: Any, variant: str = "resend") -> None:
        if variant not in self.variants:
            raise ValueError(f"the nested flow comes in the variants {self.variants}, not {variant!r}")
        api = world.api
        llm = LLM(base_url=world.chat_url, model="scripted", max_attempts=1, breaker=False)
        tools = ToolRegistry()

        @tools.tool
        def look(tctx: ToolContext, city: str) -> dict:
            """Look around a city."""
            old_town = llm.chat(tctx.step, f"describe the old town of {city}").content
            river = llm.chat(tctx.step, f"describe the river of {city}").content
            room = tctx.http.post(f"{api}/hotels", json={"survey room": city}).json()["id"]
            return {"old town": old_town, "river": river, "room": room}

        wf = Workflow("nested", version="1")

        @wf.step(start=True, effect=True, resend=True)
        def survey(ctx, state):
            world.executed(ctx)
            out = run_tool_loop(ctx, llm, "survey Lisbon", tools)
            summary = llm.chat(ctx, f"summarise: {out.content}").content
            return {"answer": out.content, "summary": summary, "looked": out.calls[0]["result"]}

        @wf.step()
        async def compare(ctx, state):
            world.executed(ctx)

            async def weigh(city: str) -> list[str]:
                async def perform() -> list[str]:
                    food = ctx.durable_call("rate", {"city": city, "aspect": "food"}, lambda: f"{city}: food 4")
                    await asyncio.sleep(0)  # the sibling call makes its inner calls in between
                    rent = await ctx.adurable_call("rate", {"city": city, "aspect": "rent"}, lambda: f"{city}: rent 2")
                    return [food, rent]

                return await ctx.adurable_call("weigh", {"city": city}, perform)

            porto, faro = await asyncio.gather(weigh("Porto"), weigh("Faro"))
            return {"porto": porto, "faro": faro}

        wf.edge("survey", "compare")
        wf.edge("compare", END)
        self.workflow = wf

class Order(Flow):
    """A failure route and a router: a car is reserved (an effect), the payment (an effect) is
    declined by the bank (402, a permanent error), so the payment step takes its failure route to
    ``invoice``, which records why it was reached; ``invoice``'s router (journaled with its
    completion, never asked again on replay) sends the order on to ``notify``. An effect of ``pay``
    left in doubt takes the same route, and ``invoice`` records ``InDoubtError``."""

    status = "completed"

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("order", version="1")

        def reserve_done(ctx, state):
            found = booked(world, ctx, {"car": "order"})
            return found and {"car": found[0]}

        def pay_done(ctx, state):
            found = booked(world, ctx, {"amount": 35})
            return found and {"payment": found[0]}

        @wf.step(start=True, effect=True, compensate=_cancel(world, "cars", "car"), **rule(variant, reserve_done))
        def reserve(ctx, state):
            world.executed(ctx)
            return {"car": ctx.http.post(f"{world.api}/cars", json={"car": "order"}).json()["id"]}

        @wf.step(effect=True, compensate=_cancel(world, "payments", "payment"), on_failure="invoice",
                 **rule(variant, pay_done))
        def pay(ctx, state):
            world.executed(ctx)
            return {"payment": ctx.http.post(f"{world.api}/payments", json={"amount": 35}).json()["id"]}

        @wf.step()
        def invoice(ctx, state):
            world.executed(ctx)
            return {"invoice": {"step": ctx.failure["step"], "error": ctx.failure["type"]}, "invoiced_at": ctx.tick}

        @wf.step()
        def notify(ctx, state):
            world.executed(ctx)
            return {"notified": state["invoice"]["error"]}

        def after_invoice(state):
            world.routed("invoice", state["invoiced_at"])
            return "notify"

        wf.edge("reserve", "pay")
        wf.route("invoice", after_invoice, targets=["notify"])
        wf.edge("notify", END)
        self.workflow = wf

    def prepare(self, world: Any) -> None:
        world.service.fail_payments(402)  # the card is declined, every time: the failure route is taken

    @classmethod
    def doubt_routed(cls, state: dict[str, Any], step: str) -> dict[str, Any]:
        doubt = "orchestrator.errors.InDoubtError"
        return {**state, "invoice": {"step": step, "error": doubt}, "notified": doubt}


#: the timeout of ``catalog``'s timed steps, in seconds of the event loop's clock: never reached by
#: a step's own work, however loaded the machine (the explorer's real-time waits are as long: leases,
#: heartbeats)
TIMEOUT = 3600.0


class Catalog(Flow):
    """Answers too large to journal (over 1 MiB: explorer_harness.ExplorerService's ``GET
    /catalog/PART``), and timed effect steps whose first call is the process's first HTTP call.

    ``fetch`` (an effect, sync, with a timeout) reads the rooms' catalog (a big answer: handed to the
    step live, no call of the journal, request 0 sending ``key``), then books a room (request 1,
    ``key:1``). ``digest`` (a plain async step) reads the digest's catalog with ``ctx.ahttp`` (big),
    reserves a car (journaled), and waits for the ``go`` signal: woken, it runs again from its first
    line, reads the big catalog again and finds the car's answer in the journal, at its position.
    ``pay`` (an effect, async, with a timeout) pays (``key``), reads the receipt's catalog (big,
    ``key:1``) and books a flight (``key:2``). ``close`` fails for good: the saga cancels the flight
    and the payment, then the room, newest first.

    A big answer is fetched again whenever its step runs again (after a crash, or woken from its
    wait), with the same key; the calls after it keep their positions. Every simulated process
    makes its HTTP clients the first time a step needs them, and that costs ``first_call_cost``
    seconds of the event loop's clock (explorer_calls: as a loaded machine takes to load its CA
    bundle): the engine makes them before a timed attempt's timer starts, so the timeouts never
    fire, in the first process or in one that recovers the run."""

    status = "compensated"
    first_call_cost = 10 * TIMEOUT

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("catalog", version="1")
        api = world.api

        def fetch_done(ctx, state):
            found = booked(world, ctx, {"room": "catalog"}, at=(1,))
            return found and {"room": found[0], "rooms": ExplorerService.FILLER}

        def pay_done(ctx, state):
            found = booked(world, ctx, {"amount": 12}, {"flight": "receipt"}, at=(0, 2))
            return found and {"payment": found[0], "flight": found[1], "receipt": ExplorerService.FILLER}

        def refund(ctx, effect):  # newest first: the flight, then the payment
            ctx.http.delete(f"{api}/flights/{effect.result['flight']}")
            ctx.http.delete(f"{api}/payments/{effect.result['payment']}")

        @wf.step(start=True, effect=True, timeout=TIMEOUT, retry=Retry(attempts=1),
                 compensate=_cancel(world, "hotels", "room"), **rule(variant, fetch_done))
        def fetch(ctx, state):
            world.executed(ctx)
            rooms = ctx.http.get(f"{api}/catalog/rooms").json()["items"]
            room = ctx.http.post(f"{api}/hotels", json={"room": "catalog"}).json()["id"]
            return {"room": room, "rooms": len(rooms)}

        @wf.step()
        async def digest(ctx, state):
            world.executed(ctx)
            digest = (await ctx.ahttp.get(f"{api}/catalog/digest")).json()["items"]
            car = (await ctx.ahttp.post(f"{api}/cars", json={"car": "digest"})).json()["id"]
            go = ctx.wait_for("go")
            return {"digest": len(digest), "car": car, "go": go["by"]}

        @wf.step(effect=True, timeout=TIMEOUT, retry=Retry(attempts=1), compensate=refund,
                 **rule(variant, pay_done))
        async def pay(ctx, state):
            world.executed(ctx)
            payment = (await ctx.ahttp.post(f"{api}/payments", json={"amount": 12})).json()["id"]
            receipt = (await ctx.ahttp.get(f"{api}/catalog/receipt")).json()["items"]
            flight = (await ctx.ahttp.post(f"{api}/flights", json={"flight": "receipt"})).json()["id"]
            return {"payment": payment, "flight": flight, "receipt": len(receipt)}

        @wf.step()
        def close(ctx, state):
            world.executed(ctx)
            raise RuntimeError("the catalog was withdrawn")

        wf.edge("fetch", "digest")
        wf.edge("digest", "pay")
        wf.edge("pay", "close")
        wf.edge("close", END)
        self.workflow = wf

    def outside(self, world: Any, orc: Orchestrator, run_id: str) -> RunResult:
        if not orc.store.signals.pending(run_id, "go"):  # a sender that checks before re-sending
            orc.signal(run_id, "go", {"by": "ann"})
        return orc.resume(run_id)


def chat_script(request: dict[str, Any], n: int) -> Any:
    """The model, answering from the conversation: the same answers whatever was replayed before."""
    messages = request.get("messages", [])
    first = str(messages[0].get("content")) if messages else ""
    if first.startswith("describe the "):  # the nested flow's tool asking the model
        return reply(f"{first.removeprefix('describe the ')}: lovely")
    if first.startswith("summarise: "):
        return reply(f"in short, {first.removeprefix('summarise: ')}")
    if first.startswith("survey "):
        if any(m.get("role") == "tool" for m in messages):
            return reply("surveyed Lisbon")
        return Reply(tool_calls=[{"name": "look", "arguments": {"city": "Lisbon"}, "id": "call_look"}])
    if any(m.get("role") == "tool" for m in messages):
        return reply("booked both venues")
    return Reply(tool_calls=[{"name": "book", "arguments": {"venue": "Alfama Hall"}, "id": "call_alfama"},
                             {"name": "book", "arguments": {"venue": "Belem Loft"}, "id": "call_belem"}])


class Escalate(Flow):
    """One signal name waited for three times, one wait timing out. ``ask`` asks a human through a
    durable call (a tool) whose wait for ``answer`` has a timeout, which passes: the step, told so
    (``WaitTimedOut``, then the call's ``CallFailed``), pages the manager with ``ctx.http`` and waits
    for ``answer`` twice more, at its own level (waits 0 and 1 of the step, the tool's being 0.0
    inside call 0). The outside world lets the deadline pass, then sends two answers at once. Each
    time the step runs again, the tool's wait is told of its timeout again, the page comes from the
    journal, and each answer lands in the wait it landed in the first time."""

    status = "completed"
    variants = ("resend",)  # (no effect step: the in-doubt rules do not apply)
    ANSWERS = ("ann", "bob")

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("escalate", version="1")

        @wf.step(start=True)
        def ask(ctx, state):
            world.executed(ctx)
            try:
                answer = ctx.durable_call("ask-human", {"q": "approve?"},
                                          lambda: ctx.wait_for("answer", timeout=300))
                return {"paged": None, "answers": [answer["by"]]}
            except WaitTimeoutError:
                paged = ctx.http.post(f"{world.api}/cars", json={"page": "manager"}).json()["id"]
                first, second = ctx.wait_for("answer"), ctx.wait_for("answer")
                return {"paged": paged, "answers": [first["by"], second["by"]]}

        @wf.step()
        def record(ctx, state):
            world.executed(ctx)
            # What the scenario makes happen, whoever ran the step how often: the page was made, and
            # the two answers sent after the timeout landed in the two waits after it, in order.
            if not state["paged"] or state["answers"] != list(self.ANSWERS):
                world.violations.append(f"ask ended with {state['answers']} (paged: {state['paged']}), not with "
                                        f"the page and the answers {list(self.ANSWERS)} in order")
            return {"recorded": len(state["answers"])}

        wf.edge("ask", "record")
        wf.edge("record", END)
        self.workflow = wf

    def outside(self, world: Any, orc: Orchestrator, run_id: str) -> RunResult:
        history = orc.history(run_id)
        waiting = [e for e in history if e["kind"] == "WaitStarted"][-1]["data"]
        if waiting.get("timeout_at") is not None and not any(e["kind"] == "WaitTimedOut" for e in history):
            world.clock.now = max(world.clock.now, waiting["timeout_at"])  # nobody answers in time
            return orc.resume(run_id)
        # A sender that sends each answer once: those neither received nor pending yet, in order.
        had = [e["data"]["data"]["by"] for e in history if e["kind"] == "SignalReceived"]
        had += [json.loads(data)["by"] for _, _, data, _ in orc.store.signals.pending(run_id, "answer")]
        for by in self.ANSWERS[len(had):]:
            orc.signal(run_id, "answer", {"by": by})
        return orc.resume(run_id)


class CardDeclined(Exception):
    """The ``declined`` flow's own error (a user's class, not the project's): the bank's answer."""

    def __init__(self, status: int) -> None:
        super().__init__(f"card declined ({status})")
        self.status = status


class Declined(Flow):
    """A user's own error class, a durable call and a ``Retry`` that gives up on it. ``charge`` pays
    through a durable call (its ``ctx.http`` request is call 0.0 inside it) and turns the bank's 402
    into ``CardDeclined``; the step's ``Retry(give_up_on=(CardDeclined,))`` fails it at once, and its
    failure route ``apologise`` records why. Wherever a process dies, the decline journaled as the
    call's failure comes back as ``CardDeclined`` when the attempt runs again, so the step gives up
    as it did: an attempt after the first is a declined card charged again (a violation, recorded by
    the step itself)."""

    status = "completed"
    variants = ("resend",)  # (no effect step: the in-doubt rules do not apply)

    def __init__(self, world: Any, variant: str = "resend") -> None:
        wf = Workflow("declined", version="1")

        def pay(ctx: Any) -> str:
            try:
                return ctx.http.post(f"{world.api}/payments", json={"amount": 35}).json()["id"]
            except PermanentToolError as exc:
                raise CardDeclined(exc.status) from None

        @wf.step(start=True, retry=Retry(attempts=3, initial=0.01, give_up_on=(CardDeclined,)),
                 on_failure="apologise")
        def charge(ctx, state):
            world.executed(ctx)
            if ctx.attempt > 1:
                world.violations.append(f"charge ran attempt {ctx.attempt}: a declined card was charged again")
            try:
                return {"payment": ctx.durable_call("charge", {"amount": 35}, lambda: pay(ctx))}
            except CardDeclined as no:
                ctx.trace(f"the bank declined the card: {no.status}")  # its attribute, as raised
                raise

        @wf.step()
        def apologise(ctx, state):
            world.executed(ctx)
            return {"apology": ctx.failure["type"]}

        wf.edge("charge", END)
        wf.edge("apologise", END)
        self.workflow = wf

    def prepare(self, world: Any) -> None:
        world.service.fail_payments(402)  # the card is declined, every time


FLOWS: dict[str, type[Flow]] = {"trip": Trip, "fanout": Fanout, "threads": Threads, "approval": Approval,
                                "agent": Agent, "nested": Nested, "order": Order, "catalog": Catalog,
                                "escalate": Escalate, "declined": Declined}
