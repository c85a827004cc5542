"""The engine on a real store (SQLite and Postgres): journal contents, retries, failures, resume."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from orchestrator import EncodingError, FencedError, GraphChangedError, Orchestrator, RunNotFoundError, RunStateError
from workflows import END, Retry, Workflow, reducers


def kinds(history):
    return [e["kind"] for e in history]


def counter_workflow(limit: int = 5) -> Workflow:
    wf = Workflow("counter", reducers={"seen": reducers.append})

    @wf.step(start=True)
    def tick(ctx, state):
        ctx.trace("counting", at=state["n"])
        return {"n": state["n"] + 1, "seen": state["n"]}

    wf.route("tick", lambda s: "tick" if s["n"] < limit else END)
    return wf


def test_run_journals_each_step_once_with_trace_and_routing(orc_factory):
    # Given a loop of five steps
    wf = counter_workflow(5)
    orc = orc_factory(wf)
    # When it runs
    result = orc.run(wf, {"n": 0}, run_id="c1")
    # Then it completes with the folded state
    assert result.status == "completed"
    assert result.state == {"n": 5, "seen": [0, 1, 2, 3, 4]}
    # And the journal holds one completion per step, its trace and its routing decision
    history = orc.history("c1")
    assert kinds(history) == ["RunStarted"] + ["StepCompleted"] * 5 + ["RunCompleted"]
    completions = [e["data"] for e in history if e["kind"] == "StepCompleted"]
    assert [c["next"] for c in completions] == [["tick"]] * 4 + [[]]
    assert completions[0]["trace"][0]["msg"] == "counting"
    assert completions[2]["input"] == {"state_at": 3}
    # And the run row says completed, with no lease held
    rec = orc.get_run("c1")
    assert rec.status == "completed" and rec.lease_owner is None and rec.finished_at is not None


def test_journal_bytes_do_not_grow_with_the_state(orc_factory):
    # Given a state carrying a large field that steps never change
    wf = counter_workflow(30)
    orc = orc_factory(wf)
    orc.run(wf, {"n": 0, "document": "x" * 50_000}, run_id="big")
    # Then no step event copies the state: completion payloads stay small and equal in shape
    rows = orc.store.events("big")
    sizes = [len(r.data) for r in rows if r.kind == "StepCompleted"]
    assert max(sizes) < 400
    assert max(sizes) - min(sizes) < 40


def test_parallel_branches_merge_in_frontier_order_and_join(orc_factory):
    wf = Workflow("fan", reducers={"log": reducers.append})

    @wf.step(start=True)
    def split(ctx, state):
        return {"log": "split"}

    @wf.step()
    async def slow(ctx, state):
        await asyncio.sleep(0.01)  # finishes last
        return {"log": "slow", "winner": "slow"}

    @wf.step()
    def fast(ctx, state):
        return {"log": "fast", "winner": "fast"}

    @wf.step()
    def joined(ctx, state):
        return {"log": f"joined after {len(state['log'])}"}

    wf.edge("split", "slow")
    wf.edge("split", "fast")
    wf.edge(["slow", "fast"], "joined")
    wf.edge("joined", END)
    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="fan1")
    # Then both branches saw the same input and their updates merged slow-then-fast (frontier order)
    assert result.state["log"] == ["split", "slow", "fast", "joined after 3"]
    assert result.state["winner"] == "fast"
    ticks = [(e["data"]["step"], e["data"]["tick"]) for e in orc.history("fan1") if e["kind"] == "StepCompleted"]
    assert sorted(ticks) == sorted([("split", 0), ("slow", 1), ("fast", 1), ("joined", 2)])


def test_retries_are_journaled_with_backoff_from_the_policy(orc_factory, fake_time):
    # Given a step that fails twice, with a 3-attempt policy and no jitter
    wf = Workflow("flaky")
    calls = []

    @wf.step(start=True, retry=Retry(attempts=3, initial=1.0, multiplier=3.0, jitter=0.0))
    def call_api(ctx, state):
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"refused #{ctx.attempt}")
        return {"ok": True}

    wf.edge("call_api", END)
    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="f1")
    # Then it succeeded on the third attempt after sleeping 1 s and 3 s (injected sleep)
    assert result.status == "completed" and calls == [1, 2, 3]
    assert fake_time.slept == [1.0, 3.0]
    failed = [e["data"] for e in orc.history("f1") if e["kind"] == "StepFailed"]
    assert [(f["attempt"], f["retry_in"], f["final"]) for f in failed] == [(1, 1.0, False), (2, 3.0, False)]
    assert failed[0]["error"]["type"] == "ConnectionError" and "refused #1" in failed[0]["error"]["message"]


def test_give_up_on_is_not_retried_and_fails_the_run(orc_factory):
    wf = Workflow("strict")

    @wf.step(start=True, retry=Retry(attempts=5, give_up_on=(PermissionError,)))
    def call(ctx, state):
        raise PermissionError("401 from provider")

    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="s1")
    assert result.status == "failed"
    assert "PermissionError: 401 from provider" in result.error
    assert kinds(orc.history("s1")) == ["RunStarted", "StepFailed", "RunFailed"]


def test_failure_route_takes_over_when_retries_are_exhausted(orc_factory):
    wf = Workflow("fallback")

    @wf.step(start=True, retry=Retry(attempts=2, initial=0.1, jitter=0), on_failure="use_cache")
    def fetch(ctx, state):
        raise TimeoutError("provider timed out")

    @wf.step()
    def use_cache(ctx, state):
        return {"source": "cache", "because": ctx.failure["message"]}

    wf.edge("fetch", END)
    wf.edge("use_cache", END)
    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="fb")
    assert result.status == "completed"
    assert result.state == {"source": "cache", "because": "provider timed out"}


def test_unencodable_output_fails_the_run_naming_step_and_type(orc_factory):
    wf = Workflow("bad-output")

    @wf.step(start=True)
    def good(ctx, state):
        return {"a": 1}

    @wf.step()
    def bad(ctx, state):
        return {"conn": object()}

    wf.edge("good", "bad")
    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="b1")
    # Then the run failed with the step and the type named, and the earlier events are intact
    assert result.status == "failed"
    assert "step 'bad'" in result.error and "builtins.object" in result.error and "$.conn" in result.error
    history = orc.history("b1")
    assert kinds(history) == ["RunStarted", "StepCompleted", "StepFailed", "RunFailed"]
    assert history[1]["data"]["update"] == {"a": 1}
    assert history[2]["data"]["error"]["type"] == "orchestrator.errors.EncodingError"


def test_unencodable_input_is_refused_before_anything_is_written(orc_factory):
    wf = counter_workflow()
    orc = orc_factory(wf)
    with pytest.raises(EncodingError, match="input of workflow 'counter'"):
        orc.run(wf, {"n": 0, "socket": object()}, run_id="never")
    with pytest.raises(RunNotFoundError):
        orc.get_run("never")


def test_loop_bound_fails_the_run(orc_factory):
    wf = Workflow("forever", max_visits=3)

    @wf.step(start=True)
    def again(ctx, state):
        return {}

    wf.route("again", lambda s: "again")
    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="l1")
    assert result.status == "failed" and "more than 3 times" in result.error


def test_step_timeout_is_a_retryable_failure(orc_factory):
    wf = Workflow("slow")

    @wf.step(start=True, timeout=0.05, retry=Retry(attempts=2, initial=0, jitter=0))
    async def hang(ctx, state):
        if ctx.attempt == 1:
            await asyncio.Event().wait()
        return {"attempt": ctx.attempt}

    wf.edge("hang", END)
    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="t1")
    assert result.status == "completed" and result.state == {"attempt": 2}
    failed = [e["data"] for e in orc.history("t1") if e["kind"] == "StepFailed"]
    assert failed[0]["error"]["type"] == "orchestrator.errors.StepTimeoutError"


class Research(BaseModel):
    question: str
    notes: list[str] = []
    done: bool = False


def test_typed_state_is_validated_and_returned_as_the_model(orc_factory):
    wf = Workflow("typed", state=Research, reducers={"notes": reducers.append})

    @wf.step(start=True)
    def note(ctx, state: Research):
        return {"notes": f"about {state.question}"}

    @wf.step()
    def corrupt(ctx, state):
        return {"done": "not a bool at all"}

    wf.route("note", lambda s: "corrupt" if s.question == "corrupt" else END)
    orc = orc_factory(wf)
    result = orc.run(wf, {"question": "durability"}, run_id="ty1")
    assert isinstance(result.state, Research) and result.state.notes == ["about durability"]
    bad = orc.run(wf, {"question": "corrupt"}, run_id="ty2")
    assert bad.status == "failed" and "step 'corrupt' produced an invalid state" in bad.error


def test_resume_of_a_finished_run_returns_its_result_and_writes_nothing(orc_factory):
    wf = counter_workflow(2)
    orc = orc_factory(wf)
    orc.run(wf, {"n": 0}, run_id="done")
    before = orc.store.last_seq("done")
    again = orc.resume("done")
    assert again.status == "completed" and again.state["n"] == 2
    assert orc.store.last_seq("done") == before


def test_run_with_an_existing_id_continues_it_instead_of_starting_twice(orc_factory):
    wf = counter_workflow(2)
    orc = orc_factory(wf)
    orc.run(wf, {"n": 0}, run_id="once")
    second = orc.run(wf, {"n": 100}, run_id="once")
    assert second.state["n"] == 2
    assert kinds(orc.history("once")).count("RunStarted") == 1


def test_resume_of_an_unknown_run_is_a_clear_error(orc_factory):
    orc = orc_factory(counter_workflow())
    with pytest.raises(RunNotFoundError, match="no-such-run"):
        orc.resume("no-such-run")


def interrupted(orc: Orchestrator, wf: Workflow, run_id: str, stop_at: int) -> None:
    """Drive a run until step ``stop_at`` raises KeyboardInterrupt: the run stays running, leased."""
    original = wf.steps["tick"].fn

    def stopper(ctx, state):
        if state["n"] == stop_at:
            raise KeyboardInterrupt
        return original(ctx, state)

    object.__setattr__(wf.steps["tick"], "fn", stopper)
    try:
        with pytest.raises(KeyboardInterrupt):
            orc.run(wf, {"n": 0}, run_id=run_id)
    finally:
        object.__setattr__(wf.steps["tick"], "fn", original)


def test_resume_after_the_graph_changed_names_the_difference(orc_factory, db_url):
    # Given a run interrupted under version 1
    wf = counter_workflow(5)
    orc = orc_factory(wf)
    interrupted(orc, wf, "g1", stop_at=2)
    # When the code now has an extra step and resumes it
    changed = counter_workflow(5)
    changed.step(name="audit")(lambda ctx, s: None)
    changed.edge("tick", "audit")
    orc2 = orc_factory(changed)
    with pytest.raises(GraphChangedError) as info:
        orc2.resume("g1")
    # Then the error names what changed and nothing was written
    assert "step 'audit' added" in str(info.value) and "allow_graph_change" in str(info.value)
    assert orc2.get_run("g1").status == "running"
    # And with the opt-in it continues
    result = orc2.resume("g1", allow_graph_change=True)
    assert result.status == "completed"


def test_recover_takes_only_runs_whose_lease_expired(orc_factory, fake_time):
    # Given a run interrupted while holding a 30 s lease
    wf = counter_workflow(5)
    orc = orc_factory(wf, lease_ttl=30)
    interrupted(orc, wf, "lease1", stop_at=3)
    orc.engine.heartbeat.stop()
    # When another process recovers before the lease expires, it takes nothing
    other = orc_factory(wf, lease_ttl=30)
    fake_time.now += 29
    assert other.recover() == []
    # And after it expires, it resumes the run to the end
    fake_time.now += 2
    [result] = other.recover()
    assert result.run_id == "lease1" and result.status == "completed" and result.state["n"] == 5
    resumed = [e["data"] for e in other.history("lease1") if e["kind"] == "Resumed"]
    assert resumed[0]["owner"] == other.owner


def test_explicit_resume_fences_out_the_previous_owner(orc_factory):
    # Given a run whose step, while running, sees another process take the lease over
    wf = Workflow("fenced")
    thief = {}

    @wf.step(start=True)
    def first(ctx, state):
        store = thief["orc"].store
        store.leases.acquire(ctx.run_id, owner="thief", ttl=30, now=thief["orc"].engine.config.clock(), force=True)
        return {"stolen": True}

    wf.edge("first", END)
    orc = orc_factory(wf)
    thief["orc"] = orc_factory(wf)
    # When the first owner tries to journal the step's completion
    with pytest.raises(FencedError):
        orc.run(wf, {}, run_id="fx")
    # Then its append was refused: the journal holds only the start
    assert kinds(orc.history("fx")) == ["RunStarted"]


def test_a_corrupt_snapshot_is_skipped_and_the_result_is_the_same(orc_factory, db_url):
    # Given an interrupted run with snapshots every 2 events, the newest one tampered with
    wf = counter_workflow(9)
    orc = orc_factory(wf, snapshot_every=2)
    interrupted(orc, wf, "snap", stop_at=6)
    newest = orc.store.snapshots("snap")[0]
    _tamper(db_url, newest.seq)
    # When it is resumed
    result = orc_factory(wf).resume("snap")
    # Then the result equals an uninterrupted run's, and the journal says why the snapshot was skipped
    assert result.state == {"n": 9, "seen": list(range(9))}
    rejected = [e["data"] for e in orc.history("snap") if e["kind"] == "SnapshotRejected"]
    assert rejected and rejected[0]["seq"] == newest.seq and "sha256" in rejected[0]["reason"]


def _tamper(db_url: str, seq: int) -> None:
    from sqlalchemy import create_engine, text

    url = db_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE agentsaga_snapshots SET state = replace(state, '\"n\":', '\"n\": ') "
                          "WHERE seq = :seq"), {"seq": seq})
    engine.dispose()


def test_cancel_fences_the_run_and_a_finished_run_cannot_be_cancelled(orc_factory):
    wf = counter_workflow(3)
    orc = orc_factory(wf)
    run_id = orc.start(wf, {"n": 0})
    result = orc.cancel(run_id, reason="operator said so")
    assert result.status == "cancelled"
    assert orc.history(run_id)[-1]["data"]["reason"] == "operator said so"
    with pytest.raises(RunStateError, match="already cancelled"):
        orc.cancel(run_id)


def test_async_twins_drive_a_run_inside_an_event_loop(orc_factory):
    wf = counter_workflow(3)
    orc = orc_factory(wf)

    async def main():
        run_id = await orc.astart(wf, {"n": 0})
        return await orc.aresume(run_id)

    result = asyncio.run(main())
    assert result.status == "completed" and result.state["n"] == 3


def test_durable_start_and_reads_are_journaled(orc_factory):
    wf = Workflow("intent")

    @wf.step(start=True, durable_start=True, reads=["question"])
    def ask(ctx, state):
        return {"answer": 42}

    wf.edge("ask", END)
    orc = orc_factory(wf)
    orc.run(wf, {"question": "why", "other": "x"}, run_id="i1")
    history = orc.history("i1")
    assert kinds(history) == ["RunStarted", "StepStarted", "StepCompleted", "RunCompleted"]
    assert history[1]["data"]["input"] == {"reads": {"question": "why"}}


def test_snapshot_on_demand_verifies_and_shortens_recovery(orc_factory):
    # Given an interrupted run with no snapshot yet
    wf = counter_workflow(9)
    orc = orc_factory(wf, snapshot_every=1000)
    interrupted(orc, wf, "od", stop_at=5)
    assert orc.store.snapshots("od") == []
    # When a snapshot is taken on demand
    seq = orc.snapshot("od")
    # Then it sits at the end of the journal, and recovery starts from it with nothing to replay
    assert [s.seq for s in orc.store.snapshots("od")] == [seq] == [orc.store.last_seq("od")]
    result = orc_factory(wf).resume("od")
    resumed = [e["data"] for e in orc.history("od") if e["kind"] == "Resumed"][0]
    assert resumed["snapshot_seq"] == seq and resumed["replayed"] == 0
    assert result.state == {"n": 9, "seen": list(range(9))}


def test_an_error_from_the_sync_api_is_not_chained_to_the_event_loop_probe(orc_factory):
    # Given a workflow whose run is refused (an input that is not a mapping)
    wf = counter_workflow()
    orc = orc_factory(wf)
    # When the sync API raises
    with pytest.raises(Exception) as raised:
        orc.run(wf, ["not", "a", "dict"], run_id="bad-input")
    # Then the traceback is the error alone, not "During handling of RuntimeError: no running event loop"
    assert not isinstance(raised.value.__context__, RuntimeError)
    assert "input must be a dict" in str(raised.value)


def test_a_straight_line_workflow_needs_no_start_flag_and_no_edges(orc_factory):
    # Given three steps declared in order, the last returning a bare string into a field
    wf = Workflow("short")

    @wf.step()
    def plan(ctx, state):
        return {"todo": ["a", "b"]}

    @wf.step()
    def search(ctx, state):
        return {"found": [f"{t}!" for t in state["todo"]]}

    @wf.step(into="answer")
    def answer(ctx, state):
        return " / ".join(state["found"])

    # When it runs
    result = orc_factory(wf).run(wf, {}, run_id="short")
    # Then the steps ran in the order declared and the string became the answer
    assert result.status == "completed"
    assert result.state["answer"] == "a! / b!"


def test_a_steps_ms_is_the_attempt_that_completed_not_its_backoff(orc_factory, fake_time, monkeypatch):
    # Given a step that fails once, then waits out a 30 s backoff, then takes 2 s, on one clock
    import orchestrator.engine.steps as steps_module

    monkeypatch.setattr(steps_module.time, "perf_counter", fake_time.clock)
    wf = Workflow("timed")
    calls: list[int] = []

    @wf.step(retry=Retry(attempts=2, initial=30, jitter=False))
    def slow(ctx, state):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("try again")
        fake_time.advance(2)
        return {}

    orc = orc_factory(wf)
    # When it completes
    assert orc.run(wf, {}, run_id="t1").status == "completed"
    # Then its completion says 2 s: the first attempt and the backoff are the StepFailed's
    [done] = [e for e in orc.history("t1") if e["kind"] == "StepCompleted"]
    [failed] = [e for e in orc.history("t1") if e["kind"] == "StepFailed"]
    assert done["data"]["ms"] == 2000.0
    assert failed["data"]["retry_in"] == 30
