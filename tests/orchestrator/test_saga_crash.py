"""Saga crash tests: a child process SIGKILLed around effects and compensations, a booking service
in a process of its own keeping the ledger, and a new process resuming the run.

The service's ledger is the judge: no booking is made twice, and every booking that a failed run
made is cancelled exactly once (a repeated cancel is recorded as ``cancel_repeat``, not ``cancel``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target

ROOT = Path(__file__).resolve().parent.parent.parent
CHILD = ROOT / "tests/orchestrator/sagachild.py"

pytestmark = pytest.mark.slow


@pytest.fixture
def service(tmp_path):
    """The booking service as its own process, declining payments with 402."""
    ledger = tmp_path / "ledger.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.testing.booking_service", "--port", "0",
                             "--ledger", str(ledger), "--fail-payments", "402"],
                            stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    yield url, ledger
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)


def entries(ledger: Path) -> list[dict]:
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]


def run_child(db_url: str, run_id: str, api: str, crash: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), db_url, run_id, api, "4242", crash], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("crash", [
    "sent:book_hotel",     # (a) the request reached the service, its response not yet journaled
    "intent:book_hotel",   # (a') the response journaled, the step's completion not yet
    "result:book_hotel",   # (b) right after the result committed
    "undone:book_car",     # (c) in the middle of compensation, after one committed
    "undoing:book_hotel",  # (c') inside a compensation whose request reached the service
])
def test_sigkill_around_effects_neither_duplicates_nor_loses_a_booking(db_url, service, crash):
    api, ledger = service
    # Given a trip whose process is killed at the chosen point
    killed = run_child(db_url, "trip-1", api, crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # When another process resumes it
    with Orchestrator(db_url, workflows=[load_target(str(ROOT / "examples/travel_booking.py") + ":trip")]) as orc:
        result = orc.resume("trip-1")
        history = orc.history("trip-1")
    # Then the declined payment left the run compensated
    assert result.status == "compensated", result.error
    log = entries(ledger)
    booked = Counter(e["kind"] for e in log if e["action"] == "book")
    cancelled = Counter(e["id"] for e in log if e["action"] == "cancel")
    # And the service holds exactly one flight, hotel and car, each cancelled exactly once
    assert booked == Counter({"flight": 1, "hotel": 1, "car": 1})
    assert cancelled == Counter({"flight-1": 1, "hotel-1": 1, "car-1": 1})
    assert [e["id"] for e in log if e["action"] == "cancel"] == ["car-1", "hotel-1", "flight-1"]
    # And every compensation completed once in the journal
    done = Counter(e["data"]["step"] for e in history if e["kind"] == "CompensationCompleted")
    assert done == Counter({"book_flight": 1, "book_hotel": 1, "book_car": 1})
    hotel = [e["action"] for e in log if e.get("kind") == "hotel"]
    if crash == "sent:book_hotel":
        # A re-sent booking carried the same key: the service replayed it instead of booking again
        assert hotel[:2] == ["book", "replay"]
    if crash == "intent:book_hotel":
        # The journaled response was reused: the request was not sent again at all
        assert hotel[:2] == ["book", "cancel"]
