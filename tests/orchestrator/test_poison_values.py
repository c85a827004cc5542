"""A value the journal cannot hold fails the step that made it, and the run ends: never a run left
``running`` whose every resume runs the step again and crashes the same way (invariants 1 and 10).

Each case is a value an agent meets in the wild: a model's answer where a number was expected (a
reducer cannot merge it), a lone surrogate from a JSON ``\\ud800`` escape, a set of tuples, an
exception whose ``__str__`` raises. On SQLite and Postgres.
"""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import BaseModel

from orchestrator import EncodingError, RunNotFoundError
from orchestrator.payload import dumps as encode_json
from orchestrator.payload.exceptions import MESSAGE_LIMIT, TRACEBACK_LIMIT, bounded, error_record
from workflows import InputError, ReducerError, Retry, Workflow, reducers


def _kinds(orc, run_id: str) -> list[str]:
    return [event["kind"] for event in orc.history(run_id)]


def _executions(ledger: list[str], step: str) -> int:
    return sum(1 for name in ledger if name == step)


@pytest.mark.parametrize("field_reducer, good, bad, culprit", [
    (reducers.add, 2, "x", "reducer reducers.add could not merge str 'x' into int 2"),
    (reducers.merge, {"a": 1}, ["not", "a", "dict"], "reducer reducers.merge could not merge list"),
    (reducers.extend, [1], 5, "reducer reducers.extend could not merge int 5 into list [1]"),
])
def test_an_update_its_reducer_cannot_merge_fails_the_step_and_ends_the_run(orc_factory, field_reducer, good, bad,
                                                                              culprit):
    # Given a workflow whose second step returns a value the field's reducer cannot merge
    ledger: list[str] = []
    wf = Workflow("poison_reducer", reducers={"count": field_reducer})

    @wf.step
    def first(ctx, state):
        ledger.append("first")
        return {"count": good}

    @wf.step
    def second(ctx, state):
        ledger.append("second")
        return {"count": bad}

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step failed with an error naming the field and the reducer, and the run ended
    assert result.status == "failed"
    assert "ReducerError" in result.error and "field 'count'" in result.error and culprit in result.error
    assert _kinds(orc, "r1") == ["RunStarted", "StepCompleted", "StepFailed", "RunFailed"]
    assert result.state == {"count": good}  # the state is what the journal folds to
    # And resuming it runs nothing again
    again = orc.resume("r1")
    assert again.status == "failed"
    assert _executions(ledger, "second") == 1
    assert orc.verify("r1").ok


def test_a_custom_reducer_that_raises_fails_the_step(orc_factory):
    # Given a field whose own reducer refuses an update
    def positive(current, update):
        if update < 0:
            raise ValueError("amounts are positive")
        return (0 if not current else current) + update

    wf = Workflow("poison_custom", reducers={"total": positive})

    @wf.step
    def charge(ctx, state):
        return {"total": -5}

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step fails, naming the field and the reducer's own words
    assert result.status == "failed"
    assert "field 'total'" in result.error and "positive" in result.error and "amounts are positive" in result.error
    assert _kinds(orc, "r1")[-2:] == ["StepFailed", "RunFailed"]


def test_parallel_branches_whose_updates_cannot_be_merged_together_fail_the_last_to_complete(orc_factory):
    # Given two branches that each start a field the other cannot be added to (each merge alone works)
    wf = Workflow("poison_join", reducers={"x": reducers.add})

    @wf.step
    def fan(ctx, state):
        return {}

    @wf.step
    def text(ctx, state):
        return {"x": "a"}

    @wf.step
    def number(ctx, state):
        return {"x": 1}

    wf.route("fan", lambda s: ["text", "number"], targets=["text", "number"])
    orc = orc_factory(wf)
    # When both branches complete
    result = orc.run(wf, {}, run_id="r1")
    # Then the tick's merge is refused before anything is written, and the run fails with it
    assert result.status == "failed"
    assert "ReducerError" in result.error and "field 'x'" in result.error
    kinds = _kinds(orc, "r1")
    assert kinds.count("StepCompleted") == 2 and kinds[-2:] == ["StepFailed", "RunFailed"]
    assert orc.verify("r1").ok


