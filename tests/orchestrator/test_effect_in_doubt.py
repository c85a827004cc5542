"""An effect step whose retries run out after its request reached the service is in doubt, visibly.

The booking service charges the payment and then fails to answer (a 500, or the connection closed
with no answer): every attempt re-sends the same key, the service replays the charge it made, and
answers badly again. The run ends failed with an ``InDoubtError`` naming the effect and its key (never
``compensated`` while the charge may stand), and ``show``, ``history``, ``show --json`` and the HTML
report say so. A check hook settles it instead: found, the step completes; not found, it fails as
it is. A payment the service refuses outright (402) is not in doubt. On SQLite and Postgres, with a
real loopback service.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import agentsaga  # noqa: E402

from orchestrator.testing import BookingService  # noqa: E402
from workflows import END, Retry, Workflow  # noqa: E402


def checkout(api: str, *, check: bool = False, flight: bool = False) -> Workflow:
    wf = Workflow("checkout")

    def cancel_flight(ctx, effect):
        ctx.http.delete(f"{api}/flights/{effect.result['flight']}")

    def paid(ctx, state):  # the check hook: is there a payment under this key at the service?
        ledger = httpx.get(f"{api}/ledger").json()
        made = [e for e in ledger if e["action"] == "book" and e.get("idempotency_key") == ctx.idempotency_key]
        return {"payment": made[0]["id"]} if made else None

    if flight:
        @wf.step(start=True, compensate=cancel_flight)
        def book_flight(ctx, state):
            return {"flight": ctx.http.post(f"{api}/flights", json={"to": "Lisbon"}).json()["id"]}

        wf.edge("book_flight", "pay")

    @wf.step(start=not flight, effect=True, check=paid if check else None,
             retry=Retry(attempts=3, initial=0.01, jitter=False))
    def pay(ctx, state):
        return {"payment": ctx.http.post(f"{api}/payments", json={"amount": 30}).json()["id"]}

    @wf.step()
    def confirm(ctx, state):
        return {"confirmed": True}

    wf.edge("pay", "confirm")
    wf.edge("confirm", END)
    return wf


def actions(service: BookingService, kind: str = "payment") -> list[str]:
    return [e["action"] for e in service.ledger() if e.get("kind") == kind]


@pytest.fixture
def service():
    with BookingService() as running:
        yield running


@pytest.mark.parametrize("answer", ["500", "drop"])
def test_a_payment_charged_then_failing_on_every_attempt_ends_the_run_in_doubt_naming_its_key(
        orc_factory, service, answer):
    # Given a service that charges the payment and then answers 500 (or closes the connection unanswered)
    service.fail_after_payment(500, drop=answer == "drop")
    wf = checkout(service.url)
    orc = orc_factory(wf)
    # When the run's payment step runs out of retries
    result = orc.run(wf, {}, run_id="p1")
    # Then the service charged once (the retries re-sent the same key and got the charge replayed)
    assert actions(service) == ["book", "answer_failed", "replay", "answer_failed", "replay", "answer_failed"]
    assert {e["idempotency_key"] for e in service.ledger()} == {"p1:pay:0"}
    # and the run failed, saying that this effect with this key may have taken effect
    assert result.status == "failed"
    assert result.error.startswith("orchestrator.errors.InDoubtError: run failed at step 'pay' "
                                   "(orchestrator.errors.RetryableToolError: POST ")
    assert "may have taken effect and were NOT undone (in doubt): pay (key p1:pay:0)" in result.error
    final = [e["data"] for e in orc.history("p1") if e["kind"] == "StepFailed"][-1]
    assert final["final"] is True and final["doubt"]["key"] == "p1:pay:0"
    run_failed = orc.history("p1")[-1]
    assert run_failed["kind"] == "RunFailed" and [d["key"] for d in run_failed["data"]["in_doubt"]] == ["p1:pay:0"]
    summary = orc.summary("p1")
    assert [(e["step"], e["key"], e["status"]) for e in summary.effects] == [("pay", "p1:pay:0", "in doubt")]
    assert summary.failure["in_doubt"][0]["key"] == "p1:pay:0"


def test_show_history_json_and_the_report_say_which_effect_is_in_doubt(orc_factory, service, db_url, tmp_path):
    # Given a run whose payment was charged and then failed on every attempt
    service.fail_after_payment(500)
    wf = checkout(service.url)
    orc_factory(wf).run(wf, {}, run_id="p2")
    # When it is shown, its history listed, shown as JSON and reported as HTML
    show = agentsaga("show", "p2", db=db_url)
    history = agentsaga("history", "p2", db=db_url)
    as_json = agentsaga("show", "p2", "--json", db=db_url)
    report = agentsaga("report", "p2", "--html", str(tmp_path / "p2.html"), db=db_url)
    for done in (show, history, as_json, report):
        assert done.returncode == 0, done.stderr
    # Then each names the effect, its key and that it may have taken effect
    assert "in doubt: effect pay with key p2:pay:0 may have taken effect" in show.stdout
    effects = show.stdout.split("EFFECTS AND COMPENSATIONS", 1)[1].splitlines()[2]
    assert effects.split()[1:4] == ["pay", "p2:pay:0", "in"], effects
    assert "pay (tick 0, attempt 3) failed; IN DOUBT (key p2:pay:0); gave up" in history.stdout
    assert '    doubt: {"key":"p2:pay:0","reason":"its idempotency key had left the process' in history.stdout
    doc = json.loads(as_json.stdout)
    assert [(e["key"], e["status"]) for e in doc["effects"]] == [("p2:pay:0", "in doubt")]
    assert doc["failure"]["in_doubt"][0]["key"] == "p2:pay:0"
    html = (tmp_path / "p2.html").read_text()
    assert 'class="badge st-in-doubt">in doubt</span>' in html and "p2:pay:0" in html


def test_with_other_effects_undone_the_run_still_does_not_claim_to_be_compensated(orc_factory, service):
    # Given a flight booked, then a payment charged and failing on every attempt
    service.fail_after_payment(500)
    wf = checkout(service.url, flight=True)
    # When the run fails
    result = orc_factory(wf).run(wf, {}, run_id="p3")
    # Then the flight was cancelled, and the run failed naming the payment that may stand
    assert actions(service, "flight") == ["book", "cancel"]
    assert result.status == "failed"
    assert "its other effects were compensated" in result.error and "pay (key p3:pay:1)" in result.error


def test_a_check_hook_finds_the_charge_and_the_step_completes_with_it(orc_factory, service):
    # Given a payment step with a check hook, and a service that charges and then fails to answer
    service.fail_after_payment(500)
    wf = checkout(service.url, check=True)
    orc = orc_factory(wf)
    # When its retries run out
    result = orc.run(wf, {}, run_id="p4")
    # Then the hook found the charge: the step completed with it (once), and the run went on
    assert result.status == "completed", result.error
    assert result.state["payment"] == "payment-1" and result.state["confirmed"] is True
    assert actions(service).count("book") == 1
    done = [e["data"] for e in orc.history("p4") if e["kind"] == "StepCompleted" and e["data"]["step"] == "pay"]
    assert [d.get("reconciled") for d in done] == ["check"]


def test_a_check_hook_that_finds_nothing_leaves_the_failure_as_it_is(orc_factory, service):
    # Given a payment step with a check hook, and a service that fails before charging anything
    service.fail_payments(500)
    wf = checkout(service.url, check=True, flight=True)
    orc = orc_factory(wf)
    # When its retries run out
    result = orc.run(wf, {}, run_id="p5")
    # Then nothing is in doubt: the step failed with its own error, the flight was compensated
    assert "book" not in actions(service)
    assert result.status == "compensated", result.error
    assert result.error.startswith("orchestrator.errors.RetryableToolError")
    final = [e["data"] for e in orc.history("p5") if e["kind"] == "StepFailed"][-1]
    assert final["checked"] == "not done" and "doubt" not in final


def test_a_payment_the_service_refuses_outright_is_not_in_doubt(orc_factory, service):
    # Given a service that declines the card (402) after the key was sent
    service.fail_payments(402)
    wf = checkout(service.url, flight=True)
    orc = orc_factory(wf)
    # When the run fails at the payment
    result = orc.run(wf, {}, run_id="p6")
    # Then it is compensated as before: a refusal says the payment was not made
    assert result.status == "compensated", result.error
    assert "InDoubtError" not in (result.error or "")
    final: dict[str, Any] = [e["data"] for e in orc.history("p6") if e["kind"] == "StepFailed"][-1]
    assert "doubt" not in final


def test_a_replayed_effect_step_whose_request_changed_is_a_mismatch_not_an_effect_in_doubt(db_url):
    # Given a recording of an effect step's charge, and code that now charges another amount
    from orchestrator import Orchestrator
    from orchestrator.agents import Cassette

    cassette = Cassette([{"step": "pay", "visit": 0, "index": 0, "kind": "charge", "request": {"amount": 35},
                          "response": {"id": "payment-1"}}])
    wf = Workflow("replayed-charge")

    @wf.step(start=True, effect=True)
    def pay(ctx, state):
        ctx.idempotency_key  # noqa: B018 (read to be sent, as a client of its own would)
        return {"paid": ctx.durable_call("charge", {"amount": 40}, lambda: {"id": "never"})}

    wf.edge("pay", END)
    # When the run is replayed
    with Orchestrator(db_url, workflows=[wf], replay=cassette) as orc:
        result = orc.run(wf, {}, run_id="rp")
    # Then it fails with the mismatch, and nothing is said to stand at a service: nothing was sent
    assert result.status == "failed"
    assert result.error.startswith("orchestrator.errors.ReplayMismatchError"), result.error
    assert not result.in_doubt and "in doubt" not in result.error


def test_a_check_hook_looks_the_effect_up_with_ctx_http_without_sending_the_key(orc_factory, service):
    # Given a booking whose process died after the service made it, and a check hook that looks its key
    # up in the service's ledger through ctx.http
    from exactly_once_helpers import Died

    seen_headers: list = []
    wf = Workflow("look-up")

    def booked(ctx, state):
        reply = ctx.http.get(f"{service.url}/ledger")
        seen_headers.append(reply.request.headers.get("Idempotency-Key"))
        made = [e for e in reply.json() if e["action"] == "book" and e.get("idempotency_key") == ctx.idempotency_key]
        return {"hotel": made[0]["id"]} if made else None

    @wf.step(start=True, effect=True, check=booked)
    def book(ctx, state):
        ctx.http.post(f"{service.url}/hotels", json={"room": "A"})
        raise Died

    wf.edge("book", END)
    with pytest.raises(Died):
        orc_factory(wf).run(wf, {}, run_id="h1")
    # When the run is resumed in a new process
    orc = orc_factory(wf)
    result = orc.resume("h1")
    # Then the hook found the booking through ctx.http (its look-up sent no idempotency key), the step
    # completed with it, and the hotel was booked once
    assert result.status == "completed", result.error
    assert result.state["hotel"] == "hotel-1"
    assert seen_headers == [None]
    assert [e["action"] for e in service.ledger()] == ["book"]
    [done] = [e["data"] for e in orc.history("h1") if e["kind"] == "StepCompleted"]
    assert done["reconciled"] == "check"
