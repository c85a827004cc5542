"""The explorer's checks can fail: each one is shown a world where its rule was broken.

A sweep that finds nothing is only worth something if its checks would have found a violation.
Here a careless flow books with a fresh idempotency key on every execution (so a crash after the
booking left makes the resumed run book again), a run's ledger is shown its cancellations in the
wrong order, and the execution ledger is shown a step starting again after its completion was
journaled. The catalog flow's checks are shown an answer over 1 MiB journaled as a call, re-sent
under another key, a call moved into the position it leaves, and an engine that starts a timed
attempt's timer before making its process's HTTP clients.
"""

from __future__ import annotations

import dataclasses
import uuid
from types import SimpleNamespace

import pytest

from explorer_calls import outgoing_calls_instrumented
from explorer_flows import FLOWS, Flow
from explorer_harness import World, check, explore
from explorer_process import CURRENT, Plan, Process

from workflows import END, Workflow


class Careless(Flow):
    """Books a car with a new key on every execution: a re-run after a crash books twice."""

    status = "completed"

    def __init__(self, world) -> None:
        wf = Workflow("careless", version="1")

        @wf.step(start=True, effect=True, resend=True)
        def book(ctx, state):
            world.executed(ctx)
            headers = {"Idempotency-Key": uuid.uuid4().hex}  # the mistake: not the step's key
            return {"car": ctx.http.post(f"{world.api}/cars", json={"car": "van"}, headers=headers).json()["id"]}

        wf.edge("book", END)
        self.workflow = wf


class CarelessAsync(Flow):
    """The same mistake in an async step, through ``ctx.ahttp`` (the shared async client's transport)."""

    status = "completed"

    def __init__(self, world) -> None:
        wf = Workflow("careless-async", version="1")

        @wf.step(start=True, effect=True, resend=True)
        async def book(ctx, state):
            world.executed(ctx)
            headers = {"Idempotency-Key": uuid.uuid4().hex}
            booked = await ctx.ahttp.post(f"{world.api}/cars", json={"car": "van"}, headers=headers)
            return {"car": booked.json()["id"]}

        wf.edge("book", END)
        self.workflow = wf


@pytest.mark.parametrize("flow", [Careless, CarelessAsync], ids=["ctx.http", "ctx.ahttp"])
def test_a_booking_repeated_by_a_resumed_run_is_reported(db_url, flow):
    # Given the careless flow's reference run and its crash points (its request passes them,
    # whichever client sends it)
    with outgoing_calls_instrumented():
        reference = explore(flow, db_url, "careless-reference", Plan())
        assert "send POST /cars" in reference.points and "sent POST /cars" in reference.points
        sent = reference.points.index("sent POST /cars") + 1
        # When the process dies after the service booked, before the answer was journaled
        outcome = explore(flow, db_url, "careless-crash", Plan(at=sent))
    # Then the check names the booking that took effect twice
    problems = check(outcome, reference)
    assert any('car {"car": "van"} took effect 2 times' in p for p in problems), problems


def test_compensations_in_the_wrong_order_or_twice_are_reported(db_url, chat_url):
    # Given a compensated trip's outcome
    with outgoing_calls_instrumented():
        reference = explore(FLOWS["trip"], db_url, "trip-order", Plan(), chat_url=chat_url)
    assert check(reference, reference) == []
    # When its cancellations are seen in another order, or one of them twice
    swapped = dataclasses.replace(reference, ledger=[dict(e) for e in reference.ledger])
    cancels = [i for i, e in enumerate(swapped.ledger) if e["action"] == "cancel"]
    a, b = cancels[0], cancels[1]
    swapped.ledger[a], swapped.ledger[b] = swapped.ledger[b], swapped.ledger[a]
    twice = dataclasses.replace(reference, ledger=[dict(e) for e in reference.ledger])
    twice.ledger.append(dict(twice.ledger[cancels[0]]))
    # Then each is reported
    assert any("differ from the reference's" in p for p in check(swapped, reference))
    assert any("was cancelled 2 times" in p for p in check(twice, reference))


