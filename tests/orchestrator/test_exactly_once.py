"""Exactly-once when two ordinary things meet: each case a regression test, on SQLite and Postgres.

The cases are the ones a review reproduced against the engine (a retry and a crash, a timeout and a
sync step, a signal and parking, a rollback and a wait, a failed database write and a parallel
sibling, ...). The crash-point explorer under ``tests/explorer`` sweeps every crash point; these
tests pin each case by name.
"""

from __future__ import annotations

import threading

import pytest

from orchestrator.engine import EventKind
from store import StoreUnavailableError
from workflows import END, Retry, Workflow


class Died(BaseException):
    """Stands for the process dying at this point (nothing after it runs)."""


def kinds(orc, run_id):
    return [e["kind"] for e in orc.history(run_id)]


def seqs(orc, run_id):
    return [e["seq"] for e in orc.history(run_id)]


def fail_append_once(orc, when):
    """Make the store's append raise StoreUnavailableError once, the first time ``when(events)`` holds."""
    real = orc.store.append
    state = {"failed": False}

    def append(run_id, events, **kw):
        if not state["failed"] and when(events):
            state["failed"] = True
            raise StoreUnavailableError("injected: the database went away during this append")
        return real(run_id, events, **kw)

    orc.store.append = append
    return state


# -- case 1: a failed journal write ------------------------------------------------------------------
def test_a_failed_write_in_a_parallel_tick_leaves_the_journal_dense_and_the_run_resumable(orc_factory):
    # Given two parallel branches, and the first of their completions failing to commit once
    wf = Workflow("branches")
    gate = threading.Barrier(2, timeout=30)

    @wf.step(start=True)
    def split(ctx, state):
        return {}

    @wf.step()
    def left(ctx, state):
        gate.wait()
        return {"left": 1}

    @wf.step()
    def right(ctx, state):
        gate.wait()
        return {"right": 1}

    @wf.step()
    def done(ctx, state):
        return {"total": state["left"] + state["right"]}

    wf.edge("split", "left")
    wf.edge("split", "right")
    wf.edge(["left", "right"], "done")
    wf.edge("done", END)
    orc = orc_factory(wf)
    fail_append_once(orc, lambda events: any(e.kind == EventKind.STEP_COMPLETED and '"tick":1' in e.data
                                             for e in events))
    # When the run is driven, the write fails
    with pytest.raises(StoreUnavailableError):
        orc.run(wf, {}, run_id="b1")
    # Then the journal has no gap and verifies, and the run resumes to the end
    assert seqs(orc, "b1") == list(range(1, len(seqs(orc, "b1")) + 1))
    assert orc.verify("b1").ok
    result = orc.resume("b1")
    assert result.status == "completed" and result.state["total"] == 2
    assert seqs(orc, "b1") == list(range(1, len(seqs(orc, "b1")) + 1))
    assert orc.verify("b1").ok


def test_a_failed_write_inside_a_step_is_not_retried_as_a_step_failure(orc_factory):
    # Given a retrying step whose durable call's journal write fails once
    wf = Workflow("retry-store")
    performed = []

    @wf.step(start=True, retry=Retry(attempts=3))
    def call(ctx, state):
        return {"r": ctx.durable_call("svc", {"q": 1}, lambda: performed.append(1) or "ok")}

    wf.edge("call", END)
    orc = orc_factory(wf)
    fail_append_once(orc, lambda events: any(e.kind == EventKind.CALL_COMPLETED for e in events))
    # When the run is driven
    with pytest.raises(StoreUnavailableError):
        orc.run(wf, {}, run_id="r1")
    # Then the database error was not journaled as a failed attempt (no retry was spent on it)
    assert EventKind.STEP_FAILED not in kinds(orc, "r1")
    # And the run completes on resume; the call was performed again only because its result never became durable
    assert orc.resume("r1").status == "completed"
    assert orc.verify("r1").ok and len(performed) == 2


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