@pytest.mark.parametrize("where", ["output", "key", "trace", "exception"])
def test_a_lone_surrogate_fails_the_step_that_made_it(orc_factory, where):
    # Given a step that meets a lone surrogate (a JSON "\ud800" escape) in what it journals
    wf = Workflow("poison_surrogate")

    @wf.step
    def a(ctx, state):
        if where == "output":
            return {"x": ["fine", "bad\ud800"]}
        if where == "key":
            return {"x": {"bad\ud800": 1}}
        if where == "trace":
            ctx.trace("thinking", msg="bad\ud800")
            return {}
        raise ValueError("bad\ud800 input")

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step failed with a clear error, and the failure itself was journaled
    assert result.status == "failed"
    if where == "exception":
        assert "bad\\ud800 input" in result.error  # the message is kept, the surrogate written as its escape
    else:
        assert "lone surrogate" in result.error and "'\\ud800'" in result.error
    assert _kinds(orc, "r1")[-2:] == ["StepFailed", "RunFailed"]
    assert orc.resume("r1").status == "failed"


def test_a_set_of_tuples_is_refused_at_the_step_that_made_it(orc_factory):
    # Given a step returning a set whose members would come back as lists
    wf = Workflow("poison_set")

    @wf.step
    def a(ctx, state):
        return {"pairs": {(1, 2), (3, 4)}}

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step fails naming the set and what it holds; a resume runs nothing
    assert result.status == "failed"
    assert "the set at $.pairs holds a tuple" in result.error
    assert orc.resume("r1").status == "failed"


def test_an_exception_whose_str_raises_is_still_recorded(orc_factory):
    # Given a step raising an exception whose message cannot be built
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("str blew up")

    wf = Workflow("poison_exc")

    @wf.step
    def a(ctx, state):
        raise Broken()

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the failure is journaled with a message saying so
    assert result.status == "failed"
    assert "str() of this" in result.error and "raised RuntimeError" in result.error


def test_the_codec_refuses_lone_surrogates_anywhere_and_keeps_real_text():
    # Given values holding a lone surrogate in a nested value or a key, and ordinary non-ASCII text
    # When they are encoded / Then the surrogate is an EncodingError naming its path
    with pytest.raises(EncodingError, match=r"the text at \$\.a\[1\]\.b holds a lone surrogate"):
        encode_json({"a": [0, {"b": "x\udcff"}]})
    with pytest.raises(EncodingError, match=r"\(key\) holds a lone surrogate"):
        encode_json({"k\ud800": 1})
    assert encode_json({"text": "é ✓ 漢字 😀"}) == '{"text":"é ✓ 漢字 😀"}'


def test_an_error_record_is_always_storable():
    # Given an exception whose message holds a lone surrogate
    try:
        raise ValueError("bad \ud800 value")
    except ValueError as exc:
        record = error_record(exc)
    # Then its record encodes as UTF-8
    assert record["message"] == "bad \\ud800 value"
    record["traceback"].encode("utf-8")
    encode_json(record)


def test_reducer_errors_name_the_field_outside_the_engine_too():
    # Given a workflow's merge used directly
    wf = Workflow("merge_direct", reducers={"n": reducers.add})
    state = {"n": 1}
    # When an update cannot be merged / Then the error names the field, and the state is unchanged
    with pytest.raises(ReducerError) as raised:
        wf.reduce(state, {"n": "x"})
    assert raised.value.field == "n" and state == {"n": 1}


