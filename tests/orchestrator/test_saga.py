"""Sagas on a real store: compensation order and exactly-once, in-doubt effects, rollback, cancel."""

from __future__ import annotations

import random

import pytest

from compensations import CompensationPolicy, Compensations
from orchestrator import Orchestrator, RunStateError
from orchestrator.testing import BookingService
from workflows import END, Retry, Workflow


class World:
    """The outside world: bookings keyed by idempotency key (a repeated key books nothing new)."""

    def __init__(self) -> None:
        self.bookings: dict[str, str] = {}
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.cancel_failures = 0

    def book(self, kind: str, key: str) -> str:
        self.calls.append(f"book {kind}")
        return self.bookings.setdefault(key, f"{kind}-{len(self.bookings) + 1}")

    def cancel(self, ref: str) -> None:
        if self.cancel_failures > 0:
            self.cancel_failures -= 1
            raise ConnectionError(f"cancel {ref}: service unavailable")
        self.cancelled.append(ref)


class Stop(BaseException):
    """Stands for the process dying at this point (propagates through the engine untouched)."""


def trip_workflow(world: World, *, car_compensable: bool = True, stop_in: str | None = None,
                  resend: bool | None = None, check: bool = False) -> Workflow:
    wf = Workflow("trip")

    def undo(kind):
        def compensate(ctx, effect):
            world.cancel(effect.result[kind])
        compensate.__name__ = f"cancel_{kind}"
        return compensate

    def booking(kind: str, compensable: bool = True):
        def book(ctx, state):
            ref = world.book(kind, ctx.idempotency_key)
            if stop_in == kind:
                raise Stop  # dies after the world changed, before the result is journaled
            return {kind: ref}

        def find(ctx, state):
            return {kind: world.bookings[ctx.idempotency_key]} if ctx.idempotency_key in world.bookings else None

        book.__name__ = f"book_{kind}"
        wf.step(name=f"book_{kind}", effect=True, compensate=undo(kind) if compensable else None,
                check=find if check else None, resend=resend)(book)

    booking("flight")
    booking("hotel")
    booking("car", car_compensable)

    @wf.step()
    def pay(ctx, state):
        if state.get("card") == "declined":
            raise PermissionError("card declined")
        return {"paid": True}

    wf.steps["book_flight"].__class__  # steps are frozen data
    object.__setattr__(wf.steps["book_flight"], "start", True)
    wf.edge("book_flight", "book_hotel")
    wf.edge("book_hotel", "book_car")
    wf.edge("book_car", "pay")
    wf.edge("pay", END)
    return wf


@pytest.fixture
def make(db_url):
    made = []

    def factory(*wfs, **kw):
        kw.setdefault("sleep", _no_sleep)
        kw.setdefault("rng", random.Random(1))
        orc = Orchestrator(db_url, workflows=wfs, **kw)
        made.append(orc)
        return orc

    yield factory
    for orc in made:
        orc.close()


async def _no_sleep(seconds: float) -> None:
    return None


def kinds(orc, run_id):
    return [e["kind"] for e in orc.history(run_id)]


def test_failed_payment_compensates_every_booking_newest_first(make):
    # Given three bookings and a payment that is declined
    world = World()
    wf = trip_workflow(world)
    orc = make(wf)
    # When the run fails at pay
    result = orc.run(wf, {"card": "declined"}, run_id="t1")
    # Then car, hotel and flight are cancelled in that order, each once, and the run is compensated
    assert result.status == "compensated"
    assert world.cancelled == ["car-3", "hotel-2", "flight-1"]
    assert orc.get_run("t1").status == "compensated"
    events = kinds(orc, "t1")
    assert events.count("CompensationStarted") == 3 and events.count("CompensationCompleted") == 3
    assert events[-1] == "SagaCompleted"
    started = [e["data"] for e in orc.history("t1") if e["kind"] == "StepStarted"]
    assert [s["key"] for s in started] == ["t1:book_flight:0", "t1:book_hotel:1", "t1:book_car:2"]


