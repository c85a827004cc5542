"""orchestrator.testing's public surface is pinned: a removed or renamed test double fails here."""

from __future__ import annotations

import subprocess
import sys

import orchestrator.testing

EXPECTED = ["BookingService", "ChatServer", "FakeClock", "Reply", "error", "reply", "tool_call", "tool_calls"]


def test_exported_names():
    assert sorted(orchestrator.testing.__all__) == sorted(EXPECTED)
    for name in orchestrator.testing.__all__:
        assert hasattr(orchestrator.testing, name), name


def test_star_import_gives_exactly_the_public_names():
    namespace: dict = {}
    exec("from orchestrator.testing import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(EXPECTED)


def test_the_booking_service_runs_as_a_module_without_warnings():
    # When the service is started the way tests start it, and stopped at once
    proc = subprocess.Popen([sys.executable, "-W", "error", "-m", "orchestrator.testing.booking_service",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    # Then it printed its URL first, and exited cleanly with nothing on stderr
    assert url.startswith("http://127.0.0.1:"), err
    assert proc.returncode == 0 and err == ""