# -- dict keys that are not strings (JSON would turn them into strings, or lose one of two) ---------------
def test_int_keys_reach_the_next_step_as_returned_on_the_first_run_and_after_a_resume(orc_factory):
    # Given a step returning dicts keyed by ints and dates, a durable call answering with int keys,
    # and a next step that waits for a signal (so a second process drives the rest from the journal)
    seen: list[object] = []
    performed: list[int] = []
    wf = Workflow("int_keys")

    @wf.step(start=True)
    def plan(ctx, state):
        return {"by_id": {1: "a", 2: "b"}, "by_day": {dt.date(2026, 1, 2): 3}}

    @wf.step
    def lookup(ctx, state):
        answer = ctx.durable_call("lookup", {"ids": {7: True}}, lambda: performed.append(1) or {404: "gone"})
        seen.append((state["by_id"], state["by_day"], answer))
        return {"answer": answer, "signal": ctx.wait_for("go")}

    wf.edge("plan", "lookup")
    first = orc_factory(wf)
    # When it runs until the wait, and another Orchestrator sends the signal and resumes it
    assert first.run(wf, {"given": {10: "x"}}, run_id="r1").status == "waiting"
    second = orc_factory(wf)
    second.signal("r1", "go", {5: "five"})
    result = second.resume("r1")
    # Then the step saw the keys it was given, the same on both runs, and the call was made once
    expected = ({1: "a", 2: "b"}, {dt.date(2026, 1, 2): 3}, {404: "gone"})
    assert seen == [expected, expected] and performed == [1]
    assert result.status == "completed"
    assert result.state == {"given": {10: "x"}, "by_id": {1: "a", 2: "b"}, "by_day": {dt.date(2026, 1, 2): 3},
                            "answer": {404: "gone"}, "signal": {5: "five"}}
    assert second.verify("r1").ok


def test_a_dict_whose_keys_would_collide_fails_the_step_and_ends_the_run(orc_factory):
    # Given a step returning a dict in which 1 and "1" would both be written as "1"
    ledger: list[str] = []
    wf = Workflow("colliding_keys")

    @wf.step
    def a(ctx, state):
        ledger.append("a")
        return {"items": [{"name": "x"}, {1: "a", "1": "b"}]}

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step failed naming the dict and the key, nothing of it was journaled, and the run ended
    assert result.status == "failed"
    assert "EncodingError" in result.error and "output of step 'a'" in result.error
    assert "the dict at $.items[1] mixes string keys with the key 1 (int)" in result.error
    assert "one entry would be lost" in result.error
    assert _kinds(orc, "r1") == ["RunStarted", "StepFailed", "RunFailed"]
    # And resuming it runs nothing again
    assert orc.resume("r1").status == "failed"
    assert ledger == ["a"]


def test_an_input_or_signal_whose_keys_would_collide_is_refused_before_anything_is_written(orc_factory):
    # Given a workflow waiting for a signal
    wf = Workflow("colliding_doors")

    @wf.step
    def a(ctx, state):
        return {"got": ctx.wait_for("go")}

    orc = orc_factory(wf)
    # When a run is started with colliding keys in its input, or with a state field that is not a string
    # Then it is refused and no run exists
    with pytest.raises(EncodingError, match=r"input of workflow 'colliding_doors'.*\$\.input\.m mixes string keys"):
        orc.run(wf, {"m": {True: 1, "true": 2}}, run_id="bad")
    with pytest.raises(InputError, match="input has a non-string key 3"):
        orc.run(wf, {3: "x"}, run_id="bad2")
    with pytest.raises(RunNotFoundError):
        orc.get_run("bad")
    with pytest.raises(RunNotFoundError):
        orc.get_run("bad2")
    # When a waiting run is sent a signal with colliding keys
    assert orc.run(wf, {}, run_id="r1").status == "waiting"
    with pytest.raises(EncodingError, match=r"data of signal 'go' cannot be journaled: the top-level dict mixes"):
        orc.signal("r1", "go", {1: "a", "1": "b"})
    # Then nothing was queued: a good signal is the one the step receives
    orc.signal("r1", "go", {1: "a"})
    assert orc.resume("r1").state == {"got": {1: "a"}}