# -- case 15: a decision once journaled is never re-made ------------------------------------------------
def test_a_step_that_gave_up_is_not_run_again_after_a_crash_before_the_run_failed(orc_factory):
    # Given a step that fails twice (its Retry allows 2 attempts) and would succeed a third time
    wf = Workflow("gives-up")
    ran = []

    @wf.step(start=True, retry=Retry(attempts=2, initial=0.1))
    def flaky(ctx, state):
        ran.append(ctx.attempt)
        if len(ran) <= 2:
            raise ValueError(f"failure {len(ran)}")
        return {"ok": True}

    wf.edge("flaky", END)
    orc = orc_factory(wf)
    real = orc.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if events and events[-1].kind == EventKind.STEP_FAILED and '"final":true' in events[-1].data:
            raise Died  # the process dies right after journaling the final failure
        return out

    orc.store.append = append
    try:
        orc.run(wf, {}, run_id="g1")
    except Died:
        pass
    # When the run is resumed in a new process
    result = orc_factory(wf).resume("g1")
    # Then the step that gave up is not run again: the run failed, after exactly its two attempts
    assert ran == [1, 2]
    assert result.status == "failed"
    assert kinds(orc, "g1")[-1] == EventKind.RUN_FAILED


# -- case 7: rollback does not reuse what came after the checkpoint --------------------------------------
def test_after_a_rollback_a_signal_received_after_the_checkpoint_is_not_reused(orc_factory):
    # Given a draft that is approved by a signal, the process dying after the approval was received
    wf = Workflow("drafts")
    versions = []
    die = {"after_approval": True}

    @wf.step(start=True)
    def draft(ctx, state):
        versions.append(len(versions) + 1)
        return {"draft": f"v{versions[-1]}"}

    @wf.step()
    def approve(ctx, state):
        data = ctx.wait_for("approval")
        if die["after_approval"]:
            die["after_approval"] = False
            raise Died
        return {"approved": data["draft"]}

    wf.edge("draft", "approve")
    wf.edge("approve", END)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="d1").status == "waiting"
    orc.signal("d1", "approval", {"draft": "v1"})
    with pytest.raises(Died):
        orc.resume("d1")
    # When the run is rolled back to before the draft (a new draft is made)
    result = orc_factory(wf).rollback("d1", to="draft")
    # Then the new draft waits for an approval of its own instead of reusing v1's
    assert versions == [1, 2]
    assert result.status == "waiting"
    orc.signal("d1", "approval", {"draft": "v2"})
    assert orc.resume("d1").state["approved"] == "v2"
    assert orc.verify("d1").ok


# -- case 8: a compensation that cannot be found --------------------------------------------------------
def booking_flow(compensate):
    wf = Workflow("trip")

    @wf.step(start=True, effect=True, compensate=compensate)
    def book(ctx, state):
        return {"booking": "B-1"}

    @wf.step()
    def pay(ctx, state):
        raise RuntimeError("card declined")

    wf.edge("book", "pay")
    wf.edge("pay", END)
    return wf


def test_a_missing_compensation_ends_compensation_failed_naming_the_effect(orc_factory):
    # Given a booking made while its step had a compensation, and the process dying before paying
    undone = []

    def cancel_booking(ctx, effect):
        undone.append(effect.result["booking"])

    wf = booking_flow(cancel_booking)
    orc = orc_factory(wf)
    real = orc.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if any(e.kind == EventKind.STEP_COMPLETED for e in events):
            raise Died
        return out

    orc.store.append = append
    with pytest.raises(Died):
        orc.run(wf, {}, run_id="t1")
    # When the code lost the compensation, the change is detected like any graph change
    changed = booking_flow(None)
    with pytest.raises(Exception, match="compensat"):
        orc_factory(changed).resume("t1")
    # And when resumed anyway (allow_graph_change) the saga does not claim to have compensated
    result = orc_factory(changed).resume("t1", allow_graph_change=True)
    assert undone == []
    assert result.status == "compensation_failed"
    assert "book" in result.error and "compensation" in result.error


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


