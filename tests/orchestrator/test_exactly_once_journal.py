"""Exactly-once when two ordinary things meet in the journal: each case a regression test, on SQLite and Postgres.

The cases are the ones a review reproduced against the engine (a failed database write and a parallel
sibling, a retry and a failed write, a crash and a final failure, a step and the state it is given, a
crash and a journaled backoff, a snapshot and a journal that lost its end). The crash-point explorer
under ``tests/explorer`` sweeps every crash point; these tests pin each case by name. The effects'
cases are in test_exactly_once_effects.py, the signals' and sagas' in test_exactly_once_signals_sagas.py.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from exactly_once_helpers import Died, fail_append_once, kinds, seqs

from orchestrator.engine import EventKind
from store import StoreUnavailableError
from workflows import END, Retry, Workflow


# -- case 1: a failed journal write ------------------------------------------------------------------
def test_a_failed_write_in_a_parallel_tick_leaves_the_journal_dense_and_the_run_resumable(orc_factory):
    # Given two parallel branches, and the first of their completions failing to commit once
    wf = Workflow("branches")
    gate = threading.Barrier(2, timeout=30)

    @wf.step(start=True)
    def split(ctx, state):
        return {}

    @wf.step()
    def left(ctx, state):
        gate.wait()
        return {"left": 1}

    @wf.step()
    def right(ctx, state):
        gate.wait()
        return {"right": 1}

    @wf.step()
    def done(ctx, state):
        return {"total": state["left"] + state["right"]}

    wf.edge("split", "left")
    wf.edge("split", "right")
    wf.edge(["left", "right"], "done")
    wf.edge("done", END)
    orc = orc_factory(wf)
    fail_append_once(orc, lambda events: any(e.kind == EventKind.STEP_COMPLETED and '"tick":1' in e.data
                                             for e in events))
    # When the run is driven, the write fails
    with pytest.raises(StoreUnavailableError):
        orc.run(wf, {}, run_id="b1")
    # Then the journal has no gap and verifies, and the run resumes to the end
    assert seqs(orc, "b1") == list(range(1, len(seqs(orc, "b1")) + 1))
    assert orc.verify("b1").ok
    result = orc.resume("b1")
    assert result.status == "completed" and result.state["total"] == 2
    assert seqs(orc, "b1") == list(range(1, len(seqs(orc, "b1")) + 1))
    assert orc.verify("b1").ok


def test_a_failed_write_inside_a_step_is_not_retried_as_a_step_failure(orc_factory):
    # Given a retrying step whose durable call's journal write fails once
    wf = Workflow("retry-store")
    performed = []

    @wf.step(start=True, retry=Retry(attempts=3))
    def call(ctx, state):
        return {"r": ctx.durable_call("svc", {"q": 1}, lambda: performed.append(1) or "ok")}

    wf.edge("call", END)
    orc = orc_factory(wf)
    fail_append_once(orc, lambda events: any(e.kind == EventKind.CALL_COMPLETED for e in events))
    # When the run is driven
    with pytest.raises(StoreUnavailableError):
        orc.run(wf, {}, run_id="r1")
    # Then the database error was not journaled as a failed attempt (no retry was spent on it)
    assert EventKind.STEP_FAILED not in kinds(orc, "r1")
    # And the run completes on resume; the call was performed again only because its result never became durable
    assert orc.resume("r1").status == "completed"
    assert orc.verify("r1").ok and len(performed) == 2


# -- case 15: a decision once journaled is never re-made ------------------------------------------------
def test_a_step_that_gave_up_is_not_run_again_after_a_crash_before_the_run_failed(orc_factory):
    # Given a step that fails twice (its Retry allows 2 attempts) and would succeed a third time
    wf = Workflow("gives-up")
    ran = []

    @wf.step(start=True, retry=Retry(attempts=2, initial=0.1))
    def flaky(ctx, state):
        ran.append(ctx.attempt)
        if len(ran) <= 2:
            raise ValueError(f"failure {len(ran)}")
        return {"ok": True}

    wf.edge("flaky", END)
    orc = orc_factory(wf)
    real = orc.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if events and events[-1].kind == EventKind.STEP_FAILED and '"final":true' in events[-1].data:
            raise Died  # the process dies right after journaling the final failure
        return out

    orc.store.append = append
    try:
        orc.run(wf, {}, run_id="g1")
    except Died:
        pass
    # When the run is resumed in a new process
    result = orc_factory(wf).resume("g1")
    # Then the step that gave up is not run again: the run failed, after exactly its two attempts
    assert ran == [1, 2]
    assert result.status == "failed"
    assert kinds(orc, "g1")[-1] == EventKind.RUN_FAILED


# -- case 10: a step cannot change state except through its update ----------------------------------------
def test_mutating_nested_state_in_place_changes_nothing(orc_factory):
    # Given a step that appends to a nested list of its state in place and returns no update
    wf = Workflow("mutator")

    @wf.step(start=True)
    def sneaky(ctx, state):
        state["items"].append("sneaked in")
        state["meta"]["count"] += 1
        return {}

    @wf.step()
    def look(ctx, state):
        return {"seen": list(state["items"]), "count": state["meta"]["count"]}

    wf.edge("sneaky", "look")
    wf.edge("look", END)
    orc = orc_factory(wf, snapshot_every=1)
    result = orc.run(wf, {"items": ["a"], "meta": {"count": 0}}, run_id="m1")
    # Then the next step saw the state as the journal has it, and every snapshot verifies
    assert result.state["seen"] == ["a"] and result.state["count"] == 0
    assert orc.verify("m1").ok


# -- case 13: a journaled backoff is honoured after a crash -----------------------------------------------
def test_a_retry_delay_journaled_before_a_crash_is_waited_out_after_resume(orc_factory, fake_time):
    # Given a step whose first attempt failed with a 30 s backoff, the process dying while it waited
    wf = Workflow("backoff")
    started_at = []

    @wf.step(start=True, retry=Retry(attempts=3, initial=30.0, jitter=False))
    def call(ctx, state):
        started_at.append(fake_time.now)
        if len(started_at) == 1:
            raise ConnectionError("503")
        return {"ok": True}

    wf.edge("call", END)

    async def die_while_sleeping(seconds):
        raise Died

    orc = orc_factory(wf, sleep=die_while_sleeping)
    with pytest.raises(Died):
        orc.run(wf, {}, run_id="k1")
    failed_at = fake_time.now
    # When a new process resumes the run 10 s later
    fake_time.advance(10)
    result = orc_factory(wf).resume("k1")
    # Then the second attempt waited out the remaining 20 s of the journaled delay
    assert result.status == "completed"
    assert started_at[1] >= failed_at + 30.0


# -- case 17: a snapshot past the end of the journal ------------------------------------------------------
def _execute(db_url: str, sql: str, params: tuple) -> None:
    if db_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(db_url.split("sqlite:///", 1)[1]) as conn:
            conn.execute(sql.replace("%s", "?"), params)
    else:
        import psycopg

        base, _, query = db_url.partition("?")
        schema = query.split("search_path%3D", 1)[1]
        with psycopg.connect("postgresql://" + base.split("://", 1)[1], autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(sql, params)


def test_a_snapshot_beyond_the_end_of_the_journal_is_not_trusted(orc_factory, db_url):
    # Given a finished run with snapshots, whose journal lost its last events
    wf = Workflow("short")

    @wf.step(start=True)
    def one(ctx, state):
        return {"n": 1}

    @wf.step()
    def two(ctx, state):
        return {"n": 2}

    wf.edge("one", "two")
    wf.edge("two", END)
    orc = orc_factory(wf, snapshot_every=1)
    orc.run(wf, {}, run_id="s1")
    last = seqs(orc, "s1")[-1]
    _execute(db_url, "DELETE FROM agentsaga_events WHERE seq > %s AND run_pk = "
                     "(SELECT pk FROM agentsaga_runs WHERE run_id = %s)", (last - 2, "s1"))
    # When its state is restored
    folded, snap_seq, rejected = orc.engine.restore("s1", wf)
    # Then no snapshot beyond the journal's end was used, and verify says what is wrong
    assert folded.seq == last - 2 and snap_seq <= last - 2
    assert any(seq > last - 2 for seq, _ in rejected)
    assert not orc.verify("s1").ok