def test_a_step_starting_again_after_its_completion_was_journaled_is_reported(db_url, chat_url):
    # Given a finished fanout run, read through a process of the explorer
    with outgoing_calls_instrumented():
        done = explore(FLOWS["fanout"], db_url, "fanout-again", Plan(), chat_url=chat_url)
    assert done.result.status == "completed"
    from store import open_store

    store = open_store(db_url)
    try:
        world = World(service=SimpleNamespace(url="http://127.0.0.1:9"), clock=None)
        process = Process("late")
        process.store = store
        token = CURRENT.set(process)
        try:
            # When the step 'merge' of that tick starts once more
            world.executed(SimpleNamespace(run_id="fanout-again", step="merge", tick=2))
        finally:
            CURRENT.reset(token)
    finally:
        store.close()
    # Then the execution ledger reports it as a violation of invariant 1
    assert world.violations and "'merge'" in world.violations[0] and "invariant 1" in world.violations[0]


# -- the group's checks (explorer_group.py) ------------------------------------------------------------
def test_a_group_run_booking_again_after_a_crash_is_reported_for_that_run(db_url):
    from explorer_group import check_group, explore_group

    # Given the group driven with a careless reserve (a fresh key per execution) and its reference
    with outgoing_calls_instrumented():
        reference = explore_group(db_url, "careless-group-reference", Plan(), careless=True)
        assert check_group(reference, reference) == []
        # When the process dies after the service booked r2's car, before its answer was journaled
        outcome = explore_group(db_url, "careless-group-crash", Plan(target="sent POST /cars?run=r2"),
                                careless=True)
    # Then the check names r2's booking, which took effect twice
    problems = check_group(outcome, reference)
    assert any('booking {"car": "r2"} took effect 2 times' in p for p in problems), problems


def test_a_group_journal_gap_a_lost_or_doubled_compensation_and_a_different_end_are_reported(db_url):
    from explorer_group import check_group, check_group_reference, explore_group

    # Given the group's reference outcome
    with outgoing_calls_instrumented():
        reference = explore_group(db_url, "group-checks", Plan())
    check_group_reference(reference)
    cancel = next(e for e in reference.ledger if e["action"] == "cancel")
    # When r3's journal skips a seq, r2's cancellation is missing or made twice, r1 ends elsewhere
    gap = dataclasses.replace(reference, histories={**reference.histories,
                                                    "r3": [e for e in reference.histories["r3"] if e["seq"] != 2]})
    lost = dataclasses.replace(reference, ledger=[e for e in reference.ledger if e is not cancel])
    twice = dataclasses.replace(reference, ledger=[*reference.ledger, dict(cancel)])
    running = dataclasses.replace(reference.results["r1"], status="running")
    elsewhere = dataclasses.replace(reference, results={**reference.results, "r1": running})
    # Then each is reported, naming the run
    assert any("run r3: the journal's seqs are not 1..n" in p for p in check_group(gap, reference))
    assert any("compensations" in p for p in check_group(lost, reference))
    assert any('booking {"car": "r2"} was cancelled 2 times' in p for p in check_group(twice, reference))
    assert any(p.startswith("run r1: final running") for p in check_group(elsewhere, reference))


def test_a_fault_that_half_wrote_a_group_or_stopped_an_untouched_run_is_reported(db_url):
    from explorer_group import check_fault, explore_group

    # Given r2's appends refused in the group's transaction of the reserve completions
    target = "before r2 StepCompleted:reserve"
    with outgoing_calls_instrumented():
        outcome = explore_group(db_url, "group-item", Plan(target=target, what="item"))
    assert check_fault(outcome, target, "item") == [], outcome.processes[0].faulted
    refused = outcome.processes[0].fault_items["r2"]
    # When the journal right after it held the refused append, or r1 had stopped with r2
    half = dataclasses.replace(outcome, mid={**outcome.mid, "r2": [
        *outcome.mid["r2"], *({"seq": s, "kind": "StepCompleted"} for s in refused)]})
    stopped = dataclasses.replace(outcome, first={**outcome.first, "r1": RuntimeError("stopped")})
    # Then each is reported
    assert any("were journaled (half-written)" in p for p in check_fault(half, target, "item"))
    assert any("run r1, untouched by the fault" in p for p in check_fault(stopped, target, "item"))


# -- the in-doubt rules and the invariants on the journal (explorer_oracle.py) ------------------------
def _variant(name: str, variant: str):
    import functools

    return functools.partial(FLOWS[name], variant=variant)


