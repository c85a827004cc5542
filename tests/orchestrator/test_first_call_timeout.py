"""A step's timeout is its own: what the process makes once for the first HTTP call of any step
(importing httpx, the SSL context with its CA bundle, the shared clients) is made before the timer
of an attempt starts, not charged to it.

The slowness of a loaded machine is injected without waiting for it: the runs are driven on an
event loop whose clock (the one step timeouts are measured on) a test can move forward, and making
the SSL context moves it far past the step's timeout, as if it had taken that long.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.testing import BookingService
from orchestrator.tools import clients
from workflows import END, Retry, Workflow

sys.path.insert(0, str(Path(__file__).parent))
from exactly_once_helpers import Died  # noqa: E402

TIMEOUT = 30.0  # seconds of the loop's clock: never reached by the step's own work


class SkewedLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock can be moved forward (its timers, a step's timeout among them, come due)."""

    skew = 0.0

    def time(self) -> float:
        return super().time() + self.skew

    def jump(self, seconds: float) -> None:
        """``seconds`` of slow work: the loop's clock moves on by that much. From another thread the
        work spans the loop's turns, as real slow work does: it starts once the loop has finished its
        current turn (the task that started the work has gone on to wait), and it ends once the loop
        has run what came due. On the loop's own thread the loop is blocked meanwhile: what came due
        runs at its next turn."""
        try:
            on_loop = asyncio.get_running_loop() is self
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.skew += seconds
            return
        self._turn()
        self.skew += seconds
        self._turn()

    def _turn(self) -> None:
        ran = threading.Event()
        self.call_soon_threadsafe(self.call_soon, ran.set)  # timers due now run in the turn before it
        assert ran.wait(60), "the event loop did not run"


def drive(coro_fn):
    """Run ``coro_fn(loop)`` on a fresh SkewedLoop, as ``orc.run`` runs a run on a loop of its own."""
    with asyncio.Runner(loop_factory=SkewedLoop) as runner:
        loop = runner.get_loop()
        return runner.run(coro_fn(loop))


class SlowFirstContext:
    """``ssl_context()`` of a process that has not made it yet, on a loaded machine: once armed with
    a loop, the next call moves that loop's clock on by ten step timeouts (as if it took that long)."""

    def __init__(self, real) -> None:
        self.real = real
        self.loop: SkewedLoop | None = None
        self.made = 0

    def arm(self, loop: SkewedLoop) -> None:
        """A fresh process: its SSL context is still to be made, slowly, on ``loop``'s clock."""
        self.loop = loop

    def __call__(self):
        if self.loop is not None:
            loop, self.loop = self.loop, None
            self.made += 1
            loop.jump(10 * TIMEOUT)
        return self.real


@pytest.fixture
def slow_first_context(monkeypatch):
    slow = SlowFirstContext(clients.ssl_context())
    monkeypatch.setattr(clients, "ssl_context", slow)
    return slow


@pytest.fixture
def service():
    with BookingService() as svc:
        yield svc


def options(db_url, fake_time):
    return {"clock": fake_time.clock, "sleep": fake_time.sleep, "rng": random.Random(7)}


def pay_flow(api: str, *, is_async: bool) -> Workflow:
    wf = Workflow("pay-first")
    if is_async:
        @wf.step(start=True, effect=True, resend=True, timeout=TIMEOUT, retry=Retry(attempts=1))
        async def pay(ctx, state):
            r = await ctx.ahttp.post(f"{api}/payments", json={"amount": 5})
            return {"payment": r.json()["id"]}
    else:
        @wf.step(start=True, effect=True, resend=True, timeout=TIMEOUT, retry=Retry(attempts=1))
        def pay(ctx, state):
            r = ctx.http.post(f"{api}/payments", json={"amount": 5})
            return {"payment": r.json()["id"]}
    wf.edge("pay", END)
    return wf


@pytest.mark.parametrize("is_async", [False, True], ids=["ctx.http", "ctx.ahttp"])
def test_the_first_http_call_of_a_process_is_not_charged_to_the_attempts_timeout(
        db_url, fake_time, service, slow_first_context, is_async):
    # Given a fresh Orchestrator whose effect step (timeout, resend=True) first calls a service,
    # in a process where making the shared SSL context takes ten times the step's timeout
    wf = pay_flow(service.url, is_async=is_async)
    orc = Orchestrator(db_url, workflows=[wf], **options(db_url, fake_time))
    try:
        async def go(loop):
            slow_first_context.arm(loop)
            return await orc.arun(wf, {}, run_id="first")

        # When the run is driven
        result = drive(go)
        history = orc.history("first")
    finally:
        orc.close()
    # Then the one-time cost was paid (the clock moved past the timeout) and not by the attempt:
    # the step completed in one attempt, with no timeout in the journal
    assert slow_first_context.made == 1
    assert result.status == "completed", result.error
    assert [e["kind"] for e in history if e["kind"].startswith("Step")] == ["StepStarted", "StepCompleted"]
    [done] = [e["data"] for e in history if e["kind"] == "StepCompleted"]
    assert done["attempt"] == 1
    # And the payment was made once
    assert [e["action"] for e in service.ledger() if e.get("kind") == "payment"] == ["book"]


def test_a_resumed_process_resends_an_in_doubt_effect_without_paying_the_first_call_in_its_timeout(
        db_url, fake_time, service, slow_first_context):
    # Given an effect step whose first process died after its intent was journaled, before it sent
    # (resend=True: re-sending with the same key is safe)
    wf = Workflow("pay-first")
    died = {"once": False}

    @wf.step(start=True, effect=True, resend=True, timeout=TIMEOUT, retry=Retry(attempts=1))
    def pay(ctx, state):
        if not died["once"]:
            died["once"] = True
            raise Died
        r = ctx.http.post(f"{service.url}/payments", json={"amount": 5})
        return {"payment": r.json()["id"]}

    wf.edge("pay", END)
    first = Orchestrator(db_url, workflows=[wf], **options(db_url, fake_time))
    try:
        with pytest.raises(Died):
            first.run(wf, {}, run_id="again")
    finally:
        first.close()
    # When a fresh process, for which making the SSL context takes ten step timeouts, resumes it
    orc = Orchestrator(db_url, workflows=[wf], **options(db_url, fake_time))
    try:
        async def go(loop):
            slow_first_context.arm(loop)
            return await orc.aresume("again")

        result = drive(go)
        history = orc.history("again")
    finally:
        orc.close()
    # Then the effect was re-sent and completed in its one attempt, not left in doubt
    assert slow_first_context.made == 1
    assert result.status == "completed", result.error
    assert not [e for e in history if e["kind"] == "StepFailed"]
    assert [e["data"]["attempt"] for e in history if e["kind"] == "StepCompleted"] == [1]
    assert [e["action"] for e in service.ledger() if e.get("kind") == "payment"] == ["book"]


def test_a_step_without_a_timeout_makes_no_http_client_ahead(db_url, fake_time):
    # Given a step without a timeout that makes no HTTP call
    wf = Workflow("quiet")

    @wf.step(start=True)
    def note(ctx, state):
        return {"ok": True}

    wf.edge("note", END)
    with Orchestrator(db_url, workflows=[wf], **options(db_url, fake_time)) as orc:
        # When it runs
        assert orc.run(wf, {}, run_id="q").status == "completed"
        # Then the tools made nothing ahead (a run with no timed step pays nothing for HTTP)
        assert orc.tools.warmed is False