class _Scores(BaseModel):
    by_id: dict[int, float] = {}


def test_a_typed_state_keyed_by_ints_keeps_working(orc_factory):
    # Given a typed state with a field keyed by ints
    wf = Workflow("typed_int_keys", state=_Scores)

    @wf.step
    def score(ctx, state):
        return {"by_id": {**state.by_id, 3: 0.5}}

    orc = orc_factory(wf)
    # When it runs / Then the model's keys are ints, and the journal holds them as ints
    result = orc.run(wf, {"by_id": {1: 1.0}}, run_id="r1")
    assert result.status == "completed" and result.state.by_id == {1: 1.0, 3: 0.5}
    assert orc.history("r1")[1]["data"]["update"] == {"by_id": {1: 1.0, 3: 0.5}}


def test_a_durable_call_whose_response_cannot_be_journaled_names_the_call_and_is_not_made_again(orc_factory):
    # Given a step whose durable call answers with a dict mixing 1 and "1"
    performed: list[int] = []
    wf = Workflow("bad_response")

    @wf.step
    def a(ctx, state):
        return {"r": ctx.durable_call("lookup", {"q": 1}, lambda: performed.append(1) or {1: "a", "1": "b"})}

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step fails naming the call and the path in its response, and the call was made once
    assert result.status == "failed"
    assert "response of lookup call 0 in step 'a' cannot be journaled: the top-level dict mixes" in result.error
    assert "the call was made" in result.error
    assert orc.resume("r1").status == "failed" and performed == [1]


# -- exception messages of any size ------------------------------------------------------------------------
def test_a_huge_exception_message_is_journaled_bounded_keeping_its_start_and_end(orc_factory):
    # Given a step that raises, on each of its 2 attempts, an exception whose message is 20 MB
    # (caused by another one, as large), with recognisable start and end
    wf = Workflow("huge_error")
    huge = "START " + "x" * 20_000_000 + " END"

    @wf.step(retry=Retry(attempts=2, initial=0.01, max_backoff=0.01, jitter=0))
    def a(ctx, state):
        try:
            raise KeyError("cause " + "y" * 20_000_000)
        except KeyError as cause:
            raise ValueError(huge) from cause

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then every record of the failure is bounded: start and end kept, the cut said
    assert result.status == "failed"
    history = orc.history("r1")
    assert [e["kind"] for e in history] == ["RunStarted", "StepFailed", "StepFailed", "RunFailed"]
    cut = f"…[{len(huge) - MESSAGE_LIMIT:,} of {len(huge):,} characters cut]…"
    for event in history[1:]:
        message = event["data"]["error"]["message"]
        assert message.startswith("START xxx") and message.endswith("xxx END") and cut in message
        assert len(message) <= MESSAGE_LIMIT + len(cut)
    for failed in history[1:3]:
        tb = failed["data"]["error"]["traceback"]
        assert len(tb) <= TRACEBACK_LIMIT + 100
        # the frames stay: the message inside the traceback (and its cause's) is cut in the middle
        assert "in a\n" in tb and "ValueError: START" in tb and "characters cut]" in tb
    assert result.error.startswith("ValueError: START") and len(result.error) < MESSAGE_LIMIT + 100
    assert orc.get_run("r1").error == result.error
    # And the whole journal stays small
    assert sum(len(encode_json(e["data"])) for e in history) < 100_000


