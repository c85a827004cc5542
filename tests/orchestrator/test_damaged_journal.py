"""A journal changed outside agentsaga: resuming the run is a clear error naming the event, and the
run is left as it was (its lease given back, nothing appended). On SQLite and Postgres."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import raw_sql  # noqa: E402

from orchestrator import JournalDamagedError, Orchestrator  # noqa: E402
from workflows import Workflow  # noqa: E402


def waiting_flow() -> Workflow:
    wf = Workflow("damaged")

    @wf.step
    def first(ctx, state):
        return {"first": 1}

    @wf.step
    def second(ctx, state):
        return {"go": ctx.wait_for("go")}

    return wf


@pytest.mark.parametrize("column, value, expected", [
    ("data", "{not json", r"at seq 2 \(StepCompleted\): JSONDecodeError"),
    ("kind", "EvilKind", r"at seq 2 \(EvilKind\): ValueError: unknown event kind 'EvilKind'"),
    ("data", '{"tick": 0}', r"at seq 2 \(StepCompleted\): a field is missing"),
    ("data", '{"step":"first","tick":0,"attempt":1,"update":{"when":{"$datetime":"garbage"}},"next":["second"]}',
     r"at seq 2 \(StepCompleted\): ValueError: Invalid isoformat string"),
])
def test_resuming_a_run_whose_journal_was_damaged_names_the_event_and_changes_nothing(db_url, column, value, expected):
    # Given a run parked on a signal, one of whose events was then changed in the database
    wf = waiting_flow()
    with Orchestrator(db_url, workflows=[wf], snapshot_every=1000) as orc:
        assert orc.run(wf, {}, run_id="d1").status == "waiting"
        orc.signal("d1", "go", True)
    raw_sql(db_url, f"UPDATE agentsaga_events SET {column} = ? WHERE seq = 2 AND run_pk = "
                    "(SELECT pk FROM agentsaga_runs WHERE run_id = ?)", (value, "d1"))
    with Orchestrator(db_url, workflows=[wf]) as orc:
        before = orc.get_run("d1")
        events = len(orc.history("d1"))
        # When it is resumed
        with pytest.raises(JournalDamagedError, match=expected) as raised:
            orc.resume("d1")
        # Then the error names the run and the event and says how to look further
        assert (raised.value.run_id, raised.value.seq) == ("d1", 2)
        assert "agentsaga verify d1" in str(raised.value)
        # And the run is as it was: still waiting, unleased, nothing appended
        after = orc.get_run("d1")
        assert (after.status, after.lease_owner, after.wake_at) == (before.status, None, before.wake_at)
        assert len(orc.history("d1")) == events
