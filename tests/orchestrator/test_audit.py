"""The audit library API on a real store (SQLite and Postgres): summary, verify, fork and gc."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import AUDITFLOW, CRASHFLOW, load, raw_sql, snapshot_text, tamper_snapshot  # noqa: E402

from orchestrator import Orchestrator, RunNotFoundError, RunStateError  # noqa: E402
from store import NewEvent, NewSnapshot  # noqa: E402
from workflows import END, Workflow, reducers  # noqa: E402
from workflows.reducers import MISSING  # noqa: E402

DAY = 86400.0
# The state crashflow's run has just before its last `merge` (round 2 of 3): merge folds in
# frontier order, so left's update comes before right's whatever order they finished in.
BEFORE_LAST_MERGE = {
    "round": 2, "total": 33,
    "log": ["begin0", "left", "right", "merge11", "begin1", "left", "right", "merge22", "begin2", "left", "right"],
}


async def _no_sleep(seconds: float) -> None:
    return None


@pytest.fixture
def crash_wf(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASHFLOW_LEDGER", str(tmp_path / "ledger"))
    return load(CRASHFLOW)


@pytest.fixture
def audit_wf():
    return load(AUDITFLOW)


# -- summary ---------------------------------------------------------------------------------------
def test_summary_points_at_the_failure_and_pairs_effects_with_compensations(db_url, audit_wf):
    # Given a run whose search fails twice, books an effect, then fails for good at confirm
    with Orchestrator(db_url, workflows=[audit_wf], sleep=_no_sleep) as orc:
        result = orc.run(audit_wf, {"flaky": 2, "decline": True}, run_id="s1")
        # When it is summarised
        s = orc.summary("s1")
    # Then the saga undid the booking and the run ended compensated
    assert result.status == "compensated" and s.status == "compensated"
    assert [x.step for x in s.executions] == ["plan", "search", "book", "confirm"]
    search, book, confirm = s.executions[1], s.executions[2], s.executions[3]
    assert (search.outcome, search.attempts, len(search.failures)) == ("completed", 3, 2)
    assert s.retries == 2
    assert search.failures[0]["error"]["type"] == "ConnectionError"
    # And the effect is paired with its compensation
    [effect] = s.effects
    assert effect["step"] == "book" and effect["status"] == "compensated" and effect["key"] == book.key
    assert effect["undone_seq"] > confirm.seq
    # And the failure section points at confirm's execution and its error
    assert s.failure is not None
    assert (s.failure["kind"], s.failure["step"], s.failure["execution"]) == ("step", "confirm", confirm.index)
    assert s.failure["error"]["type"] == "PermissionError"
    assert confirm.outcome == "failed" and "Traceback" in confirm.error["traceback"]


# -- verify ----------------------------------------------------------------------------------------
def _run_with_snapshots(db_url: str, wf, run_id: str = "v1") -> list[int]:
    # Full snapshots: these tests edit the state a snapshot holds (test_checkpoint_chains.py edits links)
    with Orchestrator(db_url, workflows=[wf], snapshot_every=2, keep_snapshots=20, incremental_snapshots=None) as orc:
        assert orc.run(wf, {"round": 0}, run_id=run_id).status == "completed"
        return sorted(s.seq for s in orc.store.snapshots(run_id))


def test_verify_passes_on_an_untouched_run(db_url, crash_wf):
    seqs = _run_with_snapshots(db_url, crash_wf)
    assert len(seqs) >= 5
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        report = orc.verify("v1")
    assert report.ok, report.lines()
    assert (report.events, report.snapshots, report.snapshots_verified) == (15, len(seqs), len(seqs))


def test_verify_names_a_snapshot_whose_hash_does_not_match(db_url, crash_wf):
    # Given a snapshot changed in the database after it was written (its hash left alone)
    seqs = _run_with_snapshots(db_url, crash_wf)
    target = seqs[2]
    tamper_snapshot(db_url, "v1", target, lambda s: s["state"].update(total=999), rehash=False)
    # When the run is verified
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        report = orc.verify("v1")
    # Then exactly that snapshot fails, for its hash and for what differs from the journal
    assert not report.ok
    assert {p.seq for p in report.problems} == {target}
    messages = [p.message for p in report.problems]
    assert any("sha256 mismatch" in m for m in messages), messages
    differs = next(p for p in report.problems if "differs" in p.message)
    assert [d for d in differs.differences if d.startswith("state.total: snapshot has 999")], differs.differences
    assert report.snapshots_verified == len(seqs) - 1


def test_verify_catches_a_rehashed_snapshot_that_disagrees_with_the_journal(db_url, crash_wf):
    # Given a snapshot rewritten with a wrong state AND a matching sha256 (the hash now verifies)
    seqs = _run_with_snapshots(db_url, crash_wf)
    target = seqs[1]
    tamper_snapshot(db_url, "v1", target, lambda s: (s["state"]["log"].append("forged"), s.update(tick=77)),
                    rehash=True)
    # When the run is verified
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        report = orc.verify("v1")
        # (recovery alone would trust it: its hash checks out)
        assert not [p for p in report.problems if "sha256" in p.message]
    # Then the comparison with the fold names the seq and each difference
    [problem] = report.problems
    assert (problem.subject, problem.seq) == ("snapshot", target)
    assert f"differs from the fold of the journal at seq {target}" in problem.message
    assert any(d.startswith("tick: snapshot has 77") for d in problem.differences), problem.differences
    assert any(d.startswith("state.log: snapshot has") for d in problem.differences), problem.differences


def test_verify_names_an_event_that_does_not_fold(db_url, crash_wf):
    # Given an event whose data was damaged (a completion that names no step)
    _run_with_snapshots(db_url, crash_wf)
    raw_sql(db_url, "UPDATE agentsaga_events SET data = ? WHERE seq = 6 AND run_pk = "
                    "(SELECT pk FROM agentsaga_runs WHERE run_id = ?)", ('{"tick": 3}', "v1"))
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        report = orc.verify("v1")
    # Then the journal problem names seq 6, and later snapshots are said to be unchecked
    assert [(p.subject, p.seq) for p in report.problems] == [("journal", 6)]
    assert "StepCompleted does not fold" in report.problems[0].message
    assert any("were not compared" in n for n in report.notes)


def test_a_damaged_event_is_still_shown_and_verify_reports_it(db_url, crash_wf):
    # Given an event whose text is no longer JSON
    _run_with_snapshots(db_url, crash_wf)
    raw_sql(db_url, "UPDATE agentsaga_events SET data = ? WHERE seq = 3 AND run_pk = "
                    "(SELECT pk FROM agentsaga_runs WHERE run_id = ?)", ("{not json", "v1"))
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        # Then history and show still read the run, saying where the fold stopped
        assert orc.history("v1")[2]["data"] == {"undecodable": "{not json"}
        assert any("fold stopped at seq 3" in n for n in orc.summary("v1").notes)
        # And verify names the event
        [problem] = orc.verify("v1").problems
    assert (problem.subject, problem.seq) == ("journal", 3) and "does not decode" in problem.message


def test_verify_without_the_workflow_still_checks_the_scheduler_fields(db_url):
    # Given a run of a workflow that is not registered where it is verified
    wf = Workflow("local")
    wf.step(start=True, name="one")(lambda ctx, s: {"n": 1})
    wf.step(name="two")(lambda ctx, s: {"n": 2})
    wf.edge("one", "two")
    wf.edge("two", END)
    with Orchestrator(db_url, workflows=[wf], snapshot_every=1, keep_snapshots=10, incremental_snapshots=None) as orc:
        orc.run(wf, {}, run_id="l1")
        seq = max(s.seq for s in orc.store.snapshots("l1"))
    # When another process, without the workflow, verifies it after a re-hashed tamper
    tamper_snapshot(db_url, "l1", seq, lambda s: s.update(visits={"one": 5, "two": 1}), rehash=True)
    with Orchestrator(db_url) as orc:
        report = orc.verify("l1")
    # Then the scheduler field is caught
    assert [p.seq for p in report.problems] == [seq]
    assert any(d.startswith("visits.one: snapshot has 5") for d in report.problems[0].differences)


def test_verify_without_the_workflow_compares_state_its_recorded_reducers_can_fold(db_url):
    # Given a run whose fields use a built-in reducer (log) and the workflow's own (best)
    def keep_max(current, update):
        return update if current is MISSING else max(current, update)

    wf = Workflow("reduced", reducers={"log": reducers.append, "best": keep_max})
    wf.step(start=True, name="one")(lambda ctx, s: {"log": "a", "best": 3, "n": 1})
    wf.step(name="two")(lambda ctx, s: {"log": "b", "best": 2, "n": 2})
    wf.edge("one", "two")
    wf.edge("two", END)
    with Orchestrator(db_url, workflows=[wf], snapshot_every=1, keep_snapshots=10, incremental_snapshots=None) as orc:
        orc.run(wf, {}, run_id="r1")
        seq = max(s.seq for s in orc.store.snapshots("r1"))
    # When a process without the workflow verifies it after a re-hashed tamper of the appended list
    tamper_snapshot(db_url, "r1", seq, lambda s: s["state"].update(log=["a", "forged"]), rehash=True)
    with Orchestrator(db_url) as orc:
        report = orc.verify("r1")
    # Then the built-in reducer's field is compared and the forgery is caught
    assert [p.seq for p in report.problems] == [seq]
    assert any(d.startswith("state.log[1]: snapshot has \"forged\"") for d in report.problems[0].differences)
    # And the field with the workflow's own reducer is named as not compared
    assert any("state fields best were not compared" in n for n in report.notes)


def test_verify_unknown_run(db_url):
    with Orchestrator(db_url) as orc, pytest.raises(RunNotFoundError, match="nope"):
        orc.verify("nope")


# -- fork ------------------------------------------------------------------------------------------
def test_fork_starts_from_the_state_before_the_step_and_completes(db_url, crash_wf):
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        parent = orc.run(crash_wf, {"round": 0}, run_id="p1")
        # When the run is forked at its (latest) merge
        child = orc.fork("p1", from_step="merge", run_id="c1")
        first = orc.history(child)[0]
        # Then the fork is a new pending run, linked to its parent
        rec = orc.get_run("c1")
        assert (child, rec.status, rec.parent_run_id) == ("c1", "pending", "p1")
        assert first["kind"] == "RunStarted" and first["data"]["start"] == ["merge"]
        # And its first state is the parent's state just before that merge
        assert first["data"]["input"] == BEFORE_LAST_MERGE
        parent_seq = first["data"]["parent"]["seq"]
        assert first["data"]["parent"] == {"run_id": "p1", "seq": parent_seq, "step": "merge"}
        assert orc.history("p1", after=parent_seq)[0]["data"]["step"] in ("merge", "left", "right")
        # And driven by resume, it ends where the parent ended, having run only merge and finish
        done = orc.resume("c1")
        assert done.status == "completed" and done.state == parent.state
        assert [x.step for x in orc.summary("c1").executions] == ["merge", "finish"]
        # And the parent is untouched (history is never rewritten)
        assert orc.get_run("p1").status == "completed" and len(orc.history("p1")) == parent.seq


def test_fork_at_a_failed_step_reruns_it_with_the_fixed_code(db_url):
    # Given a run that failed at `charge` because of a bug
    bug = {"on": True}
    wf = Workflow("billing")

    @wf.step(start=True)
    def quote(ctx, state):
        return {"amount": state["items"] * 10}

    @wf.step()
    def charge(ctx, state):
        if bug["on"]:
            raise ZeroDivisionError("the bug")
        return {"charged": state["amount"]}

    wf.edge("quote", "charge")
    wf.edge("charge", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {"items": 3}, run_id="b1").status == "failed"
        # When the code is fixed and the run forked at the step that failed
        bug["on"] = False
        fork = orc.fork("b1", from_step="charge")
        # Then the fork starts with the state charge saw, and completes
        assert orc.history(fork)[0]["data"]["input"] == {"items": 3, "amount": 30}
        result = orc.resume(fork)
    assert result.status == "completed" and result.state == {"items": 3, "amount": 30, "charged": 30}


def test_fork_refuses_unknown_steps_and_runs(db_url, crash_wf):
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        orc.run(crash_wf, {"round": 0}, run_id="p1")
        with pytest.raises(RunStateError, match=r"never ran step 'nope'; it ran: begin, finish, left, merge, right"):
            orc.fork("p1", from_step="nope")
        with pytest.raises(RunNotFoundError):
            orc.fork("nope", from_step="merge")
        assert [r.run_id for r in orc.list_runs()] == ["p1"]  # nothing half-made


# -- gc --------------------------------------------------------------------------------------------
class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _store_run(orc: Orchestrator, run_id: str, status: str, at: float, *, snapshots: int = 0) -> None:
    """A run in any status straight through the store (compensation_failed, waiting, ...)."""
    store = orc.store
    token = store.create_run(run_id=run_id, workflow="other", version="1", fingerprint="f", target="",
                             created_at=at, status=status, lease_owner="w", lease_ttl=10,
                             events=[NewEvent(1, "RunStarted", '{"start":[]}', at)])
    for i in range(snapshots):
        store.append(run_id, [NewEvent(2 + i, "Resumed", "{}", at)], token=token, now=at,
                     snapshot=NewSnapshot(2 + i, "{}", "x", "periodic", at))


def test_gc_deletes_only_old_finished_runs_and_prunes_only_finished_ones(db_url, crash_wf):
    now = 1_800_000_000.0
    clock = Clock(now - 40 * DAY)
    with Orchestrator(db_url, workflows=[crash_wf], clock=clock, snapshot_every=2, keep_snapshots=20,
                      incremental_snapshots=None) as orc:
        # Given runs that ended 40 days ago, and one that ended today
        orc.run(crash_wf, {"round": 0}, run_id="old-done")
        orc.start(crash_wf, {"round": 0}, run_id="old-pending")
        for run_id, status in [("old-failed", "failed"), ("old-comp-failed", "compensation_failed"),
                               ("old-running", "running"), ("old-waiting", "waiting"),
                               ("old-compensating", "compensating")]:
            _store_run(orc, run_id, status, clock.now, snapshots=3)
        clock.now = now
        orc.run(crash_wf, {"round": 0}, run_id="new-done")
        before = {r.run_id: len(orc.store.snapshots(r.run_id)) for r in orc.list_runs(limit=None)}
        # When a dry run asks what gc would do with 30 days and 1 snapshot kept
        plan = orc.gc(older_than=30 * DAY, keep_snapshots=1, dry_run=True)
        # Then it lists it and changes nothing
        assert sorted(d["run_id"] for d in plan.deleted) == ["old-done", "old-failed"]
        assert [p["run_id"] for p in plan.pruned] == ["new-done"]
        assert {r.run_id: len(orc.store.snapshots(r.run_id)) for r in orc.list_runs(limit=None)} == before
        # When gc runs for real
        done = orc.gc(older_than=30 * DAY, keep_snapshots=1)
        # Then the old finished runs are gone, whole
        assert done.to_json()["runs_deleted"] == 2 and done.deleted == plan.deleted
        for run_id in ("old-done", "old-failed"):
            with pytest.raises(RunNotFoundError):
                orc.get_run(run_id)
        # And every unfinished (or compensation_failed) run is untouched, snapshots included
        for run_id in ("old-pending", "old-comp-failed", "old-running", "old-waiting", "old-compensating"):
            assert len(orc.store.snapshots(run_id)) == before[run_id]
        assert done.untouched == {"pending": 1, "compensation_failed": 1, "running": 1, "waiting": 1,
                                  "compensating": 1}
        # And the recent run keeps its newest snapshot only, and still verifies and reads back
        assert [s.seq for s in orc.store.snapshots("new-done")] == [15]
        assert orc.verify("new-done").ok
        assert orc.result("new-done").state["round"] == 3


def test_gc_spares_a_run_resumed_between_its_listing_and_the_delete(db_url, crash_wf):
    clock = Clock(1_000_000.0)
    with Orchestrator(db_url, workflows=[crash_wf], clock=clock) as orc:
        # Given a run that finished two days ago
        orc.run(crash_wf, {"round": 0}, run_id="old")
        clock.now += 2 * DAY
        # When it is resumed (rolled back, say) after gc listed it but before gc deletes it
        real_delete = orc.store.delete_runs

        def delete_after_a_rollback(run_ids, **kw):
            raw_sql(db_url, "UPDATE agentsaga_runs SET status = 'running' WHERE run_id = 'old'")
            return real_delete(run_ids, **kw)

        orc.store.delete_runs = delete_after_a_rollback  # type: ignore[method-assign]
        report = orc.gc(older_than=DAY)
        # Then gc does not delete it, and says so
        assert report.deleted == () and report.spared == 1
        assert orc.get_run("old").status == "running"


def test_gc_needs_something_to_do(db_url):
    from orchestrator import ConfigurationError

    with Orchestrator(db_url) as orc:
        with pytest.raises(ConfigurationError, match="nothing to do"):
            orc.gc()
        with pytest.raises(ConfigurationError, match="keep_snapshots"):
            orc.gc(keep_snapshots=-1)


def test_snapshot_text_helper_reads_what_the_engine_wrote(db_url, crash_wf):
    # (guards the tamper helper the verify tests rely on)
    seqs = _run_with_snapshots(db_url, crash_wf)
    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        assert snapshot_text(db_url, "v1", seqs[0]) == orc.store.snapshot("v1", seqs[0]).state


def test_verify_on_a_database_that_refuses_writes_still_gives_its_verdict(db_url, crash_wf, monkeypatch):
    # Given a verified run, and a store whose catalog write is refused (a read-only file or role)
    _run_with_snapshots(db_url, crash_wf)
    from store import StoreError

    with Orchestrator(db_url, workflows=[crash_wf]) as orc:
        def refuse(*args, **kwargs):
            raise StoreError("mark_snapshot failed: attempt to write a readonly database")

        monkeypatch.setattr(orc.store, "mark_snapshot", refuse)
        # When it is verified with marking on, after a snapshot's catalog entry says otherwise
        raw_sql(db_url, "UPDATE agentsaga_snapshots SET validity = 'failed' WHERE run_pk = "
                        "(SELECT pk FROM agentsaga_runs WHERE run_id = ?)", ("v1",))
        report = orc.verify("v1")
        # Then the verdict stands, and the report says the catalog was not updated and why
        assert report.ok and report.recorded is False
        assert any("not recorded in the checkpoint catalog" in n and "readonly" in n for n in report.notes)
        assert report.to_json()["recorded"] is False
        # And without marking nothing is written or claimed
        assert orc.verify("v1", mark=False).recorded is None