@pytest.mark.parametrize("returned, said", [
    ({"refund": object()}, "value of type builtins.object is not JSON-encodable at $.refund"),
    ({"by_id": {1: "a", "1": "b"}}, "the dict at $.by_id mixes string keys with the key 1"),
], ids=["not JSON", "colliding keys"])
def test_a_compensation_whose_result_cannot_be_journaled_is_still_done_once(make, returned, said):
    # Given a booking whose compensation undoes it and returns something the journal cannot hold
    undone: list[str] = []

    def cancel(ctx, effect):
        undone.append(effect.step)
        return returned

    wf = Workflow("odd-undo")

    @wf.step(effect=True, compensate=cancel)
    def book(ctx, state):
        return {"booked": True}

    @wf.step
    def pay(ctx, state):
        raise PermissionError("card declined")

    orc = make(wf)
    # When the payment fails and the booking is compensated
    result = orc.run(wf, {}, run_id="u1")
    # Then the undo is journaled as done, with why its result is missing, and the run is compensated
    # (before, the error escaped and left the run compensating, undone again on every resume)
    assert result.status == "compensated" and undone == ["book"]
    [done] = [e["data"] for e in orc.history("u1") if e["kind"] == "CompensationCompleted"]
    assert "result" not in done and said in done["result_unjournaled"]
    assert "the result of the compensation of step 'book' cannot be journaled" in done["result_unjournaled"]
    # And resuming it undoes nothing again
    assert orc.resume("u1").status == "compensated" and undone == ["book"]


def test_an_effect_without_compensation_fails_the_run_and_is_listed(make):
    world = World()
    wf = trip_workflow(world, car_compensable=False)
    orc = make(wf)
    result = orc.run(wf, {"card": "declined"}, run_id="t2")
    # Then what could be undone was, and the run says what could not
    assert result.status == "failed"
    assert world.cancelled == ["hotel-2", "flight-1"]
    assert "book_car" in result.error and "NOT undone" in result.error


def test_a_compensation_that_keeps_failing_leaves_compensation_failed_then_compensate_finishes(make):
    # Given a cancellation service that fails 3 times, and a policy of 2 attempts
    world = World()
    world.cancel_failures = 3
    registry = Compensations(policy=CompensationPolicy(retry=Retry(attempts=2, initial=0, jitter=0)))
    wf = trip_workflow(world)
    orc = make(wf, compensations=registry)
    # When the saga runs
    result = orc.run(wf, {"card": "declined"}, run_id="t3")
    # Then the run is compensation_failed, with the effect and error visible
    assert result.status == "compensation_failed"
    assert "book_car" in result.error and "service unavailable" in result.error
    failed = [e["data"] for e in orc.history("t3") if e["kind"] == "CompensationFailed"]
    assert [(f["attempt"], f["final"]) for f in failed] == [(1, False), (2, True)]
    # When the operator retries once the service is back
    world.cancel_failures = 0
    again = orc.compensate("t3")
    # Then the remaining ones are compensated, each exactly once
    assert again.status == "compensated"
    assert world.cancelled == ["car-3", "hotel-2", "flight-1"]
    with pytest.raises(RunStateError):
        orc.compensate("t3")


def test_a_retried_compensation_that_succeeds_ends_with_the_failure_that_started_the_saga(make):
    # Given a saga left compensation_failed: the car's cancellation kept failing
    world = World()
    world.cancel_failures = 2
    registry = Compensations(policy=CompensationPolicy(retry=Retry(attempts=2, initial=0, jitter=0)))
    wf = trip_workflow(world)
    orc = make(wf, compensations=registry)
    first = orc.run(wf, {"card": "declined"}, run_id="t3b")
    assert first.error == "ConnectionError: compensating 'book_car': cancel car-3: service unavailable"
    # When the operator retries and the compensations succeed
    again = orc.compensate("t3b")
    # Then the run tells the declined payment, as a saga that succeeded at once does, everywhere it is read
    assert (again.status, again.failed_step, again.error) == ("compensated", "pay", "PermissionError: card declined")
    assert orc.get_run("t3b").error == "PermissionError: card declined"
    assert orc.result("t3b").error == "PermissionError: card declined"
    cause = orc.summary("t3b").failure
    assert (cause["kind"], cause["step"], cause["error"]["message"]) == ("step", "pay", "card declined")
    # (and the failed attempts stay in the journal, where they happened)
    assert [e["kind"] for e in orc.history("t3b")].count("SagaFailed") == 1


