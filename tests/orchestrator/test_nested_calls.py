"""Durable calls made while another durable call is performed, on SQLite and Postgres.

A tool that asks a model makes durable calls inside the tool's own durable call. They are numbered
under it ("0.0", "0.1" inside call 0), so when the step runs again (a crash, a retry, a wake-up)
and the tool's call is answered from the journal without being performed, the calls after it keep
the positions they were journaled at: nothing is performed twice and nothing is refused as changed.
``Stop`` stands for the process dying at that line (a ``BaseException`` no step code catches); the
real SIGKILLs are in tests/agents/test_nested_calls.py and the crash-point explorer's nested flow.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import flatflow  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.agents import Cassette  # noqa: E402
from orchestrator.testing import FakeClock  # noqa: E402
from workflows import END, Retry, Workflow  # noqa: E402

DATA = Path(__file__).parent / "data"


class Stop(BaseException):
    """Stands for the process dying here."""


def journaled(orc: Orchestrator, run_id: str) -> list[tuple[str, object, str]]:
    """(kind of call, position, what it asked) of every CallCompleted, in journal order."""
    return [(e["data"]["kind"], e["data"]["index"], e["data"]["request"].get("q")) for e in orc.history(run_id)
            if e["kind"] == "CallCompleted"]


def looking(performed: list[str], *, stop: str | None = None, wait: bool = False) -> Workflow:
    """A step whose tool (call 0) asks the model twice (calls 0.0 and 0.1), then a summary (call 1).
    ``stop`` names where the process dies; ``wait`` parks the run on a signal after the tool."""
    wf = Workflow("looking", version="1")

    def ask(q: str, answer: str):
        def perform() -> str:
            performed.append(q)  # a request the provider bills
            return answer
        return perform

    @wf.step(start=True)
    def think(ctx, state):
        def tool() -> list[str]:
            performed.append("look")
            old_town = ctx.durable_call("llm", {"q": "old town"}, ask("old town", "narrow"))
            if stop == "between the inner calls":
                raise Stop
            river = ctx.durable_call("llm", {"q": "river"}, ask("river", "wide"))
            if stop == "after the inner calls":
                raise Stop
            return [old_town, river]

        looked = ctx.durable_call("tool", {"q": "look"}, tool)
        if stop == "after the tool":
            raise Stop
        if wait:
            ctx.wait_for("go")
        summary = ctx.durable_call("llm", {"q": "summarise"}, ask("summarise", "fine"))
        return {"looked": looked, "summary": summary}

    wf.edge("think", END)
    return wf


NESTED = [("llm", "0.0", "old town"), ("llm", "0.1", "river"), ("tool", 0, "look"), ("llm", 1, "summarise")]


@pytest.mark.parametrize("stop, again", [
    ("after the tool", ["summarise"]),
    ("after the inner calls", ["look", "summarise"]),
    ("between the inner calls", ["look", "river", "summarise"]),
])
def test_a_step_resumed_after_a_crash_in_or_after_a_tool_performs_nothing_twice(db_url, stop, again):
    # Given a step whose tool makes two model calls, and a process that dies at one point of it
    performed: list[str] = []
    with Orchestrator(db_url, workflows=[looking(performed, stop=stop)]) as orc, pytest.raises(Stop):
        orc.run(orc.workflows.get("looking"), {}, run_id="n1")
    before = list(performed)
    # When another process resumes the run
    with Orchestrator(db_url, workflows=[looking(performed)]) as orc:
        result = orc.resume("n1")
        calls = journaled(orc, "n1")
    # Then it completes: the tool's call, when it had completed, came from the journal without its
    # inner calls, and the summary kept its position (no CallChangedError)
    assert result.status == "completed", result.error
    assert result.state == {"looked": ["narrow", "wide"], "summary": "fine"}
    # And only what had not been journaled was performed again: a tool call that had not completed
    # ran again, and its inner calls already journaled were answered from the journal
    assert performed[len(before):] == again
    # And every call is journaled once, at its position
    assert calls == NESTED


def test_a_retry_after_the_tool_reuses_it_and_numbers_the_later_calls_as_before(db_url):
    # Given a step whose first attempt fails after its tool (and the tool's two model calls) completed
    performed: list[str] = []
    clock = FakeClock()
    wf = Workflow("retrying", version="1")

    @wf.step(start=True, retry=Retry(attempts=2, initial=1.0, jitter=False))
    def think(ctx, state):
        def tool() -> str:
            a = ctx.durable_call("llm", {"q": "a"}, lambda: performed.append("a") or "A")
            b = ctx.durable_call("llm", {"q": "b"}, lambda: performed.append("b") or "B")
            return a + b
        looked = ctx.durable_call("tool", {"q": "look"}, lambda: performed.append("look") or tool())
        if ctx.attempt == 1:
            raise RuntimeError("the network dropped after the tool")
        return {"looked": looked, "final": ctx.durable_call("llm", {"q": "final"}, lambda: performed.append("final") or "F")}

    wf.edge("think", END)
    # When the run is driven (the step retries)
    with Orchestrator(db_url, workflows=[wf], clock=clock.clock, sleep=clock.sleep) as orc:
        result = orc.run(wf, {}, run_id="r1")
        calls = journaled(orc, "r1")
    # Then the second attempt took the tool from the journal and made only the final call
    assert result.status == "completed", result.error
    assert result.state == {"looked": "AB", "final": "F"}
    assert performed == ["look", "a", "b", "final"]
    assert calls == [("llm", "0.0", "a"), ("llm", "0.1", "b"), ("tool", 0, "look"), ("llm", 1, "final")]


def test_a_step_woken_by_a_signal_after_its_tool_does_not_renumber_its_later_calls(db_url):
    # Given a run parked on a signal after its tool and the tool's model calls completed
    performed: list[str] = []
    with Orchestrator(db_url, workflows=[looking(performed, wait=True)]) as orc:
        assert orc.run(orc.workflows.get("looking"), {}, run_id="w1").status == "waiting"
        # When the signal comes and the step runs again from its first line
        orc.signal("w1", "go", {"by": "ann"})
        result = orc.resume("w1")
        calls = journaled(orc, "w1")
    # Then the tool came from the journal, the summary was made once, at the position after it
    assert result.status == "completed", result.error
    assert performed == ["look", "old town", "river", "summarise"]
    assert calls == NESTED


def test_a_changed_inner_request_is_refused_with_its_position_named(db_url):
    # Given a run that died inside its tool, after the tool's first model call was journaled
    performed: list[str] = []
    with Orchestrator(db_url, workflows=[looking(performed, stop="between the inner calls")]) as orc, \
            pytest.raises(Stop):
        orc.run(orc.workflows.get("looking"), {}, run_id="c1")
    # When it is resumed by code whose tool now asks the model something else first
    changed = Workflow("looking", version="1")

    @changed.step(name="think", start=True)
    def think(ctx, state):
        def tool():
            return ctx.durable_call("llm", {"q": "harbour"}, lambda: performed.append("harbour") or "busy")
        return {"looked": ctx.durable_call("tool", {"q": "look"}, tool)}

    changed.edge("think", END)
    with Orchestrator(db_url, workflows=[changed]) as orc:
        result = orc.resume("c1")
    # Then the run fails with a CallChangedError naming the inner call by its position, the call it is
    # inside and the difference; the model was not asked the new question
    assert result.status == "failed"
    assert "CallChangedError" in result.error
    assert "call 0.0 (llm, inside call 0) of step 'think' was journaled with a different request" in result.error
    assert '- "q": "old town"' in result.error and '+ "q": "harbour"' in result.error
    assert "harbour" not in performed


def test_a_tool_performed_again_for_a_changed_request_reuses_its_unchanged_inner_calls(db_url):
    # Given a run that died after its tool (and the tool's two inner calls) were journaled
    performed: list[str] = []
    with Orchestrator(db_url, workflows=[looking(performed, stop="after the tool")]) as orc, \
            pytest.raises(Stop):
        orc.run(orc.workflows.get("looking"), {}, run_id="p1")
    # When the code changed the tool's request (opting in with if_changed="perform") and its second
    # question, but not its first
    changed = Workflow("looking", version="1")

    @changed.step(name="think", start=True)
    def think(ctx, state):
        def tool():
            old_town = ctx.durable_call("llm", {"q": "old town"}, lambda: performed.append("old town") or "narrow")
            bridge = ctx.durable_call("llm", {"q": "bridge"}, lambda: performed.append("bridge") or "long")
            return [old_town, bridge]
        return {"looked": ctx.durable_call("tool", {"q": "look again"}, tool, if_changed="perform")}

    changed.edge("think", END)
    with Orchestrator(db_url, workflows=[changed]) as orc:
        result = orc.resume("p1")
        history = [e["data"] for e in orc.history("p1") if e["kind"] == "CallCompleted"]
    # Then the tool ran again; its unchanged question came from the journal and the changed one was
    # asked (without if_changed of its own: it belongs to the tool call the code changed), both
    # journaled as replacing what they replaced
    assert result.status == "completed", result.error
    assert result.state["looked"] == ["narrow", "long"]
    assert performed == ["look", "old town", "river", "bridge"]
    assert [(c["index"], c["request"]["q"], bool(c.get("replaced"))) for c in history] == [
        ("0.0", "old town", False), ("0.1", "river", False), (0, "look", False),
        ("0.1", "bridge", True), (0, "look again", True)]


def test_a_changed_inner_request_of_a_tool_that_never_completed_is_refused(db_url):
    # Given a run that died inside its tool after both inner calls were journaled (the tool's own
    # call was not: nothing says what it asked)
    performed: list[str] = []
    with Orchestrator(db_url, workflows=[looking(performed, stop="after the inner calls")]) as orc, \
            pytest.raises(Stop):
        orc.run(orc.workflows.get("looking"), {}, run_id="p2")
    # When the code asks another second question inside the tool, opting in on the tool's call only
    changed = Workflow("looking", version="1")

    @changed.step(name="think", start=True)
    def think(ctx, state):
        def tool():
            old_town = ctx.durable_call("llm", {"q": "old town"}, lambda: performed.append("old town") or "narrow")
            return [old_town, ctx.durable_call("llm", {"q": "bridge"}, lambda: performed.append("bridge") or "long")]
        return {"looked": ctx.durable_call("tool", {"q": "look"}, tool, if_changed="perform")}

    changed.edge("think", END)
    with Orchestrator(db_url, workflows=[changed]) as orc:
        result = orc.resume("p2")
    # Then the changed inner call is refused, as any changed call: the tool's call is not one being
    # replaced, so nothing covers the new question
    assert result.status == "failed" and "call 0.1 (llm, inside call 0)" in result.error
    assert "bridge" not in performed


def test_two_tools_gathered_number_their_calls_by_when_they_started_whatever_order_they_ran_in(db_url):
    # Given an async step gathering two tools, each making two calls of its own; in the first attempt
    # Porto's inner calls run first, then both tools fail; the retry runs Faro's inner calls first
    performed: list[str] = []
    clock = FakeClock()
    wf = Workflow("gathered", version="1")

    @wf.step(start=True, retry=Retry(attempts=2, initial=1.0, jitter=False))
    async def compare(ctx, state):
        first = "Porto" if ctx.attempt == 1 else "Faro"
        done = {city: asyncio.Event() for city in ("Porto", "Faro")}

        async def weigh(city: str):
            async def perform():
                performed.append(city)
                if city != first:
                    await done[first].wait()  # the other tool makes its inner calls first
                rates = []
                try:
                    for aspect in ("food", "rent"):
                        rates.append(await ctx.adurable_call(
                            "rate", {"q": f"{city} {aspect}"}, lambda a=aspect: performed.append(f"{city} {a}") or 3))
                        await asyncio.sleep(0)
                finally:
                    done[city].set()  # (a call refused must not leave the other tool waiting)
                if ctx.attempt == 1:
                    raise RuntimeError(f"{city}: the tool failed after its calls")
                return rates

            return await ctx.adurable_call("tool", {"q": city}, perform)

        # return_exceptions: both tools end before the attempt does
        outcomes = await asyncio.gather(weigh("Porto"), weigh("Faro"), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return {"porto": outcomes[0], "faro": outcomes[1]}

    wf.edge("compare", END)
    # When the run is driven
    with Orchestrator(db_url, workflows=[wf], clock=clock.clock, sleep=clock.sleep) as orc:
        result = orc.run(wf, {}, run_id="g1")
        calls = journaled(orc, "g1")
    # Then the retry found every inner call at the position it was journaled at: none was made twice
    assert result.status == "completed", result.error
    assert sorted(performed) == sorted(["Porto", "Faro"] * 2 + ["Porto food", "Porto rent", "Faro food", "Faro rent"])
    # And the positions follow the tools' starting order (Porto 0, Faro 1), not the order they ran in
    assert sorted(calls, key=lambda c: str(c[1])) == [
        ("tool", 0, "Porto"), ("rate", "0.0", "Porto food"), ("rate", "0.1", "Porto rent"),
        ("tool", 1, "Faro"), ("rate", "1.0", "Faro food"), ("rate", "1.1", "Faro rent")]
    assert [c[1] for c in calls][:4] == ["0.0", "0.1", "1.0", "1.1"]  # journaled as Porto's ran first


def test_parallel_branches_on_threads_number_their_nested_calls_each_on_its_own(db_url):
    # Given two parallel sync branches (run on threads), each failing once after its tool and the
    # tool's inner call completed
    performed: list[str] = []
    clock = FakeClock()
    wf = Workflow("branches", version="1")

    @wf.step(start=True)
    def split(ctx, state):
        return {}

    def branch(name: str):
        def body(ctx, state):
            def tool():
                performed.append(f"{name} tool")
                return ctx.durable_call("llm", {"q": f"{name} inner"}, lambda: performed.append(f"{name} inner") or 1)
            looked = ctx.durable_call("tool", {"q": name}, tool)
            if ctx.attempt == 1:
                raise RuntimeError(f"{name}: dropped after the tool")
            final = ctx.durable_call("llm", {"q": f"{name} final"}, lambda: performed.append(f"{name} final") or 2)
            return {name: looked + final}
        return wf.step(name=name, retry=Retry(attempts=2, initial=1.0, jitter=False))(body)

    branch("east")
    branch("west")

    @wf.step()
    def join(ctx, state):
        return {"total": state["east"] + state["west"]}

    wf.edge("split", "east")
    wf.edge("split", "west")
    wf.edge(["east", "west"], "join")
    wf.edge("join", END)
    # When the run is driven
    with Orchestrator(db_url, workflows=[wf], clock=clock.clock, sleep=clock.sleep) as orc:
        result = orc.run(wf, {}, run_id="t1")
        history = [e["data"] for e in orc.history("t1") if e["kind"] == "CallCompleted"]
    # Then each branch's retry reused its tool and numbered its final call after it
    assert result.status == "completed", result.error
    assert result.state["total"] == 6
    assert sorted(performed) == sorted(f"{b} {what}" for b in ("east", "west") for what in ("tool", "inner", "final"))
    for name in ("east", "west"):
        assert [(c["index"], c["request"]["q"]) for c in history if c["step"] == name] == [
            ("0.0", f"{name} inner"), (0, name), (1, f"{name} final")]


def test_a_timer_inside_a_tool_is_numbered_under_it(db_url):
    # Given a step whose tool sleeps 100 s, then sleeps 10 s itself; the run has woken once, after the
    # tool's timer, and is parked on the step's own timer
    clock = FakeClock()
    wf = Workflow("sleepy", version="1")

    @wf.step(start=True)
    def nap(ctx, state):
        def tool() -> str:
            ctx.sleep(100)
            return "rested"
        rested = ctx.durable_call("tool", {"q": "rest"}, tool)
        ctx.sleep(10)
        return {"rested": rested}

    wf.edge("nap", END)
    with Orchestrator(db_url, workflows=[wf], clock=clock.clock, sleep=clock.sleep) as orc:
        assert orc.run(wf, {}, run_id="s1").status == "waiting"
        clock.advance(100)
        assert orc.resume("s1").status == "waiting"
        # When someone resumes it before its own 10 s have passed
        clock.advance(5)
        early = orc.resume("s1")
        timers = [e["data"] for e in orc.history("s1") if e["kind"] == "TimerStarted"]
        # Then it is still waiting (its timer is its own, not the tool's, which has passed)
        assert early.status == "waiting"
        assert [t["index"] for t in timers] == ["0.0", 0, 0]
        assert timers[1]["wake_at"] == timers[2]["wake_at"] == timers[0]["wake_at"] + 10
        # And once its time has come, it completes
        clock.advance(5)
        assert orc.resume("s1").status == "completed"


def test_effects_of_calls_made_inside_a_call_are_undone_newest_first(db_url):
    # Given a step whose trip call (an effect) books a hotel and a car inside it (effects too), then fails
    undone: list[str] = []
    wf = Workflow("nested-saga", version="1")

    def booking(ctx, what: str):
        return lambda response: {"name": what, "key": f"{ctx.idempotency_key}:{what}", "result": response}

    def undo(ctx, effect):
        undone.append(f"{effect.name} at {effect.call}")

    @wf.step(start=True, effect=True, compensate=undo)
    def book(ctx, state):
        def trip() -> str:
            ctx.durable_call("book", {"q": "hotel"}, lambda: "H1", effect=booking(ctx, "hotel"))
            ctx.durable_call("book", {"q": "car"}, lambda: "C1", effect=booking(ctx, "car"))
            return "T1"
        ctx.durable_call("book", {"q": "trip"}, trip, effect=booking(ctx, "trip"))
        raise RuntimeError("card declined")

    wf.edge("book", END)
    # When the run fails
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="e1")
    # Then each booking was undone once, newest first: the trip (it completed last), then the car,
    # then the hotel
    assert result.status == "compensated", result.error
    assert undone == ["trip at 0", "car at 0.1", "hotel at 0.0"]


def test_a_journal_written_before_calls_could_nest_resumes_unchanged(db_url, tmp_path):
    # Given a run parked after two calls, written by agentsaga before calls could nest (a savepoint of
    # it made by that version: see flatflow.py)
    path = tmp_path / "flat.savepoint"
    path.write_bytes(gzip.compress((DATA / "flat-journal.savepoint.json").read_bytes()))
    flatflow.performed.clear()
    with Orchestrator(db_url, workflows=[flatflow.flat]) as orc:
        run_id = orc.restore(path)
        # When the signal it waits for comes and this version resumes it
        orc.signal(run_id, "go", {"by": "ann"})
        result = orc.resume(run_id)
        calls = [(e["data"]["index"], e["data"]["request"]["prompt"]) for e in orc.history(run_id)
                 if e["kind"] == "CallCompleted"]
        verified = orc.verify(run_id)
    # Then its two journaled calls are answered from the journal at their old positions, and only
    # the third is made
    assert result.status == "completed", result.error
    assert result.state["answers"] == ["one", "two", "three"] and result.state["by"] == "ann"
    assert flatflow.performed == ["third"]
    assert calls == [(0, "first"), (1, "second"), (2, "third")]
    assert verified.ok


def test_a_cassette_recorded_before_calls_could_nest_still_replays(db_url):
    # Given a cassette of a whole run recorded by agentsaga before calls could nest (see flatflow.py)
    flatflow.performed.clear()
    replay = Cassette.load(DATA / "flat.cassette.json")
    # When a run is replayed from it
    with Orchestrator(db_url, workflows=[flatflow.flat], replay=replay) as orc:
        result = orc.run(flatflow.flat, {"wait": False}, run_id="replayed")
        replayed = [e["data"].get("replayed") for e in orc.history("replayed") if e["kind"] == "CallCompleted"]
    # Then every call is answered from it; nothing is performed
    assert result.status == "completed", result.error
    assert result.state["answers"] == ["one", "two", "three"]
    assert flatflow.performed == [] and replayed == [True, True, True]


def agentsaga(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_show_and_history_tell_a_call_made_inside_another_one(db_url):
    # Given a completed run whose tool made two model calls inside its own call
    performed: list[str] = []
    with Orchestrator(db_url, workflows=[looking(performed)]) as orc:
        assert orc.run(orc.workflows.get("looking"), {}, run_id="a1").status == "completed"
    # When it is shown and its history listed
    show = agentsaga("show", "a1", "--db", db_url)
    history = agentsaga("history", "a1", "--db", db_url)
    assert show.returncode == 0 and history.returncode == 0, show.stderr + history.stderr
    # Then show lists the calls by position, each inner call indented under the call that made it
    calls = show.stdout.split("CALLS (4 journaled)\n", 1)[1].split("\n\n", 1)[0].splitlines()
    positions = [line.split("think", 1)[1][:9].rstrip() for line in calls[1:]]
    assert positions == ["  0", "    0.0", "    0.1", "  1"]
    assert [line.split()[3] for line in calls[1:]] == ["tool", "llm", "llm", "llm"]
    # And history names each inner call by its position and the call it was made inside
    assert "think call 0.0 (llm" in history.stdout and ", inside call 0)" in history.stdout
    assert "think call 0 (tool" in history.stdout and "think call 1 (llm" in history.stdout