def test_an_in_doubt_verdict_given_or_missed_against_what_the_deaths_left_is_reported(db_url, chat_url):
    from explorer_harness import judge
    from explorer_oracle import doubtful

    flow = _variant("trip", "default")
    with outgoing_calls_instrumented():
        reference = explore(flow, db_url, "doubt-reference", Plan(), chat_url=chat_url)
        # Given a death right after the flight's intent was durable, before its key was issued
        k = reference.points.index("after append[StepStarted:flight]") + 1
        in_doubt = explore(flow, db_url, "doubt-window", Plan(at=k), chat_url=chat_url)
        # and a death once the flight's key had been issued
        issued = explore(flow, db_url, "doubt-issued", Plan(at=k + 2), chat_url=chat_url)
    assert doubtful(in_doubt.deaths[0]) == {"flight": "doubt-window:flight:0"}
    assert judge(in_doubt, reference, FLOWS["trip"], "default") == []
    assert doubtful(issued.deaths[0]) == {} and judge(issued, reference, FLOWS["trip"], "default") == []
    # When the in-doubt ending is held against a death that left nothing in doubt, or the other way round
    given = dataclasses.replace(in_doubt, deaths=issued.deaths)
    missed = dataclasses.replace(issued, deaths=in_doubt.deaths)
    # Then each is reported
    assert any("failed as in doubt, but no death left" in p for p in judge(given, reference, FLOWS["trip"], "default"))
    assert any("none was failed as in doubt" in p for p in judge(missed, reference, FLOWS["trip"], "default"))
    # and under a rule that re-sends or checks, a step failed as in doubt is reported too
    checked = judge(in_doubt, reference, FLOWS["trip"], "check")
    assert any("failed as in doubt under the 'check' rule" in p for p in checked)


def test_a_journal_breaking_invariants_1_3_4_or_5_is_reported(db_url, chat_url):
    from explorer_oracle import invariant_problems

    # Given a compensated trip's journal and ledger, which keep every invariant
    with outgoing_calls_instrumented():
        ref = explore(FLOWS["trip"], db_url, "inv", Plan(), chat_url=chat_url)
    wf, run = ref.workflow, "inv"
    assert invariant_problems(ref.history, ref.ledger, wf, run) == []
    flight_done = next(e for e in ref.history if e["kind"] == "StepCompleted" and e["data"]["step"] == "flight")
    rooms_started = next(e for e in ref.history if e["kind"] == "StepStarted" and e["data"]["step"] == "rooms")
    undo = [e for e in ref.history if e["kind"] == "CompensationCompleted"]

    def renumber(events):
        return [{**e, "seq": i} for i, e in enumerate(events, 1)]

    # When the flight's completion is journaled twice; the rooms start before the flight completed;
    # the payment's retry carries another key; a booking was made with a key no intent carries, or
    # requested again with another key; an effect is compensated twice, or the oldest first
    i = ref.history.index(flight_done)
    twice = renumber(ref.history[:i + 1] + [flight_done] + ref.history[i + 1:])
    early = renumber([e for e in ref.history if e is not rooms_started][:i] + [rooms_started]
                     + [e for e in ref.history if e is not rooms_started][i:])
    retried = [e for e in ref.history if e["kind"] == "StepStarted" and e["data"]["step"] == "pay"][1]
    rekeyed = [{**e, "data": {**e["data"], "key": "inv:pay:9"}} if e is retried else e for e in ref.history]
    stray = ref.ledger + [{"action": "book", "kind": "car", "id": "car-9", "body": {"car": "x"},
                           "idempotency_key": "inv:pay:7"}]
    rekeyed_request = ref.ledger + [{"action": "replay", "kind": "flight", "id": "flight-1",
                                     "idempotency_key": "inv:flight:0:other"}]
    j = ref.history.index(undo[0])
    undone_twice = renumber(ref.history[:j + 1] + [undo[0]] + ref.history[j + 1:])
    oldest_first = [dict(e) for e in ref.history]
    a, b = oldest_first.index(undo[0]), oldest_first.index(undo[-1])
    oldest_first[a], oldest_first[b] = {**undo[-1], "seq": undo[0]["seq"]}, {**undo[0], "seq": undo[-1]["seq"]}
    # Then each is reported, naming its invariant
    assert any("completed 2 times in the journal (invariant 1)" in p
               for p in invariant_problems(twice, ref.ledger, wf, run))
    assert any("not a pending step of the journaled frontier" in p
               for p in invariant_problems(early, ref.ledger, wf, run))
    assert any("journaled several keys" in p for p in invariant_problems(rekeyed, ref.ledger, wf, run))
    assert any("which no journaled intent carries" in p for p in invariant_problems(ref.history, stray, wf, run))
    assert any("requested with several keys" in p for p in invariant_problems(ref.history, rekeyed_request, wf, run))
    assert any("compensated 2 times (invariant 5)" in p for p in invariant_problems(undone_twice, ref.ledger, wf, run))
    assert any("not newest first (invariant 5)" in p for p in invariant_problems(oldest_first, ref.ledger, wf, run))


