"""Names the database stores as they are (run ids, signal and queue names, dedup keys, the lease
owner, a workflow's name and version) and the run's error: the same answer on SQLite and Postgres.

Postgres cannot store a NUL in a text column and no database stores a lone surrogate as UTF-8:
such a name used to work on SQLite and fail on Postgres with the driver's words, and a step whose
exception message held a NUL left its run ``running`` on Postgres.
"""

from __future__ import annotations

import pytest

from orchestrator import ConfigurationError, Orchestrator, RunStateError
from workflows import DefinitionError, Workflow

BAD = {"NUL": "a\x00b", "newline": "a\nb", "lone surrogate": "a\ud800b", "too long": "x" * 201, "empty": ""}


def _waiting() -> Workflow:
    wf = Workflow("names")

    @wf.step
    def wait(ctx, state):
        return {"got": ctx.wait_for("go")}

    return wf


@pytest.mark.parametrize("bad", list(BAD.values()), ids=list(BAD))
def test_a_run_id_the_database_cannot_hold_is_refused_before_anything_is_written(orc_factory, bad):
    # Given an Orchestrator on either backend
    wf = _waiting()
    orc = orc_factory(wf)
    # When a run is started or enqueued with such an id / Then it is refused in the same words on both
    with pytest.raises(ConfigurationError, match="run_id must be a"):
        orc.run(wf, {}, run_id=bad)
    with pytest.raises(ConfigurationError, match="run_id must be a"):
        orc.enqueue(wf, {}, run_id=bad)
    # And nothing was written
    assert orc.list_runs() == []


@pytest.mark.parametrize("bad", ["go\x00", "go\ud800", "g" * 201], ids=["NUL", "lone surrogate", "too long"])
def test_a_signal_name_the_database_cannot_hold_is_refused_and_the_run_still_waits(orc_factory, bad):
    # Given a run waiting for a signal
    wf = _waiting()
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="r1").status == "waiting"
    # When a signal with such a name is sent / Then it is refused naming the name, nothing is queued
    with pytest.raises(ValueError, match="a signal's name must be a"):
        orc.signal("r1", bad, {"ok": True})
    assert orc.get_run("r1").status == "waiting"
    orc.signal("r1", "go", {"ok": True})
    assert orc.resume("r1").state == {"got": {"ok": True}}


def test_queue_names_dedup_keys_and_owners_the_database_cannot_hold_are_refused(orc_factory, db_url):
    wf = _waiting()
    orc = orc_factory(wf)
    with pytest.raises(ConfigurationError, match="a queue name must be .* control characters"):
        orc.enqueue(wf, {}, queue="q\x00")
    with pytest.raises(ConfigurationError, match=r"dedup_key must be a string without control characters .*'\\x00'"):
        orc.enqueue(wf, {}, dedup_key="d\x00")
    with pytest.raises(ConfigurationError, match="owner must be a string without control characters"):
        Orchestrator(db_url, workflows=[wf], owner="worker\x00")
    assert orc.list_runs() == []


def test_a_workflow_name_or_version_the_database_cannot_hold_is_a_definition_error():
    with pytest.raises(DefinitionError, match="workflow name must be a non-empty string without control characters"):
        Workflow("flow\x00")
    with pytest.raises(DefinitionError, match="version must be a non-empty string without control characters"):
        Workflow("flow", version="1\x00")


def test_an_exception_message_holding_a_nul_fails_the_step_and_ends_the_run(orc_factory):
    # Given a step raising an exception whose message holds a NUL (binary data in the message)
    ledger: list[str] = []
    wf = Workflow("nul_error")

    @wf.step
    def parse(ctx, state):
        ledger.append("parse")
        raise ValueError("cannot parse b'\x00\x01' at offset 0: bad\x00header")

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then on both backends the run failed, the NUL written as its escape, and resuming runs nothing
    assert result.status == "failed" and orc.get_run("r1").status == "failed"
    assert "bad\\x00header" in result.error and orc.get_run("r1").error == result.error
    assert orc.resume("r1").status == "failed" and ledger == ["parse"]