def test_a_run_rolled_back_past_its_failure_that_completes_has_no_error(make):
    # Given a trip whose payment was declined and compensated
    world = World()
    wf = trip_workflow(world)
    orc = make(wf)
    assert orc.run(wf, {"card": "declined"}, run_id="t3c").status == "compensated"
    # When it is rolled back to its start with a card that works, and completes
    result = orc.rollback("t3c", to=1, input={"card": "ok"})
    # Then nothing reads as failed; the declined payment is history
    assert (result.status, result.error, result.failed_step) == ("completed", None, None)
    assert orc.get_run("t3c").error is None
    summary = orc.summary("t3c")
    assert summary.failure is None
    assert [(f["step"], f["error"]["message"]) for f in summary.earlier_failures] == [("pay", "card declined")]


@pytest.mark.parametrize("mode", ["check", "resend"])
def test_an_effect_in_doubt_is_checked_or_resent_with_the_same_key_never_duplicated(make, mode):
    # Given a run that died inside book_hotel after the hotel was booked, before the result was journaled
    world = World()
    dying = trip_workflow(world, stop_in="hotel", check=(mode == "check"))
    with pytest.raises(Stop):
        make(dying).run(dying, {"card": "ok"}, run_id="t4")
    # (its intent is journaled, and that its key left the process with the booking)
    assert kinds(make(dying), "t4")[-2:] == ["StepStarted", "KeyIssued"]
    # When it is resumed
    healthy = trip_workflow(world, check=(mode == "check"))
    result = make(healthy).resume("t4")
    # Then there is exactly one hotel booking
    assert result.status == "completed"
    assert sorted(world.bookings.values()) == ["car-3", "flight-1", "hotel-2"]
    hotel_calls = world.calls.count("book hotel")
    assert hotel_calls == (1 if mode == "check" else 2)  # a resend reuses the key: the world dedups it
    completed = [e["data"] for e in make(healthy).history("t4") if e["kind"] == "StepCompleted"]
    hotel = [c for c in completed if c["step"] == "book_hotel"][0]
    assert hotel["key"] == "t4:book_hotel:1"
    assert hotel.get("reconciled") == ("check" if mode == "check" else None)


def test_an_effect_in_doubt_with_resend_false_and_no_check_is_not_sent_again(make):
    world = World()
    dying = trip_workflow(world, stop_in="hotel", resend=False)
    with pytest.raises(Stop):
        make(dying).run(dying, {"card": "ok"}, run_id="t5")
    result = make(trip_workflow(world, resend=False)).resume("t5")
    # Then the run does not guess: the hotel is not booked twice, the flight is compensated
    assert world.calls.count("book hotel") == 1
    assert world.cancelled == ["flight-1"]
    failed = [e["data"] for e in make(dying).history("t5") if e["kind"] == "StepFailed"]
    assert failed[0]["error"]["type"] == "orchestrator.errors.InDoubtError"
    # and it does not claim to be compensated while the hotel booking may stand: it failed, naming it
    assert result.status == "failed"
    assert result.error.startswith("orchestrator.errors.InDoubtError: ")
    assert "book_hotel (key t5:book_hotel:1)" in result.error and "NOT undone" in result.error


def test_rollback_undoes_effects_after_the_checkpoint_and_continues_another_way(make):
    # Given a completed trip
    world = World()
    wf = trip_workflow(world)
    orc = make(wf)
    orc.run(wf, {"card": "ok"}, run_id="t6")
    # When it is rolled back to just before book_hotel, with a note for the new route
    result = orc.rollback("t6", to="book_hotel", input={"note": "cheaper hotel"})
    # Then the car and hotel made after that point were cancelled (newest first), the flight kept
    assert world.cancelled == ["car-3", "hotel-2"]
    # And the run went on from there with fresh keys, and completed
    assert result.status == "completed"
    assert result.state["note"] == "cheaper hotel"
    assert result.state["flight"] == "flight-1" and result.state["hotel"] == "hotel-4"
    history = orc.history("t6")
    assert [e["kind"] for e in history].count("RolledBack") == 1
    keys = [e["data"]["key"] for e in history if e["kind"] == "StepStarted"]
    assert keys[-2:] == ["t6:book_hotel:1:r1", "t6:book_car:2:r1"]


