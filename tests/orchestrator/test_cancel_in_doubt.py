"""A cancel that meets an effect in flight says so: the effect is in doubt, never silently dropped.

The payment step's request has left (its ``StepStarted`` and ``KeyIssued`` are journaled) and no
outcome is: its process was killed after the service charged, or a live owner is still waiting for
the answer when the cancel fences it. A cancel neither re-sends the payment nor claims it was undone:
it records it at run level (``SagaCompleted`` / ``RunCancelled`` with ``in_doubt``, even when no other
effect completed), ``show`` / ``show --json`` / the HTML report list it, and ``agentsaga cancel``
names it on stderr and exits 1. On SQLite and Postgres, with a real loopback service whose ledger
counts what happened.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import ROOT, agentsaga  # noqa: E402
from cancelflow import checkout, checkout_answered, trip, trip_refused  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.testing import BookingService  # noqa: E402

APP = "tests/orchestrator/cancelflow.py"


def payments(service: BookingService) -> list[tuple[str, str | None]]:
    return [(e["action"], e.get("idempotency_key")) for e in service.ledger() if e.get("kind") == "payment"]


def after(orc: Orchestrator, run_id: str, kind: str) -> list[dict[str, Any]]:
    """The events from the first ``kind`` on: what the cancel journaled."""
    events = orc.history(run_id)
    first = next(i for i, e in enumerate(events) if e["kind"] == kind)
    return events[first:]


def cancel(run_id: str, db_url: str, *, compensate: bool = True):
    return agentsaga("cancel", run_id, *(["--compensate"] if compensate else []), "--app", APP, db=db_url)


class HoldingService(BookingService):
    """Holds each payment request until the test releases it, saying when one arrived and when it
    was handled (charged, with the answer on its way)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.handled = threading.Event()

    def handle(self, method: str, path: str, body: Any, raw: bytes, key: str | None) -> tuple[int, Any]:
        if method != "POST" or path.strip("/") != "payments":
            return super().handle(method, path, body, raw, key)
        self.arrived.set()
        assert self.release.wait(60), "the test never released the payment"
        try:
            return super().handle(method, path, body, raw, key)
        finally:
            self.handled.set()


@pytest.fixture
def service():
    with HoldingService() as running:
        yield running
        running.release.set()


DRIVER = """
import sys
sys.path.insert(0, "tests/orchestrator")
from cancelflow import checkout, trip, trip_refused
from orchestrator import Orchestrator
db, name, api, run_id = sys.argv[1:]
flows = {"checkout": checkout, "trip": trip, "trip_refused": trip_refused}
Orchestrator(db, workflows=list(flows.values())).run(flows[name], {"api": api}, run_id=run_id)
"""


