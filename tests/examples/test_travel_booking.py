"""The travel-booking example runs as documented: declined payment, bookings cancelled newest first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_travel_booking_example_compensates_in_reverse(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples/travel_booking.py"), "--db",
                           f"sqlite:///{tmp_path}/trip.db"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ": compensated" in done.stdout
    assert "cancelled, in order: car-1, hotel-1, flight-1" in done.stdout


def test_agent_loop_example_crashes_and_resumes(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples/agent_loop.py")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "child exited with -9 (SIGKILL)" in done.stdout and "status: completed" in done.stdout
