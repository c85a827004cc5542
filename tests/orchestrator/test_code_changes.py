"""Knowing when code changed under a run (CodeChanged, or refused) and upgrading a run's version
through a declared migration (Migrated). SQLite and Postgres."""

from __future__ import annotations

import pytest

from orchestrator import CodeChangedError, GraphChangedError, MigrationError
from workflows import END, DefinitionError, Workflow, reducers


def counting(*, body: str = "v1", stop_at: int | None = None, on_code_change: str = "journal", version: str = "1",
             limit: int = 6) -> Workflow:
    """Counts to ``limit`` with one of two bodies of the same step; "dies" at ``stop_at``."""
    wf = Workflow("cc", version=version, reducers={"seen": reducers.append}, on_code_change=on_code_change)
    if body == "v1":
        def tick(ctx, state):
            if state["n"] == stop_at:
                raise KeyboardInterrupt
            return {"n": state["n"] + 1, "seen": state["n"]}
    else:
        def tick(ctx, state):
            if state["n"] == stop_at:
                raise KeyboardInterrupt
            return {"n": state["n"] + 1, "seen": state["n"] * 10}  # a changed body
    wf.step(start=True)(tick)
    wf.route("tick", lambda s: "tick" if s["n"] < limit else END)
    return wf


def kinds(orc, run_id):
    return [e["kind"] for e in orc.history(run_id)]


def interrupt(orc_factory, run_id: str, **kw) -> None:
    orc = orc_factory(counting(stop_at=3, **kw))
    with pytest.raises(KeyboardInterrupt):
        orc.run(orc.workflows.get("cc"), {"n": 0}, run_id=run_id)


# -- code changes ------------------------------------------------------------------------------------
def test_each_steps_code_is_recorded_at_its_first_completion_only(orc_factory):
    orc = orc_factory(counting())
    orc.run(orc.workflows.get("cc"), {"n": 0}, run_id="rec")
    completions = [e["data"] for e in orc.history("rec") if e["kind"] == "StepCompleted"]
    assert "code" in completions[0] and len(completions[0]["code"]) == 16
    assert all("code" not in c for c in completions[1:])


def test_unchanged_code_resumes_without_a_word(orc_factory):
    interrupt(orc_factory, "same")
    result = orc_factory(counting()).resume("same")
    assert result.state["seen"] == [0, 1, 2, 3, 4, 5]
    assert "CodeChanged" not in kinds(orc_factory(counting()), "same")


def test_a_changed_step_body_is_journaled_visibly_and_the_run_continues(orc_factory):
    # Given a run interrupted after its step ran three times under the first body
    interrupt(orc_factory, "chg")
    # When it is resumed with a changed body of that step
    orc = orc_factory(counting(body="v2"))
    result = orc.resume("chg")
    # Then a CodeChanged event names the step with both hashes, before the new results
    history = orc.history("chg")
    [changed] = [e for e in history if e["kind"] == "CodeChanged"]
    assert list(changed["data"]["steps"]) == ["tick"] and changed["data"]["policy"] == "journal"
    tick = changed["data"]["steps"]["tick"]
    assert tick["recorded"] == history[1]["data"]["code"] != tick["now"]
    # And the results say which code made them: old counts, then new ones
    assert result.state["seen"] == [0, 1, 2, 30, 40, 50]
    # And once accepted, the new code is what later resumes compare with
    assert orc.engine.restore("chg", orc.workflows.get("cc"))[0].code["tick"] == tick["now"]


def test_a_workflow_that_refuses_changed_code_is_not_resumed_and_nothing_is_written(orc_factory):
    interrupt(orc_factory, "ref", on_code_change="refuse")
    orc = orc_factory(counting(body="v2", on_code_change="refuse"))
    before = orc.history("ref")
    with pytest.raises(CodeChangedError, match=r"code of step\(s\) tick of workflow 'cc' changed") as info:
        orc.resume("ref")
    assert set(info.value.changed) == {"tick"}
    assert orc.history("ref") == before
    # And the lease was given back: the old code resumes it at once
    assert orc_factory(counting(on_code_change="refuse")).resume("ref").state["seen"] == [0, 1, 2, 3, 4, 5]


def test_a_bad_code_change_policy_is_a_definition_error():
    with pytest.raises(DefinitionError, match="on_code_change must be 'journal' or 'refuse', got 'ignore'"):
        Workflow("x", on_code_change="ignore")


# -- migrations ---------------------------------------------------------------------------------------
def version_2(migrate=None) -> Workflow:
    """Version 2 keeps the count in ``count`` (version 1 called it ``n``)."""
    wf = Workflow("cc", version="2", reducers={"seen": reducers.append})

    @wf.step(start=True)
    def tick(ctx, state):
        return {"count": state["count"] + 1, "seen": state["count"]}

    wf.route("tick", lambda s: "tick" if s["count"] < 6 else END)
    if migrate is not None:
        wf.migrate(from_version="1")(migrate)
    return wf


def rename(state):
    state = dict(state)
    state["count"] = state.pop("n")
    return state