# -- case 10: a step cannot change state except through its update ----------------------------------------
def test_mutating_nested_state_in_place_changes_nothing(orc_factory):
    # Given a step that appends to a nested list of its state in place and returns no update
    wf = Workflow("mutator")

    @wf.step(start=True)
    def sneaky(ctx, state):
        state["items"].append("sneaked in")
        state["meta"]["count"] += 1
        return {}

    @wf.step()
    def look(ctx, state):
        return {"seen": list(state["items"]), "count": state["meta"]["count"]}

    wf.edge("sneaky", "look")
    wf.edge("look", END)
    orc = orc_factory(wf, snapshot_every=1)
    result = orc.run(wf, {"items": ["a"], "meta": {"count": 0}}, run_id="m1")
    # Then the next step saw the state as the journal has it, and every snapshot verifies
    assert result.state["seen"] == ["a"] and result.state["count"] == 0
    assert orc.verify("m1").ok


# -- case 13: a journaled backoff is honoured after a crash -----------------------------------------------
def test_a_retry_delay_journaled_before_a_crash_is_waited_out_after_resume(orc_factory, fake_time):
    # Given a step whose first attempt failed with a 30 s backoff, the process dying while it waited
    wf = Workflow("backoff")
    started_at = []

    @wf.step(start=True, retry=Retry(attempts=3, initial=30.0, jitter=False))
    def call(ctx, state):
        started_at.append(fake_time.now)
        if len(started_at) == 1:
            raise ConnectionError("503")
        return {"ok": True}

    wf.edge("call", END)

    async def die_while_sleeping(seconds):
        raise Died

    orc = orc_factory(wf, sleep=die_while_sleeping)
    with pytest.raises(Died):
        orc.run(wf, {}, run_id="k1")
    failed_at = fake_time.now
    # When a new process resumes the run 10 s later
    fake_time.advance(10)
    result = orc_factory(wf).resume("k1")
    # Then the second attempt waited out the remaining 20 s of the journaled delay
    assert result.status == "completed"
    assert started_at[1] >= failed_at + 30.0


# -- case 17: a snapshot past the end of the journal ------------------------------------------------------
def _execute(db_url: str, sql: str, params: tuple) -> None:
    if db_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(db_url.split("sqlite:///", 1)[1]) as conn:
            conn.execute(sql.replace("%s", "?"), params)
    else:
        import psycopg

        base, _, query = db_url.partition("?")
        schema = query.split("search_path%3D", 1)[1]
        with psycopg.connect("postgresql://" + base.split("://", 1)[1], autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(sql, params)


def test_a_snapshot_beyond_the_end_of_the_journal_is_not_trusted(orc_factory, db_url):
    # Given a finished run with snapshots, whose journal lost its last events
    wf = Workflow("short")

    @wf.step(start=True)
    def one(ctx, state):
        return {"n": 1}

    @wf.step()
    def two(ctx, state):
        return {"n": 2}

    wf.edge("one", "two")
    wf.edge("two", END)
    orc = orc_factory(wf, snapshot_every=1)
    orc.run(wf, {}, run_id="s1")
    last = seqs(orc, "s1")[-1]
    _execute(db_url, "DELETE FROM agentsaga_events WHERE seq > %s AND run_pk = "
                     "(SELECT pk FROM agentsaga_runs WHERE run_id = %s)", (last - 2, "s1"))
    # When its state is restored
    folded, snap_seq, rejected = orc.engine.restore("s1", wf)
    # Then no snapshot beyond the journal's end was used, and verify says what is wrong
    assert folded.seq == last - 2 and snap_seq <= last - 2
    assert any(seq > last - 2 for seq, _ in rejected)
    assert not orc.verify("s1").ok


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


# -- case 6: a signal is never lost --------------------------------------------------------------------------
def test_a_signal_sent_between_the_steps_look_and_the_park_wakes_the_run(orc_factory):
    # Given a step waiting for approval, and the approval sent just after the step looked for it
    wf = Workflow("approval")

    @wf.step(start=True)
    def approve(ctx, state):
        return {"by": ctx.wait_for("approval")["by"]}

    wf.edge("approve", END)
    orc = orc_factory(wf)
    sender = orc_factory(wf)
    real_pending = orc.store.signals.pending

    def pending_then_signal(run_id, name=None):
        found = real_pending(run_id, name)
        if not found:
            sender.signal(run_id, "approval", {"by": "ann"})  # lands after the look, before the park
        return found

    orc.store.signals.pending = pending_then_signal
    # When the run parks
    assert orc.run(wf, {}, run_id="a1").status == "waiting"
    # Then it is due at once: recovery drives it to the end with the approval, consumed exactly once
    results = orc_factory(wf).recover()
    assert [(r.run_id, r.status) for r in results] == [("a1", "completed")]
    assert orc.result("a1").state["by"] == "ann"
    assert kinds(orc, "a1").count(EventKind.SIGNAL_RECEIVED) == 1


def test_a_signal_for_a_wait_not_yet_reached_is_kept_and_delivered_once(orc_factory):
    # Given a run waiting for a first signal
    wf = Workflow("two-waits")

    @wf.step(start=True)
    def first(ctx, state):
        return {"a": ctx.wait_for("first")}

    @wf.step()
    def second(ctx, state):
        return {"b": ctx.wait_for("second")}

    wf.edge("first", "second")
    wf.edge("second", END)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="w2").status == "waiting"
    # When the second signal is sent before the first, then the first
    orc.signal("w2", "second", 2)
    orc.signal("w2", "first", 1)
    # Then both are delivered, each exactly once
    result = orc.resume("w2")
    assert result.status == "completed" and result.state == {"a": 1, "b": 2}
    assert kinds(orc, "w2").count(EventKind.SIGNAL_RECEIVED) == 2


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


