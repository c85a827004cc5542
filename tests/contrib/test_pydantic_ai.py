"""pydantic-ai agents made durable by agentsaga (orchestrator.contrib.pydantic_ai), on SQLite and Postgres.

The agent (tests/contrib/agentflow.py) runs on pydantic-ai's offline FunctionModel and writes what
the outside world would see (model requests answered, tools run, bookings undone) to a ledger file
outside the database. Crash tests run it in a child process that SIGKILLs itself, and resume it in
another fresh process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI"):
    import pydantic_ai  # noqa: F401  CI installs the extra (.ci/run): its absence is a failure there
pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed: pip install -e '.[pydantic-ai]'")

sys.path.insert(0, str(Path(__file__).parent))

import agentflow  # noqa: E402
from agentflow import read_ledger, trip  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402

FLOW = Path(__file__).parent / "agentflow.py"
BOOK = {"prompt": "book a trip to Lisbon"}


@pytest.fixture
def ledger(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTSAGA_TEST_LEDGER", str(path))
    monkeypatch.delenv("AGENTSAGA_TEST_KILL", raising=False)
    return path


def child(db_url: str, run_id: str, verb: str, *args: str, kill: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AGENTSAGA_TEST_KILL"}
    if kill:
        env["AGENTSAGA_TEST_KILL"] = kill
    return subprocess.run([sys.executable, str(FLOW), db_url, run_id, verb, *args], env=env,
                          capture_output=True, text=True, timeout=180)


def outcome(done: subprocess.CompletedProcess) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def calls(db_url: str, run_id: str) -> list[tuple[str, str, bool]]:
    """The run's journaled durable calls: (kind, model or tool, replaced)."""
    with Orchestrator(db_url, workflows=[trip]) as orc:
        return [(e["data"]["kind"], e["data"]["request"].get("tool") or e["data"]["request"].get("model"),
                 bool(e["data"].get("replaced")))
                for e in orc.history(run_id) if e["kind"] == "CallCompleted"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=120)


def assert_verifies(db_url: str, run_id: str) -> None:
    done = cli("verify", run_id, "--db", db_url)
    assert done.returncode == 0, done.stdout + done.stderr


