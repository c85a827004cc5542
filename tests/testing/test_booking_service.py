"""The scripted booking service, over real HTTP on loopback: idempotent bookings, cancellation,
payment failure modes, concurrency, and its ledger (in memory, in a file, from another process)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from orchestrator.testing import BookingService
from orchestrator.testing import booking_service

HANG = 120.0  # seconds: bounds a hang, never a measure of speed


@pytest.fixture
def service(tmp_path):
    svc = BookingService(ledger_path=tmp_path / "ledger.jsonl")
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service.url, timeout=HANG) as client:
        yield client


def actions(ledger, action=None):
    return [(e["action"], e.get("id")) for e in ledger if action is None or e["action"] == action]


def test_a_repeated_idempotency_key_returns_the_original_and_books_once(service, http):
    # Given a flight booked with a key
    first = http.post("/flights", json={"to": "LIS"}, headers={"Idempotency-Key": "run1:flight:0"})
    # When the same request is re-sent with the same key (an in-doubt effect after a crash)
    again = http.post("/flights", json={"to": "LIS"}, headers={"Idempotency-Key": "run1:flight:0"})
    # Then the original response comes back, and the ledger shows one booking and one replay
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() == {"id": "flight-1", "status": "booked", "to": "LIS"}
    assert actions(service.ledger()) == [("book", "flight-1"), ("replay", "flight-1")]


def test_a_new_key_books_again_and_a_reused_key_with_other_parameters_is_422(service, http):
    assert http.post("/hotels", json={"n": 1}, headers={"Idempotency-Key": "a"}).json()["id"] == "hotel-1"
    assert http.post("/hotels", json={"n": 1}, headers={"Idempotency-Key": "b"}).json()["id"] == "hotel-2"
    clash = http.post("/hotels", json={"n": 2}, headers={"Idempotency-Key": "a"})
    assert clash.status_code == 422 and "'a'" in clash.json()["error"]
    assert len(actions(service.ledger(), "book")) == 2


def test_cancel_is_recorded_once_and_repeating_it_is_idempotent(service, http):
    car = http.post("/cars", json={"model": "compact"}).json()["id"]
    first = http.delete(f"/cars/{car}")
    second = http.delete(f"/cars/{car}")
    assert first.status_code == second.status_code == 200
    assert first.json() == {"id": car, "status": "cancelled"}
    assert second.json()["already_cancelled"] is True
    assert actions(service.ledger()) == [("book", car), ("cancel", car), ("cancel_repeat", car)]
    assert http.get(f"/cars/{car}").json()["status"] == "cancelled"


def test_cancelling_an_unknown_booking_is_404(http):
    assert http.delete("/flights/flight-99").status_code == 404
    assert http.delete("/hotels/nope").json()["error"] == "no hotel 'nope'"
    assert http.post("/boats", json={}).status_code == 404


def test_payments_can_be_declined_always(service, http):
    # Given payments configured to be declined
    service.fail_payments(402)
    # Then every payment is a 402, and no charge is booked
    for _ in range(3):
        r = http.post("/payments", json={"amount": 100})
        assert r.status_code == 402 and r.json() == {"error": "card declined"}
    assert actions(service.ledger(), "book") == []
    assert len(actions(service.ledger(), "payment_failed")) == 3


def test_payments_can_fail_with_500_for_n_calls_then_succeed(service, http):
    service.fail_payments(500, times=2)
    key = {"Idempotency-Key": "pay-1"}
    # A 5xx is not remembered for the key, so the retry with the same key really retries
    statuses = [http.post("/payments", json={"amount": 5}, headers=key).status_code for _ in range(3)]
    assert statuses == [500, 500, 201]
    assert actions(service.ledger(), "book") == [("book", "payment-1")]


def test_a_declined_payment_is_remembered_for_its_key(service, http):
    service.fail_payments(402, times=1)
    key = {"Idempotency-Key": "pay-2"}
    assert http.post("/payments", json={"amount": 5}, headers=key).status_code == 402
    # The decline was deterministic: the same key gets the same answer, even though payments now work
    assert http.post("/payments", json={"amount": 5}, headers=key).status_code == 402
    assert http.post("/payments", json={"amount": 5}).status_code == 201


def test_failure_modes_can_be_changed_over_http(service, http):
    assert http.post("/_admin/config", json={"payments": {"status": 402}}).status_code == 200
    assert http.post("/payments", json={}).status_code == 402
    http.post("/_admin/config", json={"payments": None})
    assert http.post("/payments", json={}).status_code == 201


def test_the_ledger_file_matches_the_ledger_endpoint(service, http, tmp_path):
    flight = http.post("/flights", json={"to": "OPO"}, headers={"Idempotency-Key": "k1"}).json()["id"]
    http.delete(f"/flights/{flight}")
    served = http.get("/ledger").json()
    lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert lines == served == service.ledger()
    assert [(e["seq"], e["action"], e["kind"]) for e in lines] == [(1, "book", "flight"), (2, "cancel", "flight")]
    assert lines[0]["idempotency_key"] == "k1" and lines[0]["body"] == {"to": "OPO"}
    assert all(isinstance(e["at"], float) for e in lines)


def test_concurrency_is_measured(monkeypatch):
    # Given a service that holds each response until the test lets go: its delay's sleep is ours, so
    # the requests overlap because the test waited for them to, not because the machine was quick
    release = threading.Event()
    monkeypatch.setattr(booking_service, "time", SimpleNamespace(sleep=lambda _s: release.wait(HANG), time=time.time))
    with BookingService(delay=0.2) as svc:
        def book(i: int) -> None:
            httpx.post(f"{svc.url}/cars", json={"i": i}, timeout=HANG)

        threads = [threading.Thread(target=book, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        # When all four are in flight at once, and then answered
        end = time.monotonic() + HANG
        while svc.stats()["in_flight"] < 4:
            assert time.monotonic() < end, svc.stats()
            time.sleep(0.01)
        release.set()
        for t in threads:
            t.join()
        stats = svc.stats()
    # Then the service measured the overlap, and each was booked once
    assert stats["max_in_flight"] == 4 and stats["in_flight"] == 0
    assert sorted(e["id"] for e in svc.ledger()) == ["car-1", "car-2", "car-3", "car-4"]


@pytest.mark.slow
def test_runs_as_its_own_process_and_a_test_can_count_its_side_effects(tmp_path):
    # Given the service started as a separate process, writing its ledger to a file
    ledger = tmp_path / "ledger.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.testing.booking_service", "--port", "0",
                             "--ledger", str(ledger), "--fail-payments", "402"], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        # When this process books and is declined
        hotel = httpx.post(f"{url}/hotels", json={"nights": 2}, headers={"Idempotency-Key": "h"}).json()["id"]
        httpx.post(f"{url}/hotels", json={"nights": 2}, headers={"Idempotency-Key": "h"})
        assert httpx.post(f"{url}/payments", json={"amount": 9}).status_code == 402
    finally:
        proc.terminate()
        code = proc.wait(timeout=HANG)
        proc.stdout.close()
    assert code == 0
    # Then the file written by the other process shows each side effect once
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(e["action"], e.get("id")) for e in lines] == [("book", hotel), ("replay", hotel), ("payment_failed", None)]