def test_a_cut_never_splits_a_key_so_redaction_still_sees_it():
    # Given a message holding an API key exactly where the middle would be cut
    key = "sk-" + "A" * 40
    pad = "word " * ((MESSAGE_LIMIT // 2 - 10) // 5)
    message = pad + key + " " + "z " * 20_000 + " " + key + " " + pad
    # When it is bounded
    kept = bounded(message)
    # Then each key is kept whole or cut whole, never a fragment
    assert kept.count("sk-") == kept.count(key)
    assert "characters cut]" in kept and len(kept) <= MESSAGE_LIMIT + 60


# -- values nested very deeply -------------------------------------------------------------------------------
def _nested(levels: int) -> list:
    top = current = []
    for _ in range(levels):
        inner: list = []
        current.append(inner)
        current = inner
    return top


def test_a_value_too_deep_for_json_fails_the_step_and_ends_the_run(orc_factory):
    # Given a step returning a list nested 100,000 levels deep (JSON cannot be written that deep)
    ledger: list[str] = []
    wf = Workflow("too_deep")

    @wf.step
    def a(ctx, state):
        ledger.append("a")
        return {"x": _nested(100_000)}

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step failed with an EncodingError saying so (not a RecursionError out of run), and
    # the run ended instead of staying running
    assert result.status == "failed" and orc.get_run("r1").status == "failed"
    assert "EncodingError: output of step 'a' cannot be journaled: it is nested too deeply" in result.error
    assert "more than 500 levels at $.x[0][0]" in result.error
    assert _kinds(orc, "r1") == ["RunStarted", "StepFailed", "RunFailed"]
    assert orc.resume("r1").status == "failed" and ledger == ["a"]
    # And an input as deep is refused before anything is written
    with pytest.raises(EncodingError, match="input of workflow 'too_deep' cannot be journaled: it is nested too deeply"):
        orc.run(wf, {"x": _nested(100_000)}, run_id="r2")
    with pytest.raises(RunNotFoundError):
        orc.get_run("r2")


def test_a_deep_value_the_journal_holds_is_routed_snapshotted_and_verified(orc_factory):
    # Given a routed step returning a list nested 700 levels deep (JSON holds it; a recursive copy
    # of two frames a level would not), with a snapshot after every event
    wf = Workflow("deep_ok")

    @wf.step
    def a(ctx, state):
        return {"x": _nested(700)}

    @wf.step
    def b(ctx, state):
        return {"depth_seen": True}

    wf.route("a", lambda state: "b", targets=["b"])
    orc = orc_factory(wf, snapshot_every=1)
    # When it runs / Then it completes, and its snapshots verify against the journal
    result = orc.run(wf, {}, run_id="r1")
    assert result.status == "completed", result.error
    assert result.state["depth_seen"] is True
    assert orc.verify("r1").ok


# -- durations a timer cannot be journaled with -------------------------------------------------------------
@pytest.mark.parametrize("call, said", [
    (lambda ctx: ctx.sleep(float("nan")), "ctx.sleep needs a finite number of seconds >= 0, got nan"),
    (lambda ctx: ctx.sleep(float("inf")), "ctx.sleep needs a finite number of seconds >= 0, got inf"),
    (lambda ctx: ctx.sleep(True), "ctx.sleep needs a finite number of seconds >= 0, got True"),
    (lambda ctx: ctx.wait_for("go", timeout=float("nan")), "wait_for timeout must be a finite number"),
    (lambda ctx: ctx.wait_for("go", timeout=float("inf")), "(None: no timeout), got inf"),
], ids=["sleep nan", "sleep inf", "sleep True", "wait nan", "wait inf"])
def test_a_timer_of_nan_or_infinite_seconds_fails_the_step_instead_of_stranding_the_run(orc_factory, call, said):
    # Given a step that sleeps or waits for a duration JSON cannot hold
    wf = Workflow("bad_timer")

    @wf.step
    def a(ctx, state):
        call(ctx)
        return {}

    orc = orc_factory(wf)
    # When the run is driven
    result = orc.run(wf, {}, run_id="r1")
    # Then the step failed naming the call and the value, and the run ended: nothing left running
    assert result.status == "failed" and orc.get_run("r1").status == "failed"
    assert "ValueError" in result.error and said in result.error
    assert _kinds(orc, "r1") == ["RunStarted", "StepFailed", "RunFailed"]