def uninterrupted(tmp_path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The same run, under the same id, in a database of its own and never killed."""
    env_ledger = os.environ["AGENTSAGA_TEST_LEDGER"]
    os.environ["AGENTSAGA_TEST_LEDGER"] = str(tmp_path / "uninterrupted.jsonl")
    try:
        return outcome(child(f"sqlite:///{tmp_path}/uninterrupted.db", "trip-1", "run", json.dumps(state)))
    finally:
        os.environ["AGENTSAGA_TEST_LEDGER"] = env_ledger


# -- crashes -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_during_the_second_model_request_resumes_without_repeating_the_first_or_its_tool(
        db_url, ledger, tmp_path):
    # Given a run whose process is SIGKILLed during its second model request, after the first
    # request and the tool call it asked for were journaled
    killed = child(db_url, "trip-1", "run", json.dumps({"prompt": "weather in Lisbon?"}), kill="model:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert read_ledger(str(ledger)) == [["model", 1, "weather in Lisbon?"], ["tool", "weather", "Lisbon"]]
    assert calls(db_url, "trip-1") == [("llm", "function:function:trip_model:", False), ("tool", "weather", False)]
    # When a fresh process resumes it
    resumed = outcome(child(db_url, "trip-1", "resume"))
    # Then the first request and the weather tool were not performed again; only the second request was
    assert resumed["status"] == "completed", resumed
    assert read_ledger(str(ledger)) == [["model", 1, "weather in Lisbon?"], ["tool", "weather", "Lisbon"],
                                        ["model", 2, "weather in Lisbon?"], ["pay"]]
    # And the journal holds each call once, none replaced: the resumed first request matched the journaled
    # one although pydantic-ai stamped new timestamps and run ids on it
    assert calls(db_url, "trip-1") == [("llm", "function:function:trip_model:", False), ("tool", "weather", False),
                                       ("llm", "function:function:trip_model:", False)]
    # And the final output equals an uninterrupted run's
    assert resumed["state"]["answer"] == uninterrupted(tmp_path, {"prompt": "weather in Lisbon?"})["state"]["answer"]
    assert resumed["state"]["answer"] == "answer to 'weather in Lisbon?' from weather=\"sunny in Lisbon\""
    assert_verifies(db_url, "trip-1")


@pytest.mark.slow
def test_two_tool_calls_in_one_response_killed_after_the_first_run_the_second_only(db_url, ledger, tmp_path):
    # Given a model answer asking for two bookings, and a process SIGKILLed when the second starts
    killed = child(db_url, "trip-1", "run", json.dumps(BOOK), kill="tool:book_car")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    first = read_ledger(str(ledger), pids=True)
    assert [e[:3] for e in first] == [["model", 1, BOOK["prompt"]], ["tool", "weather", "Lisbon"],
                                      ["model", 2, BOOK["prompt"]], ["tool", "book_hotel", "Lisbon"]]
    # When a fresh process resumes the run
    resumed = outcome(child(db_url, "trip-1", "resume"))
    # Then the hotel (journaled before the crash) was not booked again; the car was booked once, then
    # the model answered: tools of one response run in the order the model gave them
    entries = read_ledger(str(ledger), pids=True)
    assert [e[:2] for e in entries[:-1]] + [entries[-1][:1]] == [["model", 1], ["tool", "weather"], ["model", 2], ["tool", "book_hotel"],
                                        ["tool", "book_car"], ["model", 3], ["pay"]]
    hotel, car = entries[3], entries[4]
    # And each booking carried its own key, built from the run, the step, its position and its tool call id
    assert hotel[3] == "trip-1:plan:0:trip:3:h1" and car[3] == "trip-1:plan:0:trip:4:c1"
    # And the deps the car booking saw were made by the resuming process (deps are never journaled)
    assert car[4] == car[-1] != hotel[-1] and hotel[4] == hotel[-1]
    assert resumed["status"] == "completed" and resumed["state"]["answer"] == uninterrupted(tmp_path, BOOK)["state"]["answer"]
    assert_verifies(db_url, "trip-1")


@pytest.mark.slow
def test_a_crash_during_the_first_model_request_of_an_effect_step_resumes_it_rather_than_leaving_it_in_doubt(
        db_url, ledger):
    # Given an effect step whose agent run (with a run id of the caller's) is SIGKILLed during its
    # first model request, before any call was journaled
    state = {"prompt": "weather in Lisbon?", "agent_run_id": "my-agent-run"}
    killed = child(db_url, "trip-1", "run", json.dumps(state), kill="model:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert read_ledger(str(ledger)) == []
    # When a fresh process resumes it
    resumed = outcome(child(db_url, "trip-1", "resume"))
    # Then the step ran again (the agent's keys had been issued), and each call was made once
    assert resumed["status"] == "completed", resumed
    assert [e[0] for e in read_ledger(str(ledger))] == ["model", "tool", "model", "pay"]
    assert_verifies(db_url, "trip-1")


# -- sagas -----------------------------------------------------------------------------------------------
def test_two_effect_tools_are_compensated_newest_first_when_a_later_step_fails(db_url, ledger):
    # Given an agent step that booked a hotel and then a car, and a payment step that fails for good
    with Orchestrator(db_url, workflows=[trip]) as orc:
        result = orc.run(trip, {**BOOK, "decline": True}, run_id="trip-1")
    # Then the run is compensated: the car is cancelled first, then the hotel, each once, each with
    # the key its booking was sent with plus ":compensate", and deps from the capability's factory
    assert result.status == "compensated", result.error
    cancels = [e for e in read_ledger(str(ledger)) if e[0] == "cancel"]
    assert cancels == [["cancel", "book_car", "trip-1:plan:0:trip:4:c1", "trip-1:plan:0:trip:4:c1:compensate", "LIS"],
                       ["cancel", "book_hotel", "trip-1:plan:0:trip:3:h1", "trip-1:plan:0:trip:3:h1:compensate", "LIS"]]
    assert_verifies(db_url, "trip-1")


def test_effect_tools_are_undone_even_when_the_agent_step_itself_fails_after_them(db_url, ledger, monkeypatch):
    # Given an agent whose step fails after both bookings (its third model request raises)
    monkeypatch.setattr(agentflow, "OUTAGE_AT", 3)
    with Orchestrator(db_url, workflows=[trip]) as orc:
        result = orc.run(trip, BOOK, run_id="trip-1")
        failed = [e["data"] for e in orc.history("trip-1") if e["kind"] == "CallFailed"]
    # Then the failed model request is journaled, and each booking was undone on its own, newest first
    assert result.status == "compensated", result.error
    assert [f["kind"] for f in failed] == ["llm"] and "model outage" in failed[0]["error"]["message"]
    assert [e[1] for e in read_ledger(str(ledger)) if e[0] == "cancel"] == ["book_car", "book_hotel"]
    assert_verifies(db_url, "trip-1")


# -- changed and unchanged requests ---------------------------------------------------------------------
def test_a_step_that_runs_again_with_the_same_prompt_pays_for_nothing(db_url, ledger):
    # Given a run whose agent step finished its agent run and then waited for a signal
    with Orchestrator(db_url, workflows=[trip]) as orc:
        parked = orc.run(trip, {**BOOK, "wait": True}, run_id="trip-1")
        assert parked.status == "waiting"
        before = read_ledger(str(ledger))
        # When the signal arrives and the step runs again from its first line
        orc.signal("trip-1", "go", {})
        result = orc.resume("trip-1")
    # Then no model request and no tool ran again: every request matched the journal
    assert result.status == "completed", result.error
    assert read_ledger(str(ledger)) == [*before, ["pay"]]
    assert not any(replaced for _, _, replaced in calls(db_url, "trip-1"))
    assert_verifies(db_url, "trip-1")


def test_a_changed_prompt_makes_the_request_run_again_visibly(db_url, ledger, monkeypatch):
    # Given a run parked after its agent ran with one prompt
    with Orchestrator(db_url, workflows=[trip]) as orc:
        assert orc.run(trip, {"prompt": "weather in Lisbon?", "wait": True}, run_id="trip-1").status == "waiting"
        # When the prompt changed in the code before the step runs again
        monkeypatch.setattr(agentflow, "PROMPT_SUFFIX", ", in Celsius")
        orc.signal("trip-1", "go", {})
        result = orc.resume("trip-1")
    changed = "weather in Lisbon?, in Celsius"
    # Then the new request was performed (the model answered it) and journaled as replacing the old one
    assert result.status == "completed", result.error
    models = [e for e in read_ledger(str(ledger)) if e[0] == "model"]
    assert models == [["model", 1, "weather in Lisbon?"], ["model", 2, "weather in Lisbon?"],
                      ["model", 1, changed], ["model", 2, changed]]
    journaled = calls(db_url, "trip-1")
    assert [c for c in journaled if c[2]] == [("llm", "function:function:trip_model:", True),
                                              ("llm", "function:function:trip_model:", True)]
    # And the tool call between them, asked again with the same id and arguments, came from the journal
    assert [e for e in read_ledger(str(ledger)) if e[0] == "tool"] == [["tool", "weather", "Lisbon"]]
    assert changed in result.state["answer"]
    assert_verifies(db_url, "trip-1")


# -- transparency, audit ----------------------------------------------------------------------------------
def test_outside_a_step_the_same_agent_runs_normally(ledger):
    # Given the durable agent, used outside any agentsaga step (no Orchestrator, no database)
    result = agentflow.agent.run_sync("weather in Lisbon?", deps=agentflow.make_deps(None))
    # Then it runs as a plain pydantic-ai agent
    assert result.output == "answer to 'weather in Lisbon?' from weather=\"sunny in Lisbon\""
    assert [e[0] for e in read_ledger(str(ledger))] == ["model", "tool", "model"]


def test_show_history_and_report_name_the_model_requests_and_tool_calls(db_url, ledger, tmp_path):
    # Given a completed run of the agent
    with Orchestrator(db_url, workflows=[trip]) as orc:
        assert orc.run(trip, BOOK, run_id="trip-1").status == "completed"
    # When it is read with the CLI, which imports no user code
    history = cli("history", "trip-1", "--db", db_url)
    show = cli("show", "trip-1", "--db", db_url)
    report = cli("report", "trip-1", "--db", db_url, "--html", str(tmp_path / "r.html"))
    # Then history names each model request and tool call, with its request and response
    assert history.returncode == 0, history.stderr
    assert "plan call 0 (llm function:function:trip_model:" in history.stdout
    assert "plan call 3 (tool book_hotel" in history.stdout and "plan call 4 (tool book_car" in history.stdout
    assert '"tool":"book_car","call_id":"c1","arguments":{"city":"Lisbon"}' in history.stdout
    # And show lists the journaled calls, marking the effect tools
    assert show.returncode == 0, show.stderr
    calls_section = show.stdout.split("CALLS (6 journaled)")[1].split("EFFECTS")[0]
    rows = [line.split() for line in calls_section.strip().splitlines()[1:]]
    assert [(r[3], r[4]) for r in rows] == [("llm", "function:function:trip_model:"), ("tool", "weather"),
                                            ("llm", "function:function:trip_model:"), ("tool", "book_hotel"),
                                            ("tool", "book_car"), ("llm", "function:function:trip_model:")]
    assert [r[-1] for r in rows if r[-1] == "effect"] == ["effect", "effect"]
    # And the report's call table has them too
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert "book_hotel" in html and "book_car" in html and "function:function:trip_model:" in html
    assert_verifies(db_url, "trip-1")


# -- streaming ---------------------------------------------------------------------------------------------
def test_a_streamed_answer_is_journaled_whole_and_not_streamed_again_when_the_step_runs_again(db_url):
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from orchestrator.contrib.pydantic_ai import AgentsagaDurability
    from workflows import END, Workflow

    asked: list[str] = []
    live: list[str] = []

    async def stream(messages, info):
        asked.append("request")
        for word in ["hello ", "streamed ", "world"]:
            yield word

    async def handler(ctx, events):  # sees the model's events live, inside the durable call
        async for event in events:
            live.append(type(event).__name__)

    agent = Agent(FunctionModel(stream_function=stream), name="streamer",
                  capabilities=[AgentsagaDurability(event_stream_handler=handler)])
    flow = Workflow("streaming")

    @flow.step(start=True)
    async def talk(ctx, state):
        async with agent.run_stream("hi") as streamed:
            text = await streamed.get_output()
        ctx.wait_for("go")
        return {"text": text}

    flow.edge("talk", END)
    # Given a step that streamed an answer, then waited
    with Orchestrator(db_url, workflows=[flow]) as orc:
        assert orc.run(flow, {}, run_id="s1").status == "waiting"
        assert asked == ["request"] and live.count("PartDeltaEvent") == 2
        # When the step runs again after the signal
        orc.signal("s1", "go", {})
        result = orc.resume("s1")
        journaled = [e["data"] for e in orc.history("s1") if e["kind"] == "CallCompleted"]
    # Then the model was not asked again and nothing was streamed again: the journaled response came back whole
    assert result.status == "completed" and result.state["text"] == "hello streamed world"
    assert asked == ["request"] and live.count("PartDeltaEvent") == 2
    assert [c["kind"] for c in journaled] == ["llm"]
    assert journaled[0]["response"]["parts"][0]["content"] == "hello streamed world"


# -- the public surface and the example ---------------------------------------------------------------
def test_the_package_exports_exactly_its_pinned_names():
    import orchestrator.contrib.pydantic_ai as package

    assert sorted(package.__all__) == ["AgentsagaDurability", "ToolCallContext", "VOLATILE", "tool_context"]
    assert all(hasattr(package, name) for name in package.__all__)


def test_nothing_else_in_orchestrator_imports_pydantic_ai():
    # Given a fresh interpreter importing every other orchestrator package
    code = ("import sys, orchestrator, orchestrator.engine, orchestrator.agents, orchestrator.audit, "
            "orchestrator.scale, orchestrator.cli, orchestrator.contrib, orchestrator.testing; "
            "print([m for m in sys.modules if m.split('.')[0] == 'pydantic_ai'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # Then pydantic-ai was not loaded: the extra is optional
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.slow
def test_the_example_resumes_a_killed_agent_and_undoes_its_bookings_when_payment_fails(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "pydantic_agent.py"
    done = subprocess.run([sys.executable, str(example), "--decline", "--db", f"sqlite:///{tmp_path}/ex.db"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "killed by signal 9" in done.stdout and "status compensated" in done.stdout
    lines = done.stdout.split("(the ledger):")[1].strip().splitlines()
    assert [line.split()[:3] for line in lines[:-1]] == [
        ["model", "request", "1"], ["tool", "weather", "Lisbon"], ["model", "request", "2"],
        ["tool", "book_hotel", "Lisbon"], ["tool", "book_car", "Lisbon"], ["model", "request", "3"],
        ["cancel", "book_car", "car-lisbon"], ["cancel", "book_hotel", "hotel-lisbon"]]


def test_an_effect_tool_sends_its_key_with_tool_context_http_and_its_undo_sends_key_compensate(db_url):
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from orchestrator.contrib.pydantic_ai import AgentsagaDurability, tool_context
    from orchestrator.testing import BookingService
    from workflows import END, Workflow

    with BookingService() as service:
        def undo(tctx, record):
            tctx.http.delete(f"{service.url}/hotels/{record['result']['id']}")

        durability = AgentsagaDurability(effects={"book": undo})
        agent = Agent(TestModel(), name="booker", capabilities=[durability])

        @agent.tool_plain
        def book(city: str) -> dict:
            return tool_context().http.post(f"{service.url}/hotels", json={"city": city}).json()

        flow = Workflow("http-booking")

        @flow.step(start=True, effect=True, compensate=durability.compensate)
        async def reserve(ctx, state):
            return {"out": (await agent.run("book a hotel")).output}

        @flow.step()
        def pay(ctx, state):
            raise RuntimeError("card declined")

        flow.edge("reserve", "pay")
        flow.edge("pay", END)
        # Given an agent whose effect tool books through tool_context().http, and a payment that fails
        with Orchestrator(db_url, workflows=[flow]) as orc:
            result = orc.run(flow, {}, run_id="h1")
        ledger = service.ledger()
    # Then the service saw the booking with the tool call's key, and its cancellation with key:compensate
    assert result.status == "compensated", result.error
    key = "h1:reserve:0:booker:1:pyd_ai_tool_call_id__book"
    assert [(e["action"], e["idempotency_key"]) for e in ledger] == [("book", key), ("cancel", f"{key}:compensate")]
    assert_verifies(db_url, "h1")


def test_a_tool_that_asked_the_model_to_retry_asks_again_from_the_journal_when_the_step_runs_again(db_url):
    # Given an agent whose tool refuses an unknown city with ModelRetry (pydantic-ai then tells the
    # model, which asks again with another city), in a step that then waits for a signal
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from orchestrator.contrib.pydantic_ai import AgentsagaDurability
    from workflows import END, Workflow

    looked_up: list[str] = []

    def model(messages, info):
        answered = sum(1 for m in messages if isinstance(m, ModelResponse))
        if answered == 0:
            return ModelResponse(parts=[ToolCallPart("weather", {"city": "Atlantis"}, tool_call_id="w1")])
        if answered == 1:
            return ModelResponse(parts=[ToolCallPart("weather", {"city": "Lisbon"}, tool_call_id="w2")])
        got = [p.content for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(f"weather: {got}")])

    agent = Agent(FunctionModel(model), name="retrying", capabilities=[AgentsagaDurability()])

    @agent.tool_plain
    def weather(city: str) -> str:
        looked_up.append(city)
        if city == "Atlantis":
            raise ModelRetry("no such city, pick a real one")
        return f"sunny in {city}"

    wf = Workflow("model-retry")

    @wf.step(start=True)
    async def ask(ctx, state):
        result = await agent.run("weather?")
        ctx.wait_for("go")
        return {"answer": result.output}

    wf.edge("ask", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="mr").status == "waiting"
        # When the signal wakes the step and it runs again from its first line
        orc.signal("mr", "go", {})
        result = orc.resume("mr")
    # Then the journaled refusal came back as ModelRetry, pydantic-ai told the model as it had, and
    # the run completed with the same answer; no tool ran again
    assert result.status == "completed", result.error
    assert result.state["answer"] == "weather: ['no such city, pick a real one', 'sunny in Lisbon']"
    assert looked_up == ["Atlantis", "Lisbon"]
