"""Exactly-once when an effect meets a crash, a retry, a takeover or a timeout: each case a regression test,
on SQLite and Postgres.

The cases are the ones a review reproduced against the engine (a retry and a crash, a check hook and
recovery, a takeover and an outgoing call, a crash and an idempotency key, a durable call and a crash,
a timeout and a sync step, ...). The crash-point explorer under ``tests/explorer`` sweeps every crash
point; these tests pin each case by name. The journal's cases are in test_exactly_once_journal.py,
the signals' and sagas' in test_exactly_once_signals_sagas.py.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from exactly_once_helpers import Died, fail_append_once, seqs

from orchestrator.engine import EventKind
from store import StoreUnavailableError
from workflows import END, Retry, Workflow


# -- case 2: every attempt of an effect is covered by a durable intent ---------------------------------
def test_a_retried_effect_journals_its_intent_before_every_attempt_and_a_crash_in_a_retry_is_in_doubt(orc_factory):
    # Given an effect with resend=False whose first attempt fails and whose second attempt dies mid-call
    wf = Workflow("charge")
    sent = []

    @wf.step(start=True, effect=True, resend=False, retry=Retry(attempts=3, initial=0.1))
    def charge(ctx, state):
        sent.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("card network hiccup")
        raise Died  # the process dies after the charge left
    wf.edge("charge", END)
    orc = orc_factory(wf)
    with pytest.raises(Died):
        orc.run(wf, {}, run_id="c1")
    # Then each attempt had a StepStarted intent before it ran
    started = [e["data"]["attempt"] for e in orc.history("c1") if e["kind"] == EventKind.STEP_STARTED]
    assert started == [1, 2]
    # When the run is resumed in a new process
    result = orc_factory(wf).resume("c1")
    # Then the in-doubt charge is not sent again (resend=False): the step fails with InDoubtError
    assert sent == [1, 2]
    assert result.status == "failed" and "InDoubtError" in result.error
    # and the run's record of what may stand says why (resend=False), not that there was no key
    [doubt] = result.in_doubt
    assert doubt["reason"].endswith("it has no check hook and declares resend=False"), doubt


def test_an_effect_whose_key_never_left_says_so_where_it_is_listed_in_doubt(orc_factory):
    # Given an effect step that calls its service with a client of its own (its key never read) and
    # whose process dies with the call out
    wf = Workflow("own-client")

    @wf.step(start=True, effect=True)
    def book(ctx, state):
        raise Died

    wf.edge("book", END)
    with pytest.raises(Died):
        orc_factory(wf).run(wf, {}, run_id="k1")
    # When it is resumed (the default rule: not sent again, failed in doubt)
    result = orc_factory(wf).resume("k1")
    # Then what may stand says the service never got the key: look the booking up by what was sent
    assert result.status == "failed" and "InDoubtError" in result.error
    [doubt] = result.in_doubt
    assert "its idempotency key not sent: the service does not know the key" in doubt["reason"], doubt
    assert "unless its reason says the key was not sent" in result.error


# -- case 9: a check hook that raises ----------------------------------------------------------------------
def test_a_check_hook_that_raises_fails_the_step_visibly_and_recover_goes_on_to_the_next_run(orc_factory, fake_time):
    # Given two runs dead in an effect: one whose check hook raises, one that can be re-sent
    def broken_check(ctx, state):
        raise ConnectionError("the provider's lookup API is down")

    bad = Workflow("bad-check")

    @bad.step(start=True, effect=True, check=broken_check)
    def charge(ctx, state):
        raise Died

    bad.edge("charge", END)
    good = Workflow("good")
    attempts = []

    @good.step(start=True, effect=True)
    def send(ctx, state):
        attempts.append(ctx.idempotency_key)  # sent with the call: a re-send is recognised
        if len(attempts) == 1:
            raise Died
        return {"sent": True}

    good.edge("send", END)
    orc = orc_factory(bad, good, lease_ttl=5)
    for wf, run_id in ((bad, "x-bad"), (good, "y-good")):
        with pytest.raises(Died):
            orc.run(wf, {}, run_id=run_id)
    # When recovery runs in a new process after the leases expired
    fake_time.advance(60)
    results = {r.run_id: r for r in orc_factory(bad, good, lease_ttl=5).recover()}
    # Then the bad run failed visibly with the check's error, and the good run was recovered too
    assert results["x-bad"].status == "failed"
    assert "InDoubtError" in results["x-bad"].error and "lookup API is down" in results["x-bad"].error
    assert results["y-good"].status == "completed"
    # and the run's record of what may stand says why: the hook raised (not "no check hook")
    [doubt] = results["x-bad"].in_doubt
    assert doubt["reason"].endswith("its check hook raised ConnectionError: the provider's lookup API is down"), doubt


@pytest.mark.parametrize("found, said", [
    ("done", "TypeError: step 'charge' returned str"),
    ({"receipt": {1: "a", "1": "b"}}, "mixes string keys with the key 1"),
    ({"receipt": object()}, "value of type builtins.object is not JSON-encodable at $.receipt"),
], ids=["not a dict", "colliding keys", "not JSON"])
def test_a_check_hook_answering_what_cannot_be_an_update_fails_the_step_in_doubt(orc_factory, found, said):
    # Given a run dead in an effect whose check hook answers with something that cannot be its update
    sent = []
    wf = Workflow("odd-check")

    @wf.step(start=True, effect=True, check=lambda ctx, state: found)
    def charge(ctx, state):
        sent.append(ctx.attempt)
        raise Died

    wf.edge("charge", END)
    with pytest.raises(Died):
        orc_factory(wf).run(wf, {}, run_id="c1")
    # When the run is resumed in a new process
    orc = orc_factory(wf)
    result = orc.resume("c1")
    # Then the step failed in doubt, naming the check hook and what was wrong, and the run ended
    # (before, the error escaped resume and left the run running); the charge was not sent again
    assert result.status == "failed" and orc.get_run("c1").status == "failed"
    assert "InDoubtError" in result.error and "its check hook returned what cannot be its update" in result.error
    assert said in result.error
    assert sent == [1]
    [doubt] = result.in_doubt
    assert "its check hook returned what cannot be its update" in doubt["reason"] and "no check hook" not in doubt["reason"]


# -- case 16: a fenced-out owner stops before its next outgoing call ---------------------------------------
def test_an_owner_whose_lease_was_taken_over_makes_no_further_outgoing_call(orc_factory):
    # Given an effect step making two calls, and another process taking the run over between them
    wf = Workflow("two-calls")
    performed = []
    holder = {}

    @wf.step(start=True, effect=True)
    def book(ctx, state):
        flight = ctx.durable_call("booking", {"what": "flight"}, lambda: performed.append("flight") or "F-1")
        thief = holder["thief"]
        thief.store.leases.acquire(ctx.run_id, owner="thief", ttl=30, now=thief.engine.config.clock(), force=True)
        hotel = ctx.durable_call("booking", {"what": "hotel"}, lambda: performed.append("hotel") or "H-1")
        return {"flight": flight, "hotel": hotel}

    wf.edge("book", END)
    orc = orc_factory(wf)
    holder["thief"] = orc_factory(wf)
    # When the first owner carries on
    from orchestrator import FencedError

    with pytest.raises(FencedError):
        orc.run(wf, {}, run_id="f1")
    # Then the hotel request never left this process
    assert performed == ["flight"]


def test_an_async_owner_whose_lease_was_taken_over_makes_no_further_outgoing_call(orc_factory):
    # The same with async durable calls, whose guard is asked off the event loop
    wf = Workflow("two-async-calls")
    performed = []
    holder = {}

    async def perform(what: str, answer: str) -> str:
        performed.append(what)
        return answer

    @wf.step(start=True, effect=True)
    async def book(ctx, state):
        flight = await ctx.adurable_call("booking", {"what": "flight"}, lambda: perform("flight", "F-1"))
        thief = holder["thief"]
        thief.store.leases.acquire(ctx.run_id, owner="thief", ttl=30, now=thief.engine.config.clock(), force=True)
        hotel = await ctx.adurable_call("booking", {"what": "hotel"}, lambda: perform("hotel", "H-1"))
        return {"flight": flight, "hotel": hotel}

    wf.edge("book", END)
    orc = orc_factory(wf)
    holder["thief"] = orc_factory(wf)
    from orchestrator import FencedError

    with pytest.raises(FencedError):
        orc.run(wf, {}, run_id="f2")
    # Then the hotel request never left this process, and only the flight was journaled
    assert performed == ["flight"]
    calls = [e["data"]["request"] for e in orc.history("f2") if e["kind"] == "CallCompleted"]
    assert calls == [{"what": "flight"}]


# -- case 3: idempotency keys are a stable function of the request's position ---------------------------------
def test_each_request_of_an_effect_step_keeps_its_key_across_a_crash(orc_factory):
    # Given an effect step booking two rooms at one hotel service, the process dying after the first
    from orchestrator.testing import BookingService

    wf = Workflow("rooms")
    die = {"after_first": True}

    @wf.step(start=True, effect=True)
    def book(ctx, state):
        first = ctx.http.post(f"{state['api']}/hotels", json={"room": "A"}).json()
        if die["after_first"]:
            die["after_first"] = False
            raise Died
        second = ctx.http.post(f"{state['api']}/hotels", json={"room": "B"}).json()
        return {"rooms": [first["id"], second["id"]]}

    wf.edge("book", END)
    with BookingService() as service:
        orc = orc_factory(wf)
        with pytest.raises(Died):
            orc.run(wf, {"api": service.url}, run_id="h1")
        # When a new process resumes the run
        result = orc_factory(wf).resume("h1")
        ledger = service.ledger()
    # Then the second room went out with a key of its own (not the first room's) and was booked
    assert result.status == "completed", result.error
    booked = [e for e in ledger if e["action"] == "book"]
    assert [e["idempotency_key"] for e in booked] == ["h1:book:0", "h1:book:0:1"]
    assert result.state["rooms"] == ["hotel-1", "hotel-2"]


def test_every_step_has_an_idempotency_key_and_ctx_http_sends_it(orc_factory):
    # Given a plain (non-effect) step that charges through ctx.http
    from orchestrator.testing import BookingService

    wf = Workflow("plain-charge")
    seen = {}

    @wf.step(start=True)
    def charge(ctx, state):
        seen["key"] = ctx.idempotency_key
        return {"payment": ctx.http.post(f"{state['api']}/payments", json={"amount": 5}).json()["id"]}

    wf.edge("charge", END)
    with BookingService() as service:
        orc_factory(wf).run(wf, {"api": service.url}, run_id="p1")
        ledger = service.ledger()
    # Then the step had a key, and the request carried it
    assert seen["key"] == "p1:charge:0"
    assert [e["idempotency_key"] for e in ledger if e["action"] == "book"] == ["p1:charge:0"]


# -- case 14: traps of ordinary programs ---------------------------------------------------------------------
def test_a_durable_call_that_failed_is_not_performed_again_after_a_crash(orc_factory):
    # Given a charge that was declined, the process dying before the step's failure was journaled
    from orchestrator import PermanentToolError

    wf = Workflow("declined")
    performed = []

    def charge_card():
        performed.append(1)
        raise PermanentToolError("POST /payments -> 402 Payment Required", tool="payments", status=402)

    @wf.step(start=True)
    def pay(ctx, state):
        return {"paid": ctx.durable_call("payment", {"amount": 5}, charge_card)}

    wf.edge("pay", END)
    orc = orc_factory(wf)
    fail_append_once(orc, lambda events: any(e.kind == EventKind.RUN_FAILED for e in events))
    with pytest.raises(StoreUnavailableError):
        orc.run(wf, {}, run_id="n1")
    # When the run is resumed
    result = orc_factory(wf).resume("n1")
    # Then the declined charge was not sent again: its recorded failure was raised once more
    assert performed == [1]
    assert result.status == "failed" and "402" in result.error


def test_an_effect_whose_key_never_left_the_process_is_in_doubt_after_a_crash(orc_factory):
    # Given an effect step calling its own client without the idempotency key, dying mid-call
    wf = Workflow("own-client")
    charged = []

    @wf.step(start=True, effect=True)
    def charge(ctx, state):
        charged.append("card")  # the user's client: no key sent
        raise Died

    wf.edge("charge", END)
    with pytest.raises(Died):
        orc_factory(wf).run(wf, {}, run_id="o1")
    # When it is resumed
    result = orc_factory(wf).resume("o1")
    # Then it is not charged again blindly: the step fails as in doubt, saying what to do
    assert charged == ["card"]
    assert result.status == "failed" and "InDoubtError" in result.error and "check" in result.error


def test_an_effect_that_sent_its_key_is_re_sent_with_the_same_key_after_a_crash(orc_factory):
    # Given an effect step that passes its key to its own client, dying after the call
    wf = Workflow("keyed-client")
    sent_keys = []

    @wf.step(start=True, effect=True)
    def charge(ctx, state):
        sent_keys.append(ctx.idempotency_key)
        if len(sent_keys) == 1:
            raise Died
        return {"charged": True}

    wf.edge("charge", END)
    with pytest.raises(Died):
        orc_factory(wf).run(wf, {}, run_id="k2")
    # When it is resumed, the call is re-sent with the same key (the service deduplicates it)
    result = orc_factory(wf).resume("k2")
    assert result.status == "completed"
    assert sent_keys == ["k2:charge:0", "k2:charge:0"]


def test_a_durable_call_whose_request_changed_is_refused_unless_the_step_opts_in(orc_factory):
    # Given a call journaled with one request, the process dying before the step completed
    performed = []

    def flow(amount: int, if_changed: str = "raise") -> Workflow:
        wf = Workflow("changed")

        @wf.step(start=True)
        def pay(ctx, state):
            paid = ctx.durable_call("payment", {"amount": amount}, lambda: performed.append(amount) or "ok",
                                    if_changed=if_changed)
            if len(performed) == 1 and amount == 5:
                raise Died
            return {"paid": paid}

        wf.edge("pay", END)
        return wf

    first = flow(5)
    with pytest.raises(Died):
        orc_factory(first).run(first, {}, run_id="q1")
    # When the code now asks for another amount at the same position
    result = orc_factory(flow(7)).resume("q1")
    # Then it is not silently paid again: the step fails naming the difference
    assert performed == [5]
    assert result.status == "failed" and "CallChangedError" in result.error and "amount" in result.error


def test_a_durable_call_whose_request_changed_is_performed_again_visibly_when_the_step_opts_in(orc_factory):
    performed = []

    def flow(amount: int) -> Workflow:
        wf = Workflow("changed-ok")

        @wf.step(start=True)
        def pay(ctx, state):
            paid = ctx.durable_call("payment", {"amount": amount}, lambda: performed.append(amount) or amount,
                                    if_changed="perform")
            if performed == [5]:
                raise Died
            return {"paid": paid}

        wf.edge("pay", END)
        return wf

    first = flow(5)
    with pytest.raises(Died):
        orc_factory(first).run(first, {}, run_id="q2")
    orc = orc_factory(flow(7))
    result = orc.resume("q2")
    assert result.status == "completed" and result.state["paid"] == 7 and performed == [5, 7]
    replaced = [e for e in orc.history("q2") if e["kind"] == EventKind.CALL_COMPLETED and e["data"].get("replaced")]
    assert len(replaced) == 1


# -- case 5: a timed-out sync step ----------------------------------------------------------------------------
def test_a_timed_out_sync_step_is_fenced_and_does_not_hold_the_caller(orc_factory):
    # Given an effect step with a short timeout whose first attempt blocks past it
    wf = Workflow("slow-pay")
    release = threading.Event()
    late = threading.Event()
    outcomes = []

    @wf.step(start=True, effect=True, timeout=0.05, resend=False, retry=Retry(attempts=3, initial=0.01))
    def pay(ctx, state):
        if ctx.attempt == 1:
            release.wait(30)  # the payment provider is slow
            try:
                ctx.durable_call("payment", {"amount": 5}, lambda: outcomes.append("paid late") or "ok")
            except BaseException as exc:  # noqa: BLE001 - the test records what the abandoned thread met
                outcomes.append(type(exc).__name__)
            finally:
                late.set()
            return {"paid": True}
        outcomes.append(f"attempt {ctx.attempt}")
        return {"paid": True}

    wf.edge("pay", END)
    orc = orc_factory(wf)
    done = {}
    runner = threading.Thread(target=lambda: done.setdefault("result", orc.run(wf, {}, run_id="t5")), daemon=True)
    # When the run is driven: the caller gets its answer while the first attempt is still blocked
    runner.start()
    runner.join(30)
    assert not runner.is_alive(), "orc.run waited for the abandoned thread"
    result = done["result"]
    journal_before = seqs(orc, "t5")
    # And the abandoned attempt then wakes up and tries to pay
    release.set()
    assert late.wait(30)
    # Then it was refused before anything left the process or reached the journal
    assert outcomes[0] == "StepTimeoutError"
    assert "paid late" not in outcomes
    assert seqs(orc, "t5") == journal_before
    # And the attempt in doubt (resend=False) was not blindly retried: the step failed as in doubt
    assert result.status == "failed" and "InDoubtError" in result.error
    assert "attempt 2" not in outcomes


def test_a_key_that_left_the_process_stays_known_across_a_second_crash_and_across_retries(orc_factory):
    # Given an effect step that reads its key (so the key leaves the process), then dies in three
    # ways in turn: after its call, again as a resume restarts it before it reaches its call, and
    # (in a second run) in a retry's attempt after a first attempt whose call failed
    sent_keys: list[str] = []
    plan: list[str] = []

    wf = Workflow("key-twice")

    @wf.step(start=True, effect=True, retry=Retry(attempts=3, initial=0.001, jitter=False))
    def charge(ctx, state):
        what = plan.pop(0) if plan else "ok"
        if what == "die-before-send":
            raise Died  # a crash as the step starts again: nothing of this attempt left the process
        sent_keys.append(ctx.idempotency_key)
        if what == "die-after-send":
            raise Died
        if what == "fail":
            raise ConnectionError("the service answered 500")
        return {"charged": True}

    wf.edge("charge", END)
    # When the first run dies after its call and its resume dies before the call
    plan[:] = ["die-after-send", "die-before-send"]
    with pytest.raises(Died):
        orc_factory(wf).run(wf, {}, run_id="k3")
    with pytest.raises(Died):
        orc_factory(wf).resume("k3")
    # Then the next resume still knows the key went out, and re-sends with it instead of failing in doubt
    result = orc_factory(wf).resume("k3")
    assert result.status == "completed", result.error
    assert sent_keys == ["k3:charge:0", "k3:charge:0"]
    # When a second run's first attempt sends its key and fails, and its retry dies as it starts
    sent_keys.clear()
    plan[:] = ["fail", "die-before-send"]
    with pytest.raises(Died):
        orc_factory(wf).run(wf, {}, run_id="k4")
    # Then the resume re-sends with the same key: the service already knows it
    result = orc_factory(wf).resume("k4")
    assert result.status == "completed", result.error
    assert sent_keys == ["k4:charge:0", "k4:charge:0"]


def test_after_a_crash_in_the_backoff_of_a_timed_out_effect_its_check_hook_waits_for_the_backoff(db_url, fake_time):
    # Given an effect step whose first attempt overran its timeout (in doubt), with a 30 s backoff
    # journaled, and whose process died while waiting it out
    from orchestrator import Orchestrator

    release = threading.Event()
    asked: list[float] = []
    wf = Workflow("timed-charge")

    def charged(ctx, state):
        asked.append(fake_time.clock())
        return {"charged": True}

    @wf.step(start=True, effect=True, timeout=0.05, check=charged, retry=Retry(attempts=3, initial=30, jitter=0))
    def charge(ctx, state):
        release.wait(60)  # blocked past its timeout: given up on, in doubt
        return {"charged": True}

    wf.edge("charge", END)

    async def dies_in_the_backoff(seconds: float) -> None:
        raise Died

    try:
        with pytest.raises(Died), Orchestrator(db_url, workflows=[wf], clock=fake_time.clock,
                                               sleep=dies_in_the_backoff) as orc:
            orc.run(wf, {}, run_id="t1")
    finally:
        release.set()
    # When the run is resumed at once in a new process
    with Orchestrator(db_url, workflows=[wf], clock=fake_time.clock, sleep=fake_time.sleep) as orc:
        [failed] = [e["data"] for e in orc.history("t1") if e["kind"] == "StepFailed"]
        result = orc.resume("t1")
    # Then the check hook that settles the attempt in doubt was asked once the backoff was over, as
    # without the crash (asked at once, it could find a service still acting on the request)
    assert result.status == "completed", result.error
    assert asked == [pytest.approx(failed["retry_at"], abs=1e-3)] and asked[0] >= failed["retry_at"] - 1e-3
