"""Durable calls, signals and timers inside steps, on a real store (SQLite and Postgres)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from freezegun import freeze_time

from orchestrator import Orchestrator, RunStateError, WaitTimeoutError
from workflows import END, Workflow


class Stop(BaseException):
    """Stands for the process dying here."""


def kinds(orc, run_id):
    return [e["kind"] for e in orc.history(run_id)]


def paid_call_workflow(counter: list, stop_after_call: bool = False) -> Workflow:
    wf = Workflow("paid")

    @wf.step(start=True)
    def think(ctx, state):
        def perform():
            counter.append(1)  # a request the provider bills
            return {"text": f"answer to {state['q']}", "tokens": 42}

        reply = ctx.durable_call("llm", {"model": "m", "prompt": state["q"]}, perform)
        if stop_after_call:
            raise Stop
        return {"reply": reply["text"]}

    wf.edge("think", END)
    return wf


def test_a_completed_call_is_not_performed_again_when_the_step_reruns(db_url):
    # Given a step that dies after its paid call returned
    paid: list = []
    with Orchestrator(db_url, workflows=[paid_call_workflow(paid, stop_after_call=True)]) as orc:
        with pytest.raises(Stop):
            orc.run(orc.workflows.get("paid"), {"q": "why"}, run_id="d1")
        assert kinds(orc, "d1") == ["RunStarted", "CallCompleted"]
    # When another process resumes it
    with Orchestrator(db_url, workflows=[paid_call_workflow(paid)]) as orc:
        result = orc.resume("d1")
        history = orc.history("d1")
    # Then the model was called once, and the step used the journaled response
    assert len(paid) == 1
    assert result.state == {"q": "why", "reply": "answer to why"}
    [call] = [e["data"] for e in history if e["kind"] == "CallCompleted"]
    assert call["response"]["tokens"] == 42 and call["index"] == 0 and call["step"] == "think"


def test_a_changed_request_is_performed_anew_when_the_step_opts_in(db_url):
    paid: list = []
    with Orchestrator(db_url, workflows=[paid_call_workflow(paid, stop_after_call=True)]) as orc:
        with pytest.raises(Stop):
            orc.run(orc.workflows.get("paid"), {"q": "why"}, run_id="d2")
    # When the step resumes asking something else (its code or prompt changed)
    changed = Workflow("paid")

    @changed.step(name="think", start=True)
    def think(ctx, state):
        return {"reply": ctx.durable_call("llm", {"model": "m", "prompt": "other"},
                                          lambda: paid.append(1) or {"text": "new"}, if_changed="perform")["text"]}

    changed.edge("think", END)
    with Orchestrator(db_url, workflows=[changed]) as orc:
        result = orc.resume("d2")
    assert len(paid) == 2 and result.state["reply"] == "new"


def approval_workflow(timeout: float | None = None) -> Workflow:
    wf = Workflow("approve")

    @wf.step(start=True)
    def ask(ctx, state):
        decision = ctx.wait_for("approval", timeout=timeout)
        return {"approved": decision["ok"], "by": decision["by"]}

    @wf.step()
    def timed_out(ctx, state):
        return {"approved": False, "by": "timeout"}

    wf.edge("ask", END)
    wf.edge("timed_out", END)
    object.__setattr__(wf.steps["ask"], "on_failure", "timed_out")
    return wf


def test_wait_for_parks_the_run_and_a_signal_from_elsewhere_continues_it(db_url):
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # Given a run that waits for approval
        result = orc.run(wf, {}, run_id="w1")
        assert result.status == "waiting"
        rec = orc.get_run("w1")
        assert rec.status == "waiting" and rec.lease_owner is None
        # And recovery leaves it alone while nothing arrived
        assert orc.recover() == []
    # When another Orchestrator (another process, in real life) sends the signal
    with Orchestrator(db_url, workflows=[wf]) as other:
        other.signal("w1", "approval", {"ok": True, "by": "ana"})
        [done] = other.recover()
    # Then the run continues and completes with the signal's data
    assert done.status == "completed" and done.state == {"approved": True, "by": "ana"}
    with Orchestrator(db_url, workflows=[wf]) as orc:
        history = kinds(orc, "w1")
    assert history.count("WaitStarted") == 1 and history.count("SignalReceived") == 1


def test_a_signal_sent_before_the_wait_is_not_lost(db_url):
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        run_id = orc.start(wf, {})
        orc.signal(run_id, "approval", {"ok": False, "by": "early"})
        result = orc.resume(run_id)
    assert result.status == "completed" and result.state["by"] == "early"


def test_signals_to_finished_runs_are_refused_and_others_are_kept_until_a_step_waits_for_them(db_url):
    wf = approval_workflow()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="w3")
        # A signal no step waits for yet is kept, not refused (a later step may wait for it), and it
        # wakes nothing: the run still waits for its approval
        orc.signal("w3", "payment", {})
        assert orc.recover() == []
        assert [s[1] for s in orc.store.signals.pending("w3")] == ["payment"]
        orc.signal("w3", "approval", {"ok": True, "by": "x"})
        orc.recover()
        before = orc.store.last_seq("w3")
        with pytest.raises(RunStateError, match="completed"):
            orc.signal("w3", "approval", {"ok": True, "by": "late"})
        assert orc.store.last_seq("w3") == before


def test_a_wait_times_out_and_takes_the_failure_route(db_url):
    wf = approval_workflow(timeout=3600)
    now = [10_000.0]
    with Orchestrator(db_url, workflows=[wf], clock=lambda: now[0]) as orc:
        assert orc.run(wf, {}, run_id="w4").status == "waiting"
        now[0] += 3599
        assert orc.recover() == []
        now[0] += 2
        [result] = orc.recover()
    assert result.status == "completed" and result.state == {"approved": False, "by": "timeout"}


def test_a_step_catches_wait_timeout_error_and_completes_without_the_signal(db_url):
    # Given a step that waits an hour for approval and, as the docs show, catches the timeout
    wf = Workflow("approve-or-not")

    @wf.step(start=True)
    def ask(ctx, state):
        try:
            decision = ctx.wait_for("approval", timeout=3600)
        except WaitTimeoutError as timed_out:
            return {"approved": False, "signal": timed_out.signal, "step": timed_out.step,
                    "timeout_at": timed_out.timeout_at, "is_timeout": isinstance(timed_out, TimeoutError)}
        return {"approved": decision["ok"]}

    wf.edge("ask", END)
    now = [10_000.0]
    with Orchestrator(db_url, workflows=[wf], clock=lambda: now[0]) as orc:
        assert orc.run(wf, {}, run_id="w5").status == "waiting"
        # When the hour passes without a signal and the run is recovered
        now[0] += 3601
        [result] = orc.recover()
        history = orc.history("w5")
    # Then the step completed with what it returned from the except clause; the error named the wait
    assert result.status == "completed"
    assert result.state == {"approved": False, "signal": "approval", "step": "ask", "timeout_at": 13_600.0,
                            "is_timeout": True}
    # And the journal reads: the wait with its deadline, the resume, the timeout the step was told of,
    # the step's update, the end
    assert [e["kind"] for e in history] == ["RunStarted", "WaitStarted", "Resumed", "WaitTimedOut", "StepCompleted",
                                            "RunCompleted"]
    assert history[1]["data"]["timeout_at"] == 13_600.0
    assert (history[3]["data"]["name"], history[3]["data"]["timeout_at"]) == ("approval", 13_600.0)
    assert history[4]["data"]["update"]["approved"] is False


def test_an_uncaught_wait_timeout_fails_the_step_with_a_message_naming_the_wait(db_url):
    # Given a step that waits with a timeout and does not catch it, without a failure route
    wf = Workflow("approve-strict")

    @wf.step(start=True)
    def ask(ctx, state):
        return {"decision": ctx.wait_for("approval", timeout=60)}

    wf.edge("ask", END)
    now = [1_800_000_000.0]
    with Orchestrator(db_url, workflows=[wf], clock=lambda: now[0]) as orc:
        orc.run(wf, {}, run_id="w6")
        # When the deadline passes
        now[0] += 61
        [result] = orc.recover()
        history = orc.history("w6")
    # Then the run failed at that step, and the journal's error names the step, the signal and the deadline
    assert result.status == "failed"
    [failed] = [e["data"] for e in history if e["kind"] == "StepFailed"]
    assert failed["error"]["type"] == "orchestrator.errors.WaitTimeoutError"
    assert failed["error"]["message"] == (
        "step 'ask' waited for signal 'approval' until its timeout (2027-01-15T08:01:00+00:00) passed; "
        "catch WaitTimeoutError in the step to go on without it")
    assert history[-1]["kind"] == "RunFailed"


def test_durable_sleep_survives_a_restart_with_frozen_time(db_url):
    wf = Workflow("nap")

    @wf.step(start=True)
    def remind(ctx, state):
        ctx.sleep(24 * 3600)
        return {"reminded_at": ctx.now().isoformat()}

    wf.edge("remind", END)
    with freeze_time("2026-11-22 10:00:00") as frozen:
        with Orchestrator(db_url, workflows=[wf]) as orc:
            assert orc.run(wf, {}, run_id="s1").status == "waiting"
        frozen.tick(23 * 3600)
        with Orchestrator(db_url, workflows=[wf]) as orc:  # a new process, an hour early
            assert orc.recover() == []
        frozen.tick(3600)
        with Orchestrator(db_url, workflows=[wf]) as orc:
            [result] = orc.recover()
    assert result.status == "completed" and result.state["reminded_at"].startswith("2026-11-23T10:00:00")


def test_agentsaga_signal_from_another_process(db_url, tmp_path):
    flow = tmp_path / "approve_flow.py"
    flow.write_text(
        "from workflows import Workflow, END\n"
        "wf = Workflow('approve-cli')\n"
        "@wf.step(start=True)\n"
        "def ask(ctx, state):\n"
        "    return {'decision': ctx.wait_for('approval')}\n"
        "wf.edge('ask', END)\n")
    exe = str(Path(sys.executable).parent / "agentsaga") if (Path(sys.executable).parent / "agentsaga").exists() \
        else shutil.which("agentsaga")
    env = {k: v for k, v in os.environ.items() if k != "AGENTSAGA_DB"}
    started = subprocess.run([exe, "run", f"{flow}:wf", "--run-id", "cli-w", "--db", db_url], capture_output=True,
                             text=True, env=env, timeout=60)
    assert "status waiting" in started.stdout, started.stderr
    sent = subprocess.run([exe, "signal", "cli-w", "approval", "--data", '{"ok": true}', "--db", db_url],
                          capture_output=True, text=True, env=env, timeout=60)
    assert sent.returncode == 0, sent.stderr
    done = subprocess.run([exe, "recover", "--app", str(flow), "--db", db_url, "--json"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert '"decision": {"ok": true}' in done.stdout, done.stderr


def test_a_retry_reuses_the_calls_of_the_failed_attempt(db_url):
    from workflows import Retry

    paid: list = []
    wf = Workflow("retry-paid")

    @wf.step(start=True, retry=Retry(attempts=2, initial=0, jitter=0))
    def think(ctx, state):
        reply = ctx.durable_call("llm", {"prompt": "p"}, lambda: paid.append(1) or {"text": "t"})
        if ctx.attempt == 1:
            raise ValueError("the tool after the model call failed")
        return {"reply": reply["text"]}

    wf.edge("think", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="rp")
    assert result.status == "completed" and len(paid) == 1


def test_permanent_tool_errors_are_not_retried(db_url):
    from orchestrator import PermanentToolError
    from workflows import Retry

    tries: list = []
    wf = Workflow("auth")

    @wf.step(start=True, retry=Retry(attempts=4, initial=0, jitter=0))
    def call(ctx, state):
        tries.append(1)
        raise PermanentToolError("401 Unauthorized: check the API key", status=401)

    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="pe")
    assert result.status == "failed" and len(tries) == 1 and "401" in result.error


def test_a_call_whose_response_was_null_is_not_performed_again(db_url):
    # Given a step whose durable call returned None, then the process died
    performed: list = []
    dying = [True]
    wf = Workflow("null-call")

    @wf.step(start=True)
    def notify(ctx, state):
        ctx.durable_call("email", {"to": "ana"}, lambda: performed.append(1))  # returns None
        if dying.pop() if dying else False:
            raise Stop
        return {"sent": True}

    wf.edge("notify", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        with pytest.raises(Stop):
            orc.run(wf, {}, run_id="n1")
        # When the run resumes
        result = orc.resume("n1")
    # Then the email was sent once: a null response is still a journaled response
    assert result.status == "completed" and len(performed) == 1


def test_a_request_that_is_not_a_json_object_is_refused_at_the_call(db_url):
    # Given a step passing a list of messages as a durable call's request
    wf = Workflow("listy")
    performed = []

    @wf.step(start=True)
    def ask(ctx, state):
        return {"r": ctx.durable_call("llm", [{"role": "user", "content": "hi"}], lambda: performed.append(1))}

    wf.edge("ask", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="l1")
        journal = kinds(orc, "l1")
    # Then the step fails saying what to do, nothing was performed, and nothing odd was journaled
    assert result.status == "failed" and "must be a JSON object" in result.error and "wrap it" in result.error
    assert performed == [] and "CallCompleted" not in journal


def test_current_step_names_the_running_step_wherever_its_function_runs(sqlite_url):
    from orchestrator.engine import current_step

    seen: dict[str, object] = {}
    flow = Workflow("current-step")

    def undo(ctx, effect):
        seen["compensation"] = current_step()

    @flow.step(start=True, effect=True, compensate=undo)
    async def on_the_loop(ctx, state):
        seen["async"] = current_step() is ctx
        return {}

    @flow.step()
    def inline(ctx, state):
        seen["sync"] = current_step() is ctx
        return {}

    @flow.step(timeout=30)
    def on_a_thread(ctx, state):
        seen["thread"] = current_step() is ctx
        raise RuntimeError("fail, so the first step is compensated")

    flow.edge("on_the_loop", "inline")
    flow.edge("inline", "on_a_thread")
    flow.edge("on_a_thread", END)
    # Given steps run on the event loop, inline, and on a thread of their own (a timeout)
    with Orchestrator(sqlite_url, workflows=[flow]) as orc:
        result = orc.run(flow, {})
    # Then each saw its own context as the current step; a compensation and code outside saw none
    assert result.status == "compensated"
    assert seen == {"async": True, "sync": True, "thread": True, "compensation": None}
    assert current_step() is None


def test_a_calls_usage_block_is_journaled_unchanged_and_a_nested_secret_is_not(db_url):
    # Given a step whose durable call answers with a usage block and a secret nested in its body
    response = {"usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
                "body": {"choices": [{"message": {"content": "ok", "tool_calls": [{"function": {
                    "name": "lookup", "arguments": '{"city": "Paris", "password": "hunter2-nested"}'}}]}}],
                         "account": {"owner": "ann", "settings": {"refresh_token": "rt-nested-secret"}}}}
    wf = Workflow("usage")

    @wf.step(name="ask", start=True)
    async def ask(ctx, state):
        got = await ctx.adurable_call("llm", {"messages": ["hi"], "params": {"max_tokens": 64}},
                                      lambda: dict(response))
        return {"usage": got["usage"], "owner": got["body"]["account"]["owner"]}

    wf.edge("ask", END)
    # When it runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="u1")
        [call] = [e["data"] for e in orc.history("u1") if e["kind"] == "CallCompleted"]
    # Then the usage block and the request's max_tokens are journaled as they were
    assert result.status == "completed"
    assert call["response"]["usage"] == response["usage"] == result.state["usage"]
    assert call["request"] == {"messages": ["hi"], "params": {"max_tokens": 64}}
    # And the nested secrets are not: a field at depth, and a field inside a tool call's JSON arguments
    body = call["response"]["body"]
    assert body["account"] == {"owner": "ann", "settings": {"refresh_token": "[REDACTED]"}}
    arguments = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"city": "Paris", "password": "[REDACTED]"}


def test_a_request_journaled_with_its_nested_json_compacted_is_the_same_request(db_url):
    # Given a call journaled the way earlier versions wrote it: JSON nested in a string, compacted
    paid: list = []

    def asking(arguments: str, stop: bool) -> Workflow:
        wf = Workflow("nested")

        @wf.step(name="think", start=True)
        def think(ctx, state):
            def perform():
                paid.append(arguments)
                return {"text": "sunny"}

            messages = [{"role": "assistant", "tool_calls": [{"function": {"arguments": arguments}}]}]
            reply = ctx.durable_call("llm", {"messages": messages}, perform)
            if stop:
                raise Stop
            return {"reply": reply["text"]}

        wf.edge("think", END)
        return wf

    with Orchestrator(db_url, workflows=[asking('{"city":"Paris"}', stop=True)]) as orc, pytest.raises(Stop):
        orc.run(orc.workflows.get("nested"), {}, run_id="n1")
    # When the step runs again with the same arguments as the model wrote them (spaced)
    with Orchestrator(db_url, workflows=[asking('{"city": "Paris"}', stop=False)]) as orc:
        result = orc.resume("n1")
    # Then it is the journaled call, not a changed one: answered from the journal, paid once
    assert result.status == "completed" and result.state == {"reply": "sunny"}
    assert paid == ['{"city":"Paris"}']