def test_snapshots_that_disagree_with_the_fold_of_the_journal_are_reported(db_url, chat_url):
    from explorer_oracle import fold_problems

    from store import open_store
    from workflows import Workflow

    # Given a finished fanout run, whose snapshots were folded with its 'log' reducer (append)
    with outgoing_calls_instrumented():
        done = explore(FLOWS["fanout"], db_url, "fanout-folds", Plan(), chat_url=chat_url)
    assert done.fold_problems == []
    # When its journal is folded by a workflow that merges 'log' otherwise (by replacing it)
    other = Workflow("fanout", version="1")
    store = open_store(db_url)
    try:
        problems = fold_problems(store, "fanout-folds", other, "at the end")
    finally:
        store.close()
    # Then the snapshots and what recovery restores are reported as other than the fold of all events
    assert any("fold(snapshot at seq" in p for p in problems), problems
    assert any("recovery restores" in p for p in problems), problems


class KeyBeforeIssue(Flow):
    """Sends the step's own key with a client of its own, without reading ``ctx.idempotency_key``:
    the key leaves the process before its issue was journaled."""

    status = "completed"

    def __init__(self, world) -> None:
        import httpx

        wf = Workflow("key-before-issue", version="1")

        @wf.step(start=True, effect=True, resend=True)
        def book(ctx, state):
            world.executed(ctx)
            key = f"{ctx.run_id}:{ctx.step}:{ctx.tick}"  # the mistake: not through ctx
            booked = httpx.post(f"{world.api}/cars", json={"car": "own"}, headers={"Idempotency-Key": key})
            return {"car": booked.json()["id"]}

        wf.edge("book", END)
        self.workflow = wf


def test_a_request_leaving_before_its_keys_issue_or_a_compensation_sent_after_its_confirmation_is_reported(
        db_url, chat_url):
    from explorer_harness import journal_of

    from store import open_store

    # Given a step that sends its key before the journal says it was issued
    with outgoing_calls_instrumented():
        outcome = explore(KeyBeforeIssue, db_url, "own-key", Plan())
        # Then the request is reported as it leaves
        assert any("KeyIssued was not journaled before its key left" in v
                   for v in outcome.violations), outcome.violations
        # Given a compensated trip
        trip = explore(FLOWS["trip"], db_url, "late-undo", Plan(), chat_url=chat_url)
    assert trip.violations == []
    store = open_store(db_url)
    try:
        world = World(service=SimpleNamespace(url="http://127.0.0.1:9"), clock=None, run_id="late-undo",
                      effects=frozenset({"flight", "rooms", "pay"}))
        process = Process("late")
        process.store = store
        # When the flight's cancellation is sent once more, after its CompensationCompleted
        world.sending(process, "DELETE", "http://127.0.0.1:9/flights/flight-1", "late-undo:flight:0:compensate")
        # or a router is asked where a step whose decision is journaled goes
        token = CURRENT.set(process)
        try:
            world.routed("rooms", 1)
        finally:
            CURRENT.reset(token)
        assert journal_of(store, "late-undo")
    finally:
        store.close()
    # Then each is reported
    assert any("already confirmed" in v and "invariant 5" in v for v in world.violations), world.violations
    assert any("router of 'rooms'" in v and "invariant 3" in v for v in world.violations), world.violations


