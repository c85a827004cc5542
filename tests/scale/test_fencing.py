"""A worker paused (SIGSTOP) past its lease: another worker takes the run over, and when the paused
one wakes up (SIGCONT) its late append is refused by the store (fencing, invariant 6)."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target

from .conftest import HANG, journal_problems, stopped, target, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_a_paused_worker_is_fenced_out_and_the_run_finishes_once(pg_url, service, workers, tmp_path):
    slow = load_target(target("slow"))
    gate = tmp_path / "gate"
    with Orchestrator(pg_url, workflows=[slow]) as orc:
        run_id = orc.enqueue(slow, {"api": service.url, "gate": str(gate)})
        procs = workers(pg_url)
        args = ("--concurrency", "1", "--lease-ttl", "1.5")
        a, log_a = procs.start(target("slow"), args=args)
        # Given worker A inside the effect step, its request answered and journaled; the step then
        # waits on a gate that opens only once A is paused (so A cannot finish first, however fast)
        wait_for(lambda: any(e["kind"] == "CallCompleted" for e in orc.history(run_id)), timeout=HANG,
                 what="A's journaled booking")
        # When A is paused past its lease, and worker B takes the run over and finishes it
        a.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: stopped(a), timeout=HANG, what="A to stop")
            gate.touch()
            procs.start(target("slow"), args=args)
            wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="B to finish the run")
        finally:
            a.send_signal(signal.SIGCONT)
        # Then A, awake again, finishes its step and has its append refused
        wait_for(lambda: "lease lost" in log_a.read_text(), timeout=HANG, what="A's fenced append")
        text = log_a.read_text()
        assert "FencedError" in text and "lease token 1 is stale, the current token is 2" in text
        assert a.poll() is None  # A keeps working: losing a lease is not a crash
        # And the journal shows the step completed once, under B's lease, after B resumed
        history = orc.history(run_id)
        assert journal_problems(history) == []
        assert [e["data"]["lease"] for e in history if e["kind"] == "Resumed"] == [1, 2]
        [done] = [e for e in history if e["kind"] == "StepCompleted"]
        assert done["data"]["lease"] == 2
        assert orc.result(run_id).state["flight"] == "flight-1"
        # And B reused the response A had journaled (ctx.http requests are durable calls)
        calls = [e for e in history if e["kind"] == "CallCompleted" and e["data"]["kind"] == "http"]
        assert len(calls) == 1
    # And the service booked once, and was not even asked again
    actions = Counter(e["action"] for e in service.ledger())
    assert actions["book"] == 1 and actions["replay"] == 0
