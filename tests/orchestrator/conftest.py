"""Fixtures of the engine tests: an injected fake clock, and Orchestrators on each backend."""

from __future__ import annotations

import random

import pytest

from orchestrator import Orchestrator
from orchestrator.testing import FakeClock
from workflows import Workflow


@pytest.fixture
def fake_time() -> FakeClock:
    return FakeClock()


@pytest.fixture
def orc_factory(db_url, fake_time):
    """``make(*workflows, **options)``: an Orchestrator on ``db_url`` with the fake clock, closed afterwards."""
    made: list[Orchestrator] = []

    def make(*workflows: Workflow, **options) -> Orchestrator:
        options.setdefault("clock", fake_time.clock)
        options.setdefault("sleep", fake_time.sleep)
        options.setdefault("rng", random.Random(7))
        orc = Orchestrator(db_url, workflows=workflows, **options)
        made.append(orc)
        return orc

    yield make
    for orc in made:
        orc.close()
