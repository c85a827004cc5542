"""Fixtures for the agent tests: a scripted OpenAI-compatible chat server on loopback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import API_KEY  # noqa: E402

from orchestrator.testing import ChatServer  # noqa: E402


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    """A started chat server requiring ``API_KEY``; script it with ``chat.script([...])``."""
    server = ChatServer(api_key=API_KEY)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sleeps() -> list[float]:
    """An injected sleep's record: retries wait by appending here instead of sleeping."""
    return []