# -- found by the crash-point explorer (tests/explorer): a run taken over while parked ----------------------
def _reviewed_flow() -> Workflow:
    wf = Workflow("reviewed")

    @wf.step(start=True)
    def draft(ctx, state):
        return {"draft": "v2" if state.get("feedback") else "v1"}

    @wf.step()
    def approve(ctx, state):
        return {"approved": ctx.wait_for("approval")["by"]}

    wf.edge("draft", "approve")
    wf.edge("approve", END)
    return wf


def test_a_waiting_run_whose_rollback_died_midway_is_recovered_once_its_lease_expires(orc_factory, fake_time):
    # Given a run parked until a signal comes (no timeout)
    wf = _reviewed_flow()
    orc = orc_factory(wf, lease_ttl=5)
    assert orc.run(wf, {}, run_id="rv").status == "waiting"
    # When a rollback takes it over and its process dies once the saga's start is journaled
    dying = orc_factory(wf, lease_ttl=5)
    real = dying.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if any(e.kind == EventKind.SAGA_STARTED for e in events):
            raise Died
        return out

    dying.store.append = append
    with pytest.raises(Died):
        dying.rollback("rv", to="draft", input={"feedback": 1})
    # Then, once the dead owner's lease expired, recovery in a new process picks the run up (it is no
    # longer parked: the wake-up time of the wait it left must not hide it) and the rollback completes
    fake_time.advance(60)
    results = orc_factory(wf, lease_ttl=5).recover()
    assert [(r.run_id, r.status) for r in results] == [("rv", "waiting")]
    assert orc.result("rv").state["draft"] == "v2"
    assert EventKind.ROLLED_BACK in kinds(orc, "rv")
    assert orc.verify("rv").ok


def test_a_waiting_run_resumed_by_a_process_that_died_is_recovered_once_its_lease_expires(orc_factory, fake_time):
    # Given a run parked until a signal comes, explicitly resumed by a process that dies at once
    wf = _reviewed_flow()
    orc = orc_factory(wf, lease_ttl=5)
    assert orc.run(wf, {}, run_id="rw").status == "waiting"
    dying = orc_factory(wf, lease_ttl=5)
    real = dying.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if any(e.kind == EventKind.RESUMED for e in events):
            raise Died
        return out

    dying.store.append = append
    with pytest.raises(Died):
        dying.resume("rw")
    # When the signal is sent, and the dead owner's lease has expired
    orc.signal("rw", "approval", {"by": "ann"})
    fake_time.advance(60)
    # Then recovery picks the run up and it completes with the approval
    results = orc_factory(wf, lease_ttl=5).recover()
    assert [(r.run_id, r.status) for r in results] == [("rw", "completed")]
    assert orc.result("rw").state["approved"] == "ann"