def crashed_in_payment(db_url: str, wf: str, service: HoldingService, run_id: str) -> None:
    """The run's process is killed while its payment request is at the service; then the service charges."""
    process = subprocess.Popen([sys.executable, "-c", DRIVER, db_url, wf, service.url, run_id], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert service.arrived.wait(60), process.communicate(timeout=60)
    finally:
        process.kill()  # SIGKILL: nothing more is journaled
        process.communicate(timeout=60)
    service.release.set()
    assert service.handled.wait(60)  # the held request is charged, its answer going to nobody
    assert payments(service) == [("book", f"{run_id}:pay:{0 if wf == 'checkout' else 1}")]


@pytest.mark.parametrize("compensate", [True, False], ids=["compensate", "plain"])
def test_cancelling_a_run_whose_only_effect_is_in_flight_records_it_in_doubt(
        orc_factory, service, db_url, compensate):
    # Given a run whose only effect, the payment, was charged by the service and then its process died
    orc = orc_factory(checkout, trip)
    crashed_in_payment(db_url, "checkout", service, "c1")
    assert [e["kind"] for e in orc.history("c1")][-2:] == ["StepStarted", "KeyIssued"]
    # When it is cancelled from the command line
    done = cancel("c1", db_url, compensate=compensate)
    # Then the command says which effect may stand, with its key, and exits 1
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[0].startswith("agentsaga: run 'c1' ended cancelled")
    assert ("these effects may have taken effect and were NOT undone (in doubt): pay (key c1:pay:0); look each "
            "one up at its service (by its key, unless its reason says the key was not sent)") in done.stderr
    # and the journal records it at run level: by the cancel's saga (which had nothing to undo), or by RunCancelled
    ended = after(orc, "c1", "SagaStarted" if compensate else "RunCancelled")
    assert [e["kind"] for e in ended] == (["SagaStarted", "SagaCompleted"] if compensate else ["RunCancelled"])
    assert ended[-1]["data"].get("outcome", "cancelled") == "cancelled"
    doubt = ended[-1]["data"]["in_doubt"]
    assert [(d["step"], d["key"]) for d in doubt] == [("pay", "c1:pay:0")]
    assert "its idempotency key had left the process" in doubt[0]["reason"]
    # and the payment was neither sent again nor refunded: the service charged once, and it stands
    assert payments(service) == [("book", "c1:pay:0")]
    assert orc.result("c1").status == "cancelled"
    assert [d["key"] for d in orc.result("c1").in_doubt] == ["c1:pay:0"]


def test_cancel_as_json_lists_the_effect_in_doubt(orc_factory, service, db_url):
    # Given a run that died with its payment in flight
    orc = orc_factory(checkout, trip)
    crashed_in_payment(db_url, "checkout", service, "c2")
    # When it is cancelled with compensation, asking for JSON
    done = agentsaga("cancel", "c2", "--compensate", "--json", "--app", APP, db=db_url)
    # Then the result names the effect in doubt, and the exit code says something may stand
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "cancelled"
    assert [(d["step"], d["key"]) for d in result["in_doubt"]] == [("pay", "c2:pay:0")]


def test_show_json_and_the_report_list_an_effect_a_cancel_left_in_doubt(orc_factory, service, db_url, tmp_path):
    # Given a run whose only effect was in flight when its process died, cancelled with compensation
    orc = orc_factory(checkout, trip)
    crashed_in_payment(db_url, "checkout", service, "c3")
    assert cancel("c3", db_url).returncode == 1
    # When it is shown, shown as JSON and reported as HTML
    show = agentsaga("show", "c3", db=db_url)
    as_json = agentsaga("show", "c3", "--json", db=db_url)
    history = agentsaga("history", "c3", db=db_url)
    report = agentsaga("report", "c3", "--html", str(tmp_path / "c3.html"), db=db_url)
    for read in (show, as_json, history, report):
        assert read.returncode == 0, read.stderr
    # Then each says the payment, with its key, may have taken effect
    assert "in doubt: effect pay with key c3:pay:0 may have taken effect (it was in flight" in show.stdout
    assert "effects 1" in show.stdout
    effects = show.stdout.split("EFFECTS AND COMPENSATIONS", 1)[1].splitlines()[2]
    assert effects.split()[1:4] == ["pay", "c3:pay:0", "in"], effects
    assert "SagaCompleted  IN DOUBT: pay (key c3:pay:0); run cancelled" in history.stdout
    doc = json.loads(as_json.stdout)
    assert [(e["step"], e["key"], e["status"]) for e in doc["effects"]] == [("pay", "c3:pay:0", "in doubt")]
    assert doc["failure"]["kind"] == "cancelled"
    assert [d["key"] for d in doc["failure"]["in_doubt"]] == ["c3:pay:0"]
    html = (tmp_path / "c3.html").read_text()
    assert 'class="badge st-in-doubt">in doubt</span> may have taken effect, not undone' in html
    assert "c3:pay:0" in html


def test_a_completed_effect_is_undone_and_the_one_in_flight_is_shown_in_doubt(orc_factory, service, db_url, tmp_path):
    # Given a trip whose flight was booked, and whose payment was in flight when its process died
    orc = orc_factory(checkout, trip)
    crashed_in_payment(db_url, "trip", service, "t1")
    # When it is cancelled with compensation
    done = cancel("t1", db_url)
    # Then the flight was cancelled at the service, and the payment stands, neither re-sent nor refunded
    assert [(e["action"], e.get("id")) for e in service.ledger() if e.get("kind") == "flight"] == [
        ("book", "flight-1"), ("cancel", "flight-1")]
    assert payments(service) == [("book", "t1:pay:1")]
    # and the saga journaled the undo, then its end listing the payment in doubt; the command exits 1
    assert done.returncode == 1, done.stderr
    assert "(in doubt): pay (key t1:pay:1)" in done.stderr
    kinds = [(e["kind"], e["data"].get("step")) for e in after(orc, "t1", "SagaStarted")]
    assert kinds == [("SagaStarted", None), ("CompensationStarted", "book_flight"),
                     ("CompensationCompleted", "book_flight"), ("SagaCompleted", None)]
    assert [d["key"] for d in orc.history("t1")[-1]["data"]["in_doubt"]] == ["t1:pay:1"]
    # and show says so, in text, JSON and the report
    show = agentsaga("show", "t1", db=db_url)
    assert "in doubt: effect pay with key t1:pay:1 may have taken effect" in show.stdout
    assert "effects 2" in show.stdout
    doc = json.loads(agentsaga("show", "t1", "--json", db=db_url).stdout)
    assert [(e["step"], e["status"]) for e in doc["effects"]] == [("book_flight", "compensated"), ("pay", "in doubt")]
    assert agentsaga("report", "t1", "--html", str(tmp_path / "t1.html"), db=db_url).returncode == 0
    assert "t1:pay:1" in (tmp_path / "t1.html").read_text()


def test_cancelling_a_live_run_fences_its_owner_and_leaves_the_payment_in_flight_in_doubt(db_url):
    # Given a run driven by a live process, whose payment request the service holds
    with HoldingService() as service:
        orc = Orchestrator(db_url, workflows=[checkout, trip])
        outcome: dict[str, Any] = {}

        def drive() -> None:
            try:
                outcome["result"] = orc.run(checkout, {"api": service.url}, run_id="l1")
            except BaseException as exc:  # noqa: BLE001 - the fenced owner's end is part of what is checked
                outcome["raised"] = exc

        driver = threading.Thread(target=drive, name="live-owner")
        driver.start()
        try:
            assert service.arrived.wait(60), "the payment request never reached the service"
            # When it is cancelled with compensation while the request is at the service
            done = cancel("l1", db_url)
        finally:
            service.release.set()  # the service charges now: the payment stands
            driver.join(60)
            orc.close()
        assert not driver.is_alive()
        # Then the cancel names the payment in doubt and exits 1
        assert done.returncode == 1, done.stderr
        assert "(in doubt): pay (key l1:pay:0)" in done.stderr
        # and the service charged once, after the cancel; nothing re-sent it, nothing refunded it
        assert payments(service) == [("book", "l1:pay:0")]
    # and the fenced owner wrote nothing after the cancel: the run ends with the saga listing the payment
    with Orchestrator(db_url, workflows=[checkout, trip]) as reader:
        events = reader.history("l1")
        assert [e["kind"] for e in events][-2:] == ["SagaStarted", "SagaCompleted"]
        assert [d["key"] for d in events[-1]["data"]["in_doubt"]] == ["l1:pay:0"]
        assert reader.result("l1").status == "cancelled"
    assert "result" not in outcome or outcome["result"].status != "completed"


def test_a_cancel_whose_compensation_fails_still_lists_the_effect_in_flight(orc_factory, service, db_url, tmp_path):
    # Given a trip whose flight was booked, whose payment was in flight when its process died, and
    # whose flight the airline will not cancel
    orc = orc_factory(checkout, trip, trip_refused)
    crashed_in_payment(db_url, "trip_refused", service, "t9")
    # When it is cancelled with compensation, and the flight's compensation fails for good
    done = cancel("t9", db_url)
    # Then the run is compensation_failed, and the payment in flight is still named: on stderr, on the
    # saga's end, in show (text and JSON) and in the report
    assert done.returncode == 1, done.stderr
    assert "ended compensation_failed" in done.stderr and "(in doubt): pay (key t9:pay:1)" in done.stderr
    assert payments(service) == [("book", "t9:pay:1")]
    end = orc.history("t9")[-1]
    assert end["kind"] == "SagaFailed" and [d["key"] for d in end["data"]["in_doubt"]] == ["t9:pay:1"]
    show = agentsaga("show", "t9", db=db_url)
    assert "in doubt: effect pay with key t9:pay:1 may have taken effect" in show.stdout, show.stdout
    doc = json.loads(agentsaga("show", "t9", "--json", db=db_url).stdout)
    assert ("pay", "in doubt") in [(e["step"], e["status"]) for e in doc["effects"]]
    assert agentsaga("report", "t9", "--html", str(tmp_path / "t9.html"), db=db_url).returncode == 0
    assert "t9:pay:1" in (tmp_path / "t9.html").read_text()
    # And Python says it too
    result = orc.result("t9")
    assert [d["key"] for d in result.in_doubt] == ["t9:pay:1"] and "t9:pay:1" in result.failure_line()


ANSWERED_DRIVER = """
import sys
sys.path.insert(0, "tests/orchestrator")
from cancelflow import checkout_answered
from orchestrator import Orchestrator
db, api, answered, run_id = sys.argv[1:]
Orchestrator(db, workflows=[checkout_answered]).run(checkout_answered, {"api": api, "answered": answered}, run_id=run_id)
"""


def test_an_effect_whose_answer_was_journaled_is_said_to_be_answered_not_unheard_of(db_url, tmp_path):
    # Given a run killed after its payment was charged and the answer journaled, before the step completed
    answered = tmp_path / "answered"
    with BookingService() as service:
        process = subprocess.Popen([sys.executable, "-c", ANSWERED_DRIVER, db_url, service.url, str(answered), "a1"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            while not answered.exists():  # the step writes it once the answer is journaled
                assert process.poll() is None, process.communicate(timeout=60)
                threading.Event().wait(0.02)
        finally:
            process.kill()  # SIGKILL
            process.communicate(timeout=60)
        with Orchestrator(db_url, workflows=[checkout_answered]) as orc:
            # When it is cancelled with compensation
            result = orc.cancel("a1", compensate=True)
    # Then the payment is in doubt (no result to refund it with), and the reason says its answer is journaled
    assert [d["key"] for d in result.in_doubt] == ["a1:pay:0"]
    reason = result.in_doubt[0]["reason"]
    assert "its request was answered (the answer is journaled: CallCompleted, call 0 of the step)" in reason
    assert "no outcome was journaled" not in reason
    assert [e["action"] for e in service.ledger() if e.get("kind") == "payment"] == ["book"]