def test_rollback_to_a_point_that_does_not_exist_changes_nothing(make):
    world = World()
    wf = trip_workflow(world)
    orc = make(wf)
    orc.run(wf, {"card": "ok"}, run_id="t7")
    before = orc.store.last_seq("t7")
    with pytest.raises(RunStateError, match="no checkpoint at seq 999"):
        orc.rollback("t7", to=999)
    with pytest.raises(RunStateError, match="no completed step 'ghost'"):
        orc.rollback("t7", to="ghost")
    assert orc.store.last_seq("t7") == before and world.cancelled == []


def test_cancel_with_compensate_undoes_completed_effects(make):
    world = World()
    dying = trip_workflow(world, stop_in="car")
    with pytest.raises(Stop):
        make(dying).run(dying, {"card": "ok"}, run_id="t8")
    orc = make(trip_workflow(world))
    result = orc.cancel("t8", compensate=True)
    assert result.status == "cancelled"
    assert world.cancelled == ["hotel-2", "flight-1"]
    # And the car, in doubt when the process died, is reported rather than silently forgotten
    doubt = orc.history("t8")[-1]["data"]["in_doubt"]
    assert [(d["step"], d["key"]) for d in doubt] == [("book_car", "t8:book_car:2")]
    assert doubt[0]["reason"].startswith("it was in flight when the run ended")
    assert [d["key"] for d in result.in_doubt] == ["t8:book_car:2"]


def test_rollback_with_a_forced_next_step_takes_the_other_route(make):
    # Given a completed trip
    world = World()
    wf = trip_workflow(world)
    orc = make(wf)
    orc.run(wf, {"card": "ok"}, run_id="t9")
    # When it is rolled back to before the hotel and sent straight to the car (no hotel this time)
    result = orc.rollback("t9", to="book_hotel", next_step="book_car")
    # Then the car and the hotel were undone, the flight kept, and the new route skipped the hotel
    assert world.cancelled == ["car-3", "hotel-2"]
    assert result.status == "completed" and "hotel" not in result.state
    assert result.state["car"] == "car-4" and result.state["flight"] == "flight-1"
    steps_after = [e["data"]["step"] for e in orc.history("t9")
                   if e["kind"] == "StepCompleted" and e["seq"] > _rolled_back_seq(orc, "t9")]
    assert steps_after == ["book_car", "pay"]


def _rolled_back_seq(orc, run_id):
    return next(e["seq"] for e in orc.history(run_id) if e["kind"] == "RolledBack")



class CountingService(BookingService):
    """The booking service, counting the DELETE requests it is sent (answered or refused)."""

    def __init__(self) -> None:
        super().__init__()
        self.deletes = 0

    def handle(self, method, path, body, raw, key):
        if method == "DELETE":
            self.deletes += 1
        return super().handle(method, path, body, raw, key)


def test_a_compensation_refused_with_a_4xx_is_not_retried(make):
    # Given a booking made over HTTP whose compensation asks to cancel a booking the service does not
    # know (404), under the default compensation policy (5 attempts)
    with CountingService() as service:
        wf = Workflow("refused-undo")

        def cancel_flight(ctx, effect):
            ctx.http.delete(f"{effect.result['api']}/flights/{effect.result['flight']['id']}-unknown")

        @wf.step(start=True, effect=True, resend=True, compensate=cancel_flight)
        def book_flight(ctx, state):
            return {"flight": ctx.http.post(f"{state['api']}/flights", json={"to": "Oslo"}).json(),
                    "api": state["api"]}

        @wf.step()
        def pay(ctx, state):
            raise PermissionError("card declined")

        wf.edge("book_flight", "pay")
        wf.edge("pay", END)
        orc = make(wf)
        # When the payment fails and the saga runs
        result = orc.run(wf, {"api": service.url}, run_id="refused")
        # Then the 404 fails the compensation at its first attempt: one DELETE was sent, not five
        assert result.status == "compensation_failed"
        assert service.deletes == 1
        failed = [e["data"] for e in orc.history("refused") if e["kind"] == "CompensationFailed"]
        assert [(f["attempt"], f["final"], f["error"]["type"]) for f in failed] == [
            (1, True, "orchestrator.errors.PermanentToolError")]
        saga = [e["data"] for e in orc.history("refused") if e["kind"] == "SagaFailed"]
        assert [s["attempts"] for s in saga] == [1]

