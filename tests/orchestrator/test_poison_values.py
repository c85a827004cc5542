"""A value the journal cannot hold fails the step that made it, and the run ends: never a run left
``running`` whose every resume runs the step again and crashes the same way (invariants 1 and 10).

Each case is a value an agent meets in the wild: a model's answer where a number was expected (a
reducer cannot merge it), a lone surrogate from a JSON ``\\ud800`` escape, a set of tuples, an
exception whose ``__str__`` raises. On SQLite and Postgres.
"""

from __future__ import annotations

import pytest

from orchestrator import EncodingError
from orchestrator.payload import dumps as encode_json
from orchestrator.payload.exceptions import error_record
from workflows import ReducerError, Workflow, reducers


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
