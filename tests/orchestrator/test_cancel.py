"""Cancelling the task that drives a run (``task.cancel()`` on ``await orc.arun(...)``) gives the run back.

The run is left as its journal says, resumable at once: each step that was running journals how far
its attempt got (``StepCancelled``) and the lease is released, so another Orchestrator continues it
without a takeover and without waiting for the lease to expire. The ``CancelledError`` reaches the
caller. An effect attempt cancelled before its step's function ran is withdrawn (not in doubt); one
cancelled after its key left is re-sent with the same key, as after a crash. A sync step blocked on
a thread cannot be stopped: the lease stays (renewed) until that thread ends, and is given back then.

The cancellation points are enumerated, not timed: after each journal write of a run (an observer
cancels the task) and while each loopback service holds a request (it cancels the task and answers
only once the caller has seen the cancellation). On SQLite and Postgres, with an injected clock that
never moves: a lease not given back would never expire here.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from exactly_once_helpers import kinds  # noqa: E402

from orchestrator.agents import AsyncLLM  # noqa: E402
from orchestrator.testing import BookingService, ChatServer, reply  # noqa: E402
from workflows import END, Workflow  # noqa: E402

#: how long a paused service waits for the test to let it answer: never reached when things work
PAUSE_LIMIT = 60.0


class Canceller:
    """Cancels the task driving a run at one chosen point: the n-th journal commit, or the moment a
    service receives a named request (that service then holds its answer until ``release``)."""

    def __init__(self, point: tuple[str, Any] | None) -> None:
        self.point = point
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.commits: list[list[str]] = []  # the kinds of each commit, in order (what the points are)
        self.fired = False
        self.released = threading.Event()

    def observer(self, run: Any, events: list[Any]) -> None:
        self.commits.append([e.kind for e in events])
        if self.point == ("commit", len(self.commits)) and not self.fired:
            self.fired = True
            assert self.task is not None
            self.task.cancel()  # from inside the commit: the task sees it at its next await

    def received(self, what: str) -> None:
        """Called on a service's thread as a request arrives."""
        if self.point == ("request", what) and not self.fired:
            self.fired = True
            assert self.loop is not None and self.task is not None
            self.loop.call_soon_threadsafe(self.task.cancel)
            assert self.released.wait(PAUSE_LIMIT), "the test never let the service answer"


class Shop(BookingService):
    """The booking service, telling the canceller when a payment request arrives."""

    def __init__(self, canceller: Canceller) -> None:
        super().__init__()
        self.canceller = canceller

    def handle(self, method: str, path: str, body: Any, raw: bytes, key: str | None) -> tuple[int, Any]:
        if method == "POST" and path == "/payments":
            self.canceller.received("payment")
        return super().handle(method, path, body, raw, key)


def shop_flow(llm: AsyncLLM, api: str) -> Workflow:
    wf = Workflow("cancel-shop")

    @wf.step(start=True)
    async def think(ctx, state):
        answer = await llm.chat(ctx, f"how much for {state['item']}?")  # a durable model call
        return {"amount": int(answer.content)}

    @wf.step(effect=True)  # the default in-doubt rule: no check hook, no resend
    async def pay(ctx, state):
        r = await ctx.ahttp.post(f"{api}/payments", json={"amount": state["amount"]})
        return {"payment": r.json()["id"]}

    wf.edge("think", "pay")
    wf.edge("pay", END)
    return wf


def payments(service: BookingService) -> list[dict[str, Any]]:
    return [e for e in service.ledger() if e["action"] == "book" and e["kind"] == "payment"]


