"""A step that runs again (woken for a later wait, after a crash) takes the path it took before.

A wait that timed out stays timed out: the step that saw ``WaitTimeoutError`` and acted on it
(escalated, then waited again) sees the same when it runs again, even if the signal it gave up on
arrived meanwhile. The timeout is journaled (``WaitTimedOut``) the moment the step is told, as a
received signal is; the late signal answers the next wait. A failure a step caught from a durable
call (a wait's timeout inside it, a builtin error) is raised again as something the same ``except``
catches."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from orchestrator import Orchestrator
from orchestrator.errors import WaitTimeoutError
from workflows import END, Retry, Workflow

sys.path.insert(0, str(Path(__file__).parent))

from timeoutflow import escalate, escalating  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_a_signal_that_comes_after_the_timeout_answers_the_wait_after_the_escalation(db_url):
    calls: list = []
    wf = escalating(lambda ctx, state: calls.append("page") or {"paged": True}, timeout=3600,
                    name="escalate-then-wait")
    now = [10_000.0]
    with Orchestrator(db_url, workflows=[wf], clock=lambda: now[0]) as orc:
        # Given a run whose wait timed out: the step paged the manager and now waits again
        assert orc.run(wf, {}, run_id="esc").status == "waiting"
        now[0] += 3601
        assert [r.status for r in orc.recover()] == ["waiting"]
        assert calls == ["page"]
        # When the approval arrives and wakes the run
        orc.signal("esc", "approval", {"ok": True})
        [result] = orc.recover()
        history = orc.history("esc")
    # Then the step ran the escalation path again from the journal (no second page) and the late
    # approval answered the wait after it
    assert result.status == "completed", result.error
    assert result.state == {"approved": True, "escalated": True}
    assert calls == ["page"]
    kinds = [e["kind"] for e in history]
    assert kinds == ["RunStarted", "WaitStarted", "Resumed", "WaitTimedOut", "CallCompleted", "WaitStarted",
                     "Resumed", "SignalReceived", "StepCompleted", "RunCompleted"]
    timed_out = history[3]["data"]
    assert (timed_out["step"], timed_out["name"], timed_out["timeout_at"]) == ("approve", "approval", 13_600.0)
    assert history[7]["data"].get("index") == 1


DRIVER = """
import sys
sys.path.insert(0, "tests/orchestrator")
from timeoutflow import escalate
from orchestrator import Orchestrator
db, pages = sys.argv[1:]
Orchestrator(db, workflows=[escalate]).run(escalate, {"pages": pages}, run_id="killed")
"""


def test_a_process_killed_after_acting_on_a_timeout_is_resumed_on_the_same_path(db_url, tmp_path):
    pages, stall = tmp_path / "pages", tmp_path / "stall"
    # Given a process whose wait timed out, that paged the manager (journaled) and was then SIGKILLed
    process = subprocess.Popen([sys.executable, "-c", DRIVER, db_url, str(pages)], cwd=ROOT,
                               env={**os.environ, "TIMEOUTFLOW_STALL": str(stall)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        while not stall.exists():  # written once the page is journaled
            assert process.poll() is None, process.communicate(timeout=60)
            threading.Event().wait(0.02)
    finally:
        process.kill()
        process.communicate(timeout=60)
    # When the approval arrives before anyone resumes the run, and it is resumed here
    with Orchestrator(db_url, workflows=[escalate]) as orc:
        orc.signal("killed", "approval", {"ok": True})
        result = orc.resume("killed")  # its owner is dead: taken over at once
        kinds = [e["kind"] for e in orc.history("killed")]
    # Then the step was told of the timeout again, its page came from the journal (one page in the
    # world), and the approval answered the wait after the page
    assert pages.read_text().splitlines() == ["killed"]
    assert kinds.count("WaitTimedOut") == 1 and kinds.count("CallCompleted") == 1
    assert result.status == "completed", result.error
    assert result.state["escalated"] is True and result.state["approved"] is True


def test_a_wait_that_timed_out_inside_a_durable_call_is_told_again_as_a_wait_timeout(db_url):
    # Given a tool (a durable call) that asks a human with a timeout, and a step that, when the tool
    # times out, waits for the answer itself
    wf = Workflow("ask-through-a-tool")

    @wf.step(start=True)
    def ask(ctx, state):
        try:
            answer = ctx.durable_call("ask-human", {"q": "ok?"}, lambda: ctx.wait_for("answer", timeout=60))
            return {"answer": answer, "by": "tool"}
        except WaitTimeoutError as timed_out:
            return {"answer": ctx.wait_for("answer"), "by": "step", "timed_out": timed_out.signal}

    wf.edge("ask", END)
    now = [10_000.0]
    with Orchestrator(db_url, workflows=[wf], clock=lambda: now[0]) as orc:
        assert orc.run(wf, {}, run_id="tool").status == "waiting"
        now[0] += 61
        # When the tool's wait times out (the step now waits itself) and the answer comes later
        assert [r.status for r in orc.recover()] == ["waiting"]
        orc.signal("tool", "answer", "yes")
        [result] = orc.recover()
        failed = [e["data"] for e in orc.history("tool") if e["kind"] == "CallFailed"]
    # Then the call's recorded failure is raised again as the WaitTimeoutError the step catches, and
    # the answer reaches the step's own wait
    assert result.status == "completed", result.error
    assert result.state == {"answer": "yes", "by": "step", "timed_out": "answer"}
    assert [(f["error"]["type"], f["error"]["signal"], f["error"]["timeout_at"]) for f in failed] == [
        ("orchestrator.errors.WaitTimeoutError", "answer", 10_060.0)]


def test_a_builtin_error_a_step_caught_from_a_durable_call_is_caught_again_when_the_step_runs_again(db_url):
    # Given a step that looks a customer up (a durable call raising KeyError: unknown), catches it,
    # then waits for a human to fill the record in
    looked_up: list = []
    wf = Workflow("lookup-then-ask")

    def lookup():
        looked_up.append(1)
        raise KeyError("customer 42")

    @wf.step(start=True)
    def find(ctx, state):
        try:
            return {"customer": ctx.durable_call("lookup", {"id": 42}, lookup)}
        except KeyError as unknown:
            return {"customer": ctx.wait_for("filled-in"), "why": type(unknown).__name__}

    wf.edge("find", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="kv").status == "waiting"
        # When the record is filled in and the step runs again (its lookup's failure is journaled)
        orc.signal("kv", "filled-in", {"name": "Ada"})
        result = orc.resume("kv")
    # Then the journaled KeyError is caught by the same except clause: the step takes the same path,
    # and the lookup was made once
    assert result.status == "completed", result.error
    assert result.state == {"customer": {"name": "Ada"}, "why": "CallFailedError"}
    assert looked_up == [1]


def test_an_abandoned_attempt_that_waits_for_a_signal_neither_takes_it_nor_journals(orc_factory):
    # Given a step with a short timeout whose first attempt blocks past it; the retry waits for "go"
    wf = Workflow("slow-then-wait")
    release, late = threading.Event(), threading.Event()
    met: list[str] = []

    @wf.step(start=True, timeout=0.05, retry=Retry(attempts=2, initial=0.01))
    def work(ctx, state):
        if ctx.attempt == 1:
            release.wait(60)  # blocked past the timeout: abandoned, still running on its thread
            try:
                ctx.wait_for("go")
                met.append("took the signal")
            except BaseException as exc:  # noqa: BLE001 - the test records what the abandoned thread met
                met.append(type(exc).__name__)
            finally:
                late.set()
            return {"by": 1}
        return {"by": ctx.attempt, "go": ctx.wait_for("go")}

    wf.edge("work", END)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="ab").status == "waiting"  # attempt 2 waits; attempt 1 still blocked
    # When the signal is sent, and then the abandoned attempt wakes up and asks for it
    orc.signal("ab", "go", {"n": 1})
    before = len(orc.history("ab"))
    release.set()
    assert late.wait(60)
    # Then it was refused: nothing journaled, the signal still pending for the live attempt
    assert met == ["StepTimeoutError"]
    assert len(orc.history("ab")) == before
    assert len(orc.store.signals.pending("ab", "go")) == 1
    # And the run, resumed, gives the signal to the attempt that waits for it
    result = orc.resume("ab")
    assert result.status == "completed", result.error
    assert result.state == {"by": 2, "go": {"n": 1}}


def test_an_abandoned_effect_attempt_is_refused_its_key_and_journals_no_key_issued(orc_factory):
    # Given an effect step with a short timeout whose first attempt blocks past it before reading its key
    wf = Workflow("slow-key")
    release, late = threading.Event(), threading.Event()
    met: list[str] = []

    @wf.step(start=True, effect=True, timeout=0.05, resend=False)
    def charge(ctx, state):
        release.wait(60)
        try:
            met.append(ctx.idempotency_key)  # (to send it with a client of its own)
        except BaseException as exc:  # noqa: BLE001 - the test records what the abandoned thread met
            met.append(type(exc).__name__)
        finally:
            late.set()
        return {"charged": True}

    wf.edge("charge", END)
    orc = orc_factory(wf)
    result = orc.run(wf, {}, run_id="key")
    before = [e["kind"] for e in orc.history("key")]
    # When the abandoned attempt wakes up and reads its key
    release.set()
    assert late.wait(60)
    # Then it is refused, and nothing more is journaled (no KeyIssued after the step was given up)
    assert met == ["StepTimeoutError"]
    assert [e["kind"] for e in orc.history("key")] == before
    assert "KeyIssued" not in before and result.status == "failed"
