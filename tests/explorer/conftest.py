"""The explorer's fixtures, and its closing note: crash points explored per workflow, violations found."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The suite runs with --import-mode=importlib, which leaves sys.path alone: the explorer's helper
# modules (explorer_*.py) are imported by name from this folder.
sys.path.insert(0, str(Path(__file__).parent))

#: (sweep, workflow, backend) -> (points explored, violations found), filled by the sweeps: crash
#: points for "crash", "sigkill" and "in-doubt:RULE", store writes for "fault", pairs of crash points
#: for "double:RULE"
EXPLORED: dict[tuple[str, str, str], tuple[int, int]] = {}


@pytest.fixture(scope="session")
def chat_url():
    """The scripted model of the tool-calling flow (it answers from the conversation, so one serves all)."""
    from explorer_flows import chat_script

    from orchestrator.testing import ChatServer

    with ChatServer(chat_script) as server:
        yield server.url


@pytest.fixture
def explored():
    return EXPLORED


def pytest_terminal_summary(terminalreporter) -> None:
    if not EXPLORED:
        return
    terminalreporter.section("crash-point explorer")
    unit = {"crash": "crash points", "sigkill": "crash points (SIGKILL)", "fault": "store writes",
            "in-doubt": "crash points", "double": "pairs of crash points (the second in the recovery)"}
    for (sweep, flow, backend), (points, violations) in sorted(EXPLORED.items()):
        terminalreporter.write_line(f"{sweep:16} {flow:9} {backend:8} {points:5} "
                                    f"{unit.get(sweep.split(':')[0], 'points')} explored, {violations} violations")