def test_a_run_of_version_1_resumes_under_version_2_through_its_declared_migration(orc_factory):
    # Given a run interrupted under version 1
    interrupt(orc_factory, "up")
    # When version 2, declaring a migration from 1, resumes it
    orc = orc_factory(version_2(rename))
    result = orc.resume("up")
    # Then the state was migrated, journaled with both versions, and the run finished under version 2
    assert result.status == "completed" and result.state["count"] == 6 and "n" not in result.state
    assert result.state["seen"] == [0, 1, 2, 3, 4, 5]
    [migrated] = [e["data"] for e in orc.history("up") if e["kind"] == "Migrated"]
    assert (migrated["from"], migrated["to"], migrated["migrations"]) == ("1", "2", ["rename"])
    assert migrated["state"]["count"] == 3
    row = orc.get_run("up")
    assert (row.version, row.fingerprint) == ("2", orc.workflows.get("cc").fingerprint)
    assert orc.verify("up").ok


def test_migrations_chain_and_without_one_the_graph_change_error_stays(orc_factory):
    interrupt(orc_factory, "none")
    with pytest.raises(GraphChangedError, match="version '1' -> '2'"):
        orc_factory(version_2()).resume("none")
    # A chain 1 -> 1b -> 2
    interrupt(orc_factory, "chain")
    wf = version_2()
    wf.migrate(from_version="1", to_version="1b")(lambda s: {**s, "hop": 1})
    wf.migrate(from_version="1b")(rename)
    result = orc_factory(wf).resume("chain")
    assert result.state["count"] == 6 and result.state["hop"] == 1
    [migrated] = [e["data"] for e in orc_factory(wf).history("chain") if e["kind"] == "Migrated"]
    assert migrated["migrations"] == ["test_migrations_chain_and_without_one_the_graph_change_error_stays.<locals>"
                                      ".<lambda>", "rename"]


@pytest.mark.parametrize("migrate, message", [
    (lambda s: 1 / 0, "raised ZeroDivisionError"),
    (lambda s: ["not", "a", "dict"], "returned a list, not a state"),
    (lambda s: {**rename(s), "handle": object()}, "cannot be"),
])
def test_a_migration_that_fails_is_named_and_the_run_is_left_as_it_was(orc_factory, migrate, message):
    interrupt(orc_factory, "bad")
    orc = orc_factory(version_2(migrate))
    before = orc.history("bad")
    with pytest.raises(MigrationError) as info:
        orc.resume("bad")
    assert "migration" in str(info.value) and "'cc'" in str(info.value) and "'bad'" in str(info.value)
    assert message in str(info.value), str(info.value)
    assert orc.history("bad") == before and orc.get_run("bad").version == "1"
    # And with a working migration the run is upgraded at once (the lease was given back)
    assert orc_factory(version_2(rename)).resume("bad").state["count"] == 6


def test_a_savepoint_of_version_1_is_upgraded_where_version_2_runs(orc_factory, tmp_path, db_url):
    interrupt(orc_factory, "sv")
    path = tmp_path / "v1.gz"
    orc_factory(counting()).savepoint("sv", name="v1", path=path)
    from orchestrator import Orchestrator

    with Orchestrator(f"sqlite:///{tmp_path}/v2.db", workflows=[version_2(rename)]) as there:
        there.restore(path)
        result = there.resume("sv")
    assert result.state["count"] == 6 and result.state["seen"] == [0, 1, 2, 3, 4, 5]


def test_a_step_whose_file_no_longer_matches_its_code_is_hashed_from_its_bytecode(tmp_path):
    # Given a step compiled under the name of a file whose text does not match it (code exec'd from a
    # document, or a file edited after import): the source lookup finds an unterminated statement
    from orchestrator.engine.code_changes import step_code

    other = tmp_path / "other.py"
    other.write_text("x = (\n", encoding="utf-8")
    namespace: dict = {}
    exec(compile("def plan(ctx, state):\n    return {'todo': []}\n", str(other), "exec"), namespace)  # noqa: S102
    # When its code is hashed, Then it gets a hash (of its bytecode), stable and not the source's error
    assert step_code(namespace["plan"]) == step_code(namespace["plan"])
    assert len(step_code(namespace["plan"])) == 16


def waiting_for_go(*, answer: int) -> Workflow:
    wf = Workflow("cc_wait", on_code_change="refuse")

    if answer == 1:
        def a(ctx, state):
            return {"a": 1}
    else:
        def a(ctx, state):
            return {"a": 2}  # a changed body

    def b(ctx, state):
        return {"b": ctx.wait_for("go")}

    wf.step(a)
    wf.step(b)
    return wf


def test_a_refused_resume_gives_a_waiting_run_back_still_waiting(orc_factory):
    # Given a run parked on a signal, whose first step's code then changes under a refusing workflow
    old = waiting_for_go(answer=1)
    orc = orc_factory(old)
    assert orc.run(old, {}, run_id="w1").status == "waiting"
    before = orc.store.get_run("w1")
    new = orc_factory(waiting_for_go(answer=2))
    # When the new code is asked to resume it
    with pytest.raises(CodeChangedError):
        new.resume("w1")
    # Then the run row is as it was: waiting, unleased, with its wake-up time; nothing was journaled
    after = new.store.get_run("w1")
    assert (after.status, after.lease_owner, after.wake_at, after.error) == \
           (before.status, None, before.wake_at, before.error) == ("waiting", None, before.wake_at, None)
    assert kinds(new, "w1")[-1] == "WaitStarted"
    # And no recovery treats it as interrupted; the old code delivers the signal and finishes it
    assert new.recover() == []
    orc.signal("w1", "go", 7)
    assert orc.resume("w1").state["b"] == 7