def attempt(orc_factory, point: tuple[str, Any] | None, run_id: str) -> tuple[Canceller, Shop, Any, BaseException | None]:
    """Start the shop run in a task, cancelling it at ``point``; what was cancelled and how it ended."""
    canceller = Canceller(point)

    def model(body: Any, n: int) -> Any:
        canceller.received("model")
        return reply("42")

    shop = Shop(canceller)
    shop.start()
    chat = ChatServer(model)
    chat.start()
    llm = AsyncLLM(base_url=chat.url, model="scripted")
    wf = shop_flow(llm, shop.url)
    orc = orc_factory(wf, observers=[canceller.observer])
    outcome: list[Any] = [None, None]

    async def drive() -> None:
        canceller.loop = asyncio.get_running_loop()
        canceller.task = asyncio.ensure_future(orc.arun(wf, {"item": "a lamp"}, run_id=run_id))
        try:
            outcome[0] = await canceller.task
        except asyncio.CancelledError as exc:
            outcome[1] = exc
        finally:
            canceller.released.set()  # a paused service may answer now, into a closed connection

    asyncio.run(drive())
    return canceller, shop, (orc, wf, chat, llm), outcome[1]


def points() -> list[tuple[str, Any]]:
    """Every point of the shop run: after each of its journal commits, and at each request it sends.
    (Counted from a run that is not cancelled; the test checks the count still holds.)"""
    return [("commit", n) for n in range(1, COMMITS + 1)] + [("request", "model"), ("request", "payment")]


#: the shop run's commits: think's model call and completion; pay's intent, key, charge and
#: completion (with the run's end)
COMMITS = 6


def test_the_shop_run_commits_as_the_enumeration_expects(orc_factory):
    canceller, shop, (orc, wf, chat, llm), cancelled = attempt(orc_factory, None, "plain")
    shop.stop()
    chat.stop()
    assert cancelled is None
    assert orc.result("plain").status == "completed"
    assert [k for commit in canceller.commits for k in commit][-1] == "RunCompleted"
    assert len(canceller.commits) == COMMITS, canceller.commits


@pytest.mark.parametrize("point", [pytest.param(p, id=f"{p[0]}-{p[1]}") for p in points()])
def test_a_run_cancelled_at_any_point_is_given_back_and_finished_once_by_another_orchestrator(orc_factory, point):
    # Given the shop run, cancelled at this point
    canceller, shop, (orc, wf, chat, llm), cancelled = attempt(orc_factory, point, "c1")
    try:
        assert canceller.fired, f"the run never reached {point}"
        # Then the cancellation reached the caller
        assert isinstance(cancelled, asyncio.CancelledError)
        # and the run was given back at once: no lease is held on it, nobody drives it
        rec = orc.get_run("c1")
        assert rec.lease_owner is None, (rec.status, rec.lease_owner)
        # When another Orchestrator recovers interrupted runs (it takes only runs whose lease is free:
        # the clock never moves, so a lease left behind would never expire here)
        other = orc_factory(wf)
        results = [] if rec.status == "completed" else other.recover()
        # Then it finished the run, and the service charged the payment exactly once
        final = other.result("c1")
        assert final.status == "completed", (final.status, final.error, kinds(other, "c1"))
        assert final.state["amount"] == 42 and final.state["payment"] == "payment-1"
        assert [r.run_id for r in results] == ([] if rec.status == "completed" else ["c1"])
        assert len(payments(shop)) == 1, shop.ledger()
    finally:
        chat.stop()
        shop.stop()


def test_an_effect_cancelled_while_its_intent_was_written_is_withdrawn_not_in_doubt(orc_factory):
    # Given the shop run cancelled as pay's intent (StepStarted) is committed (the 3rd commit)
    canceller, shop, (orc, wf, chat, llm), cancelled = attempt(orc_factory, ("commit", 3), "w1")
    try:
        assert canceller.commits[2] == ["StepStarted"] and isinstance(cancelled, asyncio.CancelledError)
        # Then the journal says the attempt was cancelled before pay's function ran, and nothing was sent
        history = orc.history("w1")
        assert [e["kind"] for e in history][-2:] == ["StepStarted", "StepCancelled"]
        assert history[-1]["data"] == {"step": "pay", "tick": 1, "attempt": 1, "called": False, "key_left": False}
        assert payments(shop) == []
        # When it is recovered by another Orchestrator
        other = orc_factory(wf)
        [result] = other.recover()
        # Then pay is not in doubt: it ran once, under the same attempt number and key
        assert result.status == "completed", result.error
        started = [e["data"] for e in other.history("w1") if e["kind"] == "StepStarted"]
        assert [(s["attempt"], s["key"]) for s in started] == [(1, "w1:pay:1"), (1, "w1:pay:1")]
        assert len(payments(shop)) == 1
    finally:
        chat.stop()
        shop.stop()


