"""While runs are driven, the cyclic collector's youngest generation is collected in larger batches
(``Orchestrator(gc_young=...)``, engine/collector.py); the thresholds found before are put back when
the last drive of the process ends, and ``gc_young=None`` leaves the collector alone."""

from __future__ import annotations

import asyncio
import gc

import pytest

from orchestrator import ConfigurationError, Orchestrator
from workflows import END, Workflow


@pytest.fixture(autouse=True)
def thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def seeing(seen: list, *, gate: asyncio.Event | None = None, change_to: tuple | None = None) -> Workflow:
    wf = Workflow("sees-the-collector")

    @wf.step(start=True)
    async def look(ctx, state):
        seen.append((ctx.run_id, gc.get_threshold()))
        if change_to is not None:
            gc.set_threshold(*change_to)
        if gate is not None:
            await gate.wait()
        return {"looked": True}

    wf.edge("look", END)
    return wf


def test_a_drive_raises_the_young_threshold_and_puts_it_back(db_url):
    seen: list = []
    wf = seeing(seen)
    # Given the interpreter's thresholds and an Orchestrator with its default
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When a run is driven
        result = orc.run(wf, {}, run_id="one")
    # Then its step ran with the young generation raised, and afterwards the thresholds are as before
    assert result.status == "completed"
    assert seen == [("one", (10_000, 10, 10))]
    assert gc.get_threshold() == (700, 10, 10)


def test_overlapping_drives_keep_it_raised_until_the_last_ends(db_url):
    seen: list = []
    gate = asyncio.Event()
    wf = seeing(seen, gate=gate)

    async def both(orc):
        first = asyncio.ensure_future(orc.arun(wf, {}, run_id="first"))
        while not seen:
            await asyncio.sleep(0)
        second = asyncio.ensure_future(orc.arun(wf, {}, run_id="second"))
        while len(seen) < 2:
            await asyncio.sleep(0)
        gate.set()
        await first
        await second

    # Given two runs driven at once in one loop
    with Orchestrator(db_url, workflows=[wf], gc_young=5_000) as orc:
        asyncio.run(both(orc))
    # Then both saw the raised threshold, and it was put back once, after both
    assert seen == [("first", (5_000, 10, 10)), ("second", (5_000, 10, 10))]
    assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_the_program_sets_during_a_drive_are_left_as_it_set_them(db_url):
    seen: list = []
    wf = seeing(seen, change_to=(2_000, 20, 20))
    # Given a step that sets the collector's thresholds itself
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="own")
    # Then the drive's end does not undo what the program chose
    assert gc.get_threshold() == (2_000, 20, 20)


def test_a_higher_threshold_already_set_is_kept_and_none_leaves_the_collector_alone(db_url):
    seen: list = []
    wf = seeing(seen)
    gc.set_threshold(50_000, 10, 10)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="higher")
    gc.set_threshold(700, 10, 10)
    with Orchestrator(db_url, workflows=[wf], gc_young=None) as orc:
        orc.run(wf, {}, run_id="alone")
    assert seen == [("higher", (50_000, 10, 10)), ("alone", (700, 10, 10))]
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10000"])
def test_a_gc_young_that_is_not_a_positive_integer_is_refused_naming_it(bad):
    with pytest.raises(ConfigurationError, match="gc_young must be an integer >= 1 or None"):
        Orchestrator("sqlite:///:memory:", gc_young=bad)