def test_a_big_answer_journaled_re_sent_under_another_key_or_a_call_moved_after_it_is_reported(db_url):
    from explorer_harness import check
    from explorer_oracle import invariant_problems

    # Given the catalog flow's reference (answers over 1 MiB in a sync effect, a plain async step
    # woken from its wait, and an async effect), and a crash right after the receipt's big answer
    with outgoing_calls_instrumented():
        reference = explore(FLOWS["catalog"], db_url, "big-reference", Plan())
        k = reference.points.index("sent GET /catalog/receipt") + 1
        outcome = explore(FLOWS["catalog"], db_url, "big-crash", Plan(at=k))
    assert check(outcome, reference) == []
    fetched = [e for e in outcome.ledger if e["action"] == "fetch"]
    # (the digest was fetched again when its step was woken, the receipt when pay ran again: same keys)
    assert [e["part"] for e in fetched] == ["rooms", "digest", "digest", "receipt", "receipt"]
    assert fetched[3]["idempotency_key"] == fetched[4]["idempotency_key"] == "big-crash:pay:2:1"
    wf, run = outcome.workflow, "big-crash"
    flight = next(e for e in outcome.history if e["kind"] == "CallCompleted" and e["data"]["index"] == 2)

    # When the big answer is journaled as a call; when it is re-sent under a new key, or under the
    # key of a position no intent has; when the call after it moves up into its position
    response = flight["data"]["response"]
    big = {**response, "url": response["url"].replace("/flights", "/catalog/receipt")}
    journaled = [{**e, "data": {**e["data"], "index": 1, "response": big}} if e is flight else e
                 for e in outcome.history]
    rekeyed = outcome.ledger + [{**fetched[4], "idempotency_key": "big-crash:pay:2:9"}]
    stray = [e if e is not fetched[0] else {**e, "idempotency_key": "big-crash:fetch:7"} for e in outcome.ledger]
    moved = dataclasses.replace(outcome, history=[
        {**e, "data": {**e["data"], "index": 1}} if e is flight else e for e in outcome.history])

    # Then each is reported
    assert any("journals a call whose answer is over 1 MiB" in p
               for p in invariant_problems(journaled, outcome.ledger, wf, run))
    assert any("requested with several keys" in p and "'receipt'" in p
               for p in invariant_problems(outcome.history, rekeyed, wf, run))
    assert any("which no journaled intent carries" in p for p in invariant_problems(outcome.history, stray, wf, run))
    assert any("the big answers were requested with the keys" in p
               for p in check(dataclasses.replace(outcome, ledger=rekeyed), reference))
    assert any("a call moved" in p for p in check(moved, reference))


@pytest.mark.parametrize("where", ["first process", "recovery"])
def test_a_timed_step_charged_for_its_processes_first_http_client_is_reported(db_url, monkeypatch, where):
    from explorer_harness import check

    from orchestrator.engine.steps import StepRunner

    # Given the catalog flow's reference, whose timed steps never time out
    with outgoing_calls_instrumented():
        reference = explore(FLOWS["catalog"], db_url, f"warm-reference-{where[0]}", Plan())
        assert reference.processes[0].context_made
        # When the engine no longer makes the HTTP clients before a timed attempt's timer starts, and
        # the run is driven by a first process (the sync fetch makes the clients) or recovered by a
        # fresh one after a death just before the async pay began (pay's ctx.ahttp makes them)
        warm_tools = StepRunner.warm_tools

        async def not_ahead(self) -> None:
            if where == "recovery" and CURRENT.get().name == "gen0":
                await warm_tools(self)  # (the first process is not the one examined: it goes as usual)

        monkeypatch.setattr(StepRunner, "warm_tools", not_ahead)
        before_pay = reference.points.index("before append[StepStarted:pay]") + 1
        plan = Plan() if where == "first process" else Plan(at=before_pay)
        outcome = explore(FLOWS["catalog"], db_url, f"warm-{where[0]}", plan)
    # Then the step is reported as timed out (making the clients moved the loops' clock past its timeout)
    step = "fetch" if where == "first process" else "pay"
    problems = check(outcome, reference)
    assert any(f"step {step!r} (tick" in p and "timed out" in p for p in problems), problems