def test_an_effect_cancelled_after_its_key_left_is_re_sent_with_it_and_charged_once(orc_factory):
    # Given the shop run cancelled while the service holds pay's request (it charges it afterwards)
    canceller, shop, (orc, wf, chat, llm), cancelled = attempt(orc_factory, ("request", "payment"), "k1")
    try:
        history = orc.history("k1")
        assert history[-1]["kind"] == "StepCancelled"
        assert history[-1]["data"] == {"step": "pay", "tick": 1, "attempt": 1, "called": True, "key_left": True}
        # When another Orchestrator recovers it
        other = orc_factory(wf)
        [result] = other.recover()
        # Then the payment was re-sent with the same key: the service replayed it instead of charging again
        assert result.status == "completed", result.error
        assert len(payments(shop)) == 1
        replays = [e for e in shop.ledger() if e["action"] == "replay"]
        assert [e["idempotency_key"] for e in replays] == ["k1:pay:1"]
    finally:
        chat.stop()
        shop.stop()


def cancelled_in_function_flow(log: list[str], check: bool) -> Workflow:
    wf = Workflow("cancel-inside")
    gate: dict[str, asyncio.Event] = {}

    def found(ctx, state):
        log.append(f"check {ctx.idempotency_key}")
        return None  # the world has no record of the key: the effect did not happen

    @wf.step(start=True, effect=True, check=found if check else None)
    async def notify(ctx, state):
        log.append("sent without the key")  # a call of its own that does not carry the key
        if not log.count("resumed"):
            gate["waiting"].set()
            await asyncio.Event().wait()  # cancelled here, before the key left
        return {"sent": True}

    wf.edge("notify", END)
    return wf, gate  # type: ignore[return-value]


@pytest.mark.parametrize("check", [False, True], ids=["default-rule", "check-hook"])
def test_an_effect_cancelled_inside_its_function_before_its_key_left_is_in_doubt_as_after_a_crash(
        orc_factory, check):
    # Given an effect step that reaches the world without its key, cancelled after it did
    log: list[str] = []
    wf, gate = cancelled_in_function_flow(log, check)
    orc = orc_factory(wf)

    async def drive() -> BaseException | None:
        gate["waiting"] = asyncio.Event()
        task = asyncio.ensure_future(orc.arun(wf, {}, run_id="d1"))
        await gate["waiting"].wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as exc:
            return exc
        return None

    assert isinstance(asyncio.run(drive()), asyncio.CancelledError)
    assert orc.get_run("d1").lease_owner is None
    assert orc.history("d1")[-1]["data"] == {"step": "notify", "tick": 0, "attempt": 1, "called": True,
                                              "key_left": False}
    # When another Orchestrator recovers it
    log.append("resumed")
    [result] = orc_factory(wf).recover()
    if check:
        # Then its check hook settles it (not found: it runs again with the same key)
        assert result.status == "completed"
        assert log == ["sent without the key", "resumed", "check d1:notify:0", "sent without the key"]
    else:
        # Then it is not sent again blindly: what it did may stand, and the run says so
        assert result.status == "failed"
        assert "InDoubtError" in result.error and "was cancelled while the step's function ran" in result.error
        assert "notify (key d1:notify:0)" in result.error
        assert log == ["sent without the key", "resumed"]


def thread_flow(entered: threading.Event, go: threading.Event, sent: list[str], parallel: bool) -> Workflow:
    wf = Workflow("cancel-thread")

    def slow(ctx, state):
        entered.set()
        assert go.wait(PAUSE_LIMIT), "the test never let the step end"
        try:  # (once its attempt was cancelled, nothing more leaves through ctx)
            ctx.durable_call("notify", {"to": "ops"}, lambda: sent.append("notify") or {"ok": True})
        except asyncio.CancelledError:
            sent.append("refused")
        return {"slow": True}

    if parallel:  # two steps of one tick: each sync step runs on a thread of the loop's executor
        wf.step(start=True)(slow)

        @wf.step(start=True)
        def quick(ctx, state):
            return {"quick": True}

        wf.edge("slow", END)
        wf.edge("quick", END)
    else:  # a sync step with a timeout runs on a daemon thread of its own
        wf.step(start=True, timeout=3600)(slow)
        wf.edge("slow", END)
    return wf


