"""Record / replay: a run replayed from a previous run's journal or a cassette file, with no model
server running; a changed request is an error that shows the difference."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import API_KEY, calls  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.agents import run_tool_loop, ToolRegistry  # noqa: E402
from orchestrator.agents import Cassette  # noqa: E402
from orchestrator.testing import reply, tool_call  # noqa: E402
from orchestrator.agents import LLM  # noqa: E402
from orchestrator.agents import Prompt  # noqa: E402
from orchestrator import ReplayError  # noqa: E402
from workflows import END, Workflow, reducers  # noqa: E402

ran: list[str] = []  # tool executions, to see that replay does not run tools


def agent(llm: LLM, template: str = "Find venues in {{ city }}.") -> Workflow:
    tools = ToolRegistry()
    prompt = Prompt(template, name="find")

    @tools.tool
    def search(city: str) -> list[str]:
        """Venues in a city."""
        ran.append(city)
        return [f"{city} Hall", f"{city} Loft"]

    wf = Workflow("replayed", reducers={"answers": reducers.append})

    @wf.step(start=True)
    def research(ctx, state):
        out = run_tool_loop(ctx, llm, [prompt.message(city=state["city"])], tools)
        return {"answers": out.content, "round": state.get("round", 0) + 1}

    wf.route("research", lambda s: "research" if s["round"] < 2 else END, targets=["research", END])
    return wf


SCRIPT = [tool_call("search", {"city": "Lisbon"}), reply("Lisbon Hall, round 1"),
          tool_call("search", {"city": "Lisbon"}), reply("Lisbon Loft, round 2")]


@pytest.fixture
def recorded(db_url, chat):
    """A run recorded against the live server (two visits of a looping step), then the server stopped."""
    chat.script(SCRIPT)
    llm = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    wf = agent(llm)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        original = orc.run(wf, {"city": "Lisbon"}, run_id="rec")
        cassette = Cassette.from_run(orc, "rec")
    chat.stop()
    ran.clear()
    return original, cassette, chat.url


def test_a_run_replays_from_a_previous_runs_journal_with_no_server(db_url, recorded):
    original, cassette, dead_url = recorded
    assert original.status == "completed" and len(cassette) == 6
    # Given the model server is gone
    llm = LLM(base_url=dead_url, model="scripted-model", api_key=API_KEY, max_attempts=1)
    # When the workflow runs again, under a new id, replaying the cassette
    wf = agent(llm)
    with Orchestrator(db_url, workflows=[wf], replay=cassette) as orc:
        replayed = orc.run(wf, {"city": "Lisbon"}, run_id="again")
        journal = calls(orc, "again")
    # Then it reached the same result, answered by the recording: no request, no tool execution
    assert replayed.status == "completed", replayed.error
    assert replayed.state == original.state
    assert ran == []
    # And its own journal records the calls, marked as replayed
    assert len(journal) == 6 and all(c.get("replayed") for c in journal)


def test_a_cassette_saved_to_a_file_replays_the_same(db_url, recorded, tmp_path):
    original, cassette, dead_url = recorded
    # Given the cassette written to a file in a folder not made yet, and read back
    path = cassette.save(tmp_path / "cassettes" / "research.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "agentsaga-cassette" and doc["version"] == 1 and doc["source"]["run_id"] == "rec"
    assert [(c["step"], c["visit"], c["index"]) for c in doc["calls"]][:4] == [
        ("research", 0, 0), ("research", 0, 1), ("research", 0, 2), ("research", 1, 0)]
    llm = LLM(base_url=dead_url, model="scripted-model", api_key=API_KEY, max_attempts=1)
    # When a run replays it
    wf = agent(llm)
    with Orchestrator(db_url, workflows=[wf], replay=Cassette.load(path)) as orc:
        replayed = orc.run(wf, {"city": "Lisbon"}, run_id="from-file")
    # Then the outcome is the recorded one
    assert replayed.status == "completed" and replayed.state == original.state


def test_a_changed_prompt_is_a_replay_mismatch_showing_the_difference(db_url, recorded):
    _, cassette, dead_url = recorded
    llm = LLM(base_url=dead_url, model="scripted-model", api_key=API_KEY, max_attempts=1)
    # Given the prompt template changed since the recording
    changed = agent(llm, "Find conference venues in {{ city }}.")
    # When the run replays
    with Orchestrator(db_url, workflows=[changed], replay=cassette) as orc:
        result = orc.run(changed, {"city": "Lisbon"}, run_id="changed")
    # Then it fails with a diff of the recorded and the new request, line by line
    assert result.status == "failed" and "ReplayMismatchError" in result.error
    assert "step 'research' (visit 0), llm call 0" in result.error
    assert '-      "content": "Find venues in Lisbon.",' in result.error
    assert '+      "content": "Find conference venues in Lisbon.",' in result.error


def test_a_call_the_recording_never_made_is_a_replay_missing_error(db_url, recorded):
    _, cassette, dead_url = recorded
    llm = LLM(base_url=dead_url, model="scripted-model", api_key=API_KEY, max_attempts=1)
    wf = Workflow("replayed")  # same name, a step the recording does not know

    @wf.step(start=True)
    def summarise(ctx, state):
        return {"s": llm.chat(ctx, "summarise").content}

    wf.edge("summarise", END)
    with Orchestrator(db_url, workflows=[wf], replay=cassette) as orc:
        result = orc.run(wf, {}, run_id="missing")
    assert result.status == "failed" and "ReplayMissingError" in result.error
    assert "no recording for step 'summarise' (visit 0), llm call 0" in result.error


def test_a_cassette_file_of_another_version_or_kind_is_refused(tmp_path):
    (tmp_path / "v9.json").write_text(json.dumps({"format": "agentsaga-cassette", "version": 9, "calls": []}))
    (tmp_path / "other.json").write_text(json.dumps({"calls": []}))
    with pytest.raises(ReplayError, match="format version 9"):
        Cassette.load(tmp_path / "v9.json")
    with pytest.raises(ReplayError, match="not an agentsaga cassette"):
        Cassette.load(tmp_path / "other.json")


def test_a_cassette_finds_a_call_by_its_position_and_refuses_an_index_that_is_not_one():
    # Given a cassette holding a top-level call (as every cassette always did) and calls made inside it
    cassette = Cassette([{"step": "s", "visit": 0, "index": i, "kind": "llm", "request": {"q": str(i)},
                          "response": f"answer {i}"} for i in (0, "0.0", "0.1", 1)])
    # Then each is found by its position, a top-level one as a number or as text
    assert cassette.lookup("s", 0, 0, "llm", {"q": "0"}) == "answer 0"
    assert cassette.lookup("s", 0, "0", "llm", {"q": "0"}) == "answer 0"
    assert cassette.lookup("s", 0, "0.1", "llm", {"q": "0.1"}) == "answer 0.1"
    # And a position it lacks is named with the ones it holds, in order
    with pytest.raises(ReplayError, match=r"llm call 0.2; it holds visit 0 call 0, visit 0 call 0.0, "
                                          r"visit 0 call 0.1, visit 0 call 1"):
        cassette.lookup("s", 0, "0.2", "llm", {"q": "0.2"})
    # And an index that is no position is refused when the cassette is read, naming the call
    for bad in (-1, "1.x", True, None, 1.5):
        with pytest.raises(ReplayError, match=r"cassette call #0 has index"):
            Cassette([{"step": "s", "visit": 0, "index": bad, "kind": "llm", "request": {}, "response": None}])


def test_a_cassette_recorded_with_compacted_nested_json_replays_the_same_request():
    # Given a cassette whose request holds a tool call's arguments compacted (as older journals do)
    recorded = {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": '{"city":"Paris"}'}}]}]}
    cassette = Cassette([{"step": "s", "visit": 1, "index": 0, "kind": "llm", "request": recorded,
                          "response": {"text": "sunny"}}])
    # When the code makes the same call with the arguments as the model wrote them
    spaced = {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": '{"city": "Paris"}'}}]}]}
    # Then it is the recorded call; a call with other arguments still is not
    assert cassette.lookup("s", 1, 0, "llm", spaced) == {"text": "sunny"}
    other = {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": '{"city": "Rome"}'}}]}]}
    with pytest.raises(ReplayError):
        cassette.lookup("s", 1, 0, "llm", other)


def test_a_replayed_run_that_fails_journals_its_compensations_without_running_them(db_url, chat):
    # Given a recorded run whose tool loop books a venue (an effect tool), then fails later, so its
    # saga really cancelled the booking in the recorded world
    undone: list[str] = []

    def saga_flow(llm: LLM) -> Workflow:
        tools = ToolRegistry()

        def cancel(tctx, record):
            undone.append(tctx.idempotency_key)

        @tools.tool(effect=True, compensate=cancel)
        def book(venue: str) -> str:
            """Book a venue."""
            ran.append(venue)
            return f"booked {venue}"

        wf = Workflow("replayed-saga")

        @wf.step(start=True, effect=True, compensate=tools.compensate)
        def plan(ctx, state):
            out = run_tool_loop(ctx, llm, [{"role": "user", "content": "book the hall"}], tools)
            return out.update(plan=out.content)  # lists the loop's effect tools, as docs/agents.md shows

        @wf.step()
        def pay(ctx, state):
            raise PermissionError("card declined")

        wf.edge("plan", "pay")
        wf.edge("pay", END)
        return wf

    chat.script([tool_call("book", {"venue": "Hall"}), reply("booked the hall")])
    live = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    wf = saga_flow(live)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        original = orc.run(wf, {}, run_id="rec-saga")
        cassette = Cassette.from_run(orc, "rec-saga")
    chat.stop()
    assert original.status == "compensated" and undone == ["rec-saga:plan:0:tools:0.0:compensate"]
    ran.clear()
    undone.clear()
    # When the run is replayed from its cassette, with the model server gone
    dead = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY, max_attempts=1)
    wf = saga_flow(dead)
    with Orchestrator(db_url, workflows=[wf], replay=cassette) as orc:
        replayed = orc.run(wf, {}, run_id="replay-saga")
        history = orc.history("replay-saga")
    # Then it ends as the recording did, with its compensation journaled as replayed: no tool ran, and
    # nothing was undone in the world a second time
    assert replayed.status == "compensated", replayed.error
    assert ran == [] and undone == [], (ran, undone)
    [completed] = [e["data"] for e in history if e["kind"] == "CompensationCompleted"]
    assert completed["replayed"] is True