@pytest.mark.parametrize("parallel", [False, True], ids=["timeout-thread", "parallel-thread"])
def test_a_sync_step_on_a_thread_keeps_the_lease_until_the_thread_ends(orc_factory, parallel):
    # Given a run whose sync step blocks on a thread
    entered, go, sent = threading.Event(), threading.Event(), []
    wf = thread_flow(entered, go, sent, parallel)
    orc = orc_factory(wf)
    other = orc_factory(wf)
    seen: dict[str, Any] = {}

    async def drive() -> None:
        task = asyncio.ensure_future(orc.arun(wf, {}, run_id="t1"))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait)
        # When the task driving it is cancelled while the step blocks
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Then, while the thread can still act, the lease stays with its owner (and is renewed)
        rec = orc.get_run("t1")
        seen["owner"] = rec.lease_owner
        seen["held"] = orc.engine.heartbeat.holds("t1")
        seen["recovered"] = await other.arecover()
        seen["cancelled"] = {e["data"]["step"]: e["data"] for e in orc.history("t1") if e["kind"] == "StepCancelled"}
        go.set()  # the step returns now

    asyncio.run(drive())  # (its end waits for the loop's executor threads)
    for thread in threading.enumerate():
        if thread.name == "agentsaga-step-slow":
            thread.join()
    assert seen["owner"] == orc.owner and seen["held"] is True
    assert seen["recovered"] == []
    # (in the parallel case its neighbour `quick` completed first or was cancelled too, before or
    # after it, as the threads went)
    assert seen["cancelled"]["slow"] == {"step": "slow", "tick": 0, "attempt": 1, "called": True,
                                         "still_running": True}
    assert set(seen["cancelled"]) - {"quick"} == {"slow"}
    # And once the thread ended, the lease was given back (nothing of what it did after reached the
    # journal or left through ctx) and another Orchestrator finishes the run without a takeover
    assert sent == ["refused"]
    assert orc.get_run("t1").lease_owner is None and not orc.engine.heartbeat.holds("t1")
    assert [e["kind"] for e in orc.history("t1")][-1] == "StepCancelled"
    [result] = other.recover()
    assert result.status == "completed" and result.state["slow"] is True
    assert sent == ["refused", "notify"]


def test_a_run_cancelled_while_its_creation_is_being_written_is_created_unleased(orc_factory):
    # Given a process already driving a run (so a new run's creation joins the group committer)
    release = asyncio.Event()
    wf = Workflow("cancel-create")

    @wf.step(start=True)
    async def wait(ctx, state):
        if state.get("hold"):
            await release.wait()
        return {"done": True}

    wf.edge("wait", END)
    orc = orc_factory(wf)
    created = orc.store.create_runs

    async def drive() -> None:
        loop = asyncio.get_running_loop()
        holding = asyncio.ensure_future(orc.arun(wf, {"hold": True}, run_id="busy"))
        while orc.engine.journal.driving == 0:
            await asyncio.sleep(0)  # (a turn of the loop: until the first run is being driven)
        late: list[asyncio.Task[Any]] = []

        def create_runs(creates):
            # the creation is being written: cancel the task that awaits it (before its answer comes)
            loop.call_soon_threadsafe(late[0].cancel)
            return created(creates)

        orc.store.create_runs = create_runs
        late.append(asyncio.ensure_future(orc.arun(wf, {}, run_id="new")))
        # When the task creating the second run is cancelled while the creation is written
        with pytest.raises(asyncio.CancelledError):
            await late[0]
        release.set()
        assert (await holding).status == "completed"

    asyncio.run(drive())
    # Then the run exists (the write landed), unleased: another Orchestrator recovers it at once
    assert orc.get_run("new").lease_owner is None
    [result] = orc_factory(wf).recover()
    assert (result.run_id, result.status) == ("new", "completed")
