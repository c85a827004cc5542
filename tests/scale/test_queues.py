"""Enqueueing runs for workers, and an in-process worker driving them (both backends)."""

from __future__ import annotations

import logging
import threading

import pytest

from orchestrator import ConfigurationError, Orchestrator, RunStateError, WorkflowNotFoundError
from orchestrator.engine.loader import load_target
from orchestrator.scale import Worker
from workflows import END, Workflow

from .conftest import HANG, journal_problems, target, wait_for


def counter() -> Workflow:
    wf = Workflow("count")

    @wf.step(start=True)
    def one(ctx, state):
        return {"n": state.get("n", 0) + 1}

    @wf.step()
    def two(ctx, state):
        return {"n": state["n"] + 1}

    wf.edge("one", "two")
    wf.edge("two", END)
    return wf


def test_a_dedup_key_starts_a_run_exactly_once(db_url):
    wf = counter()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When the same logical start is enqueued twice
        first = orc.enqueue(wf, {"n": 1}, dedup_key="order-42", queue="orders", priority=5)
        again = orc.enqueue(wf, {"n": 99}, dedup_key="order-42")
        # Then the second returns the first run and nothing else was created
        assert again == first
        assert [r.run_id for r in orc.list_runs()] == [first]
        rec = orc.get_run(first)
        assert (rec.status, rec.queue, rec.priority, rec.dedup_key) == ("pending", "orders", 5, "order-42")
        # And a chosen run id is exactly-once too
        assert orc.enqueue(wf, {}, run_id="r-1") == "r-1" == orc.enqueue(wf, {}, run_id="r-1")
        assert len(orc.list_runs()) == 2


def test_bad_enqueue_arguments_are_clear_errors_and_write_nothing(db_url):
    wf = counter()
    other = Workflow("other")

    @other.step(start=True)
    def only(ctx, state):
        return {}

    other.edge("only", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        for kwargs, words in [({"queue": ""}, "queue name"), ({"queue": "a=b"}, "queue name"),
                              ({"priority": "high"}, "priority"), ({"dedup_key": ""}, "dedup_key")]:
            with pytest.raises(ConfigurationError, match=words):
                orc.enqueue(wf, {}, **kwargs)
        orc.enqueue(wf, {}, run_id="taken")
        with pytest.raises(RunStateError, match="already exists for workflow 'count'"):
            orc.enqueue(other, {}, run_id="taken")
        assert len(orc.list_runs()) == 1


def test_a_worker_drives_enqueued_runs_and_each_journal_has_one_writer_per_lease(db_url, thread_worker):
    wf = counter()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        ids = [orc.enqueue(wf, {"n": i}) for i in range(12)]
        # When a worker with three slots runs
        tw = thread_worker(Worker(db_url, [wf], concurrency=3, lease_ttl=10))
        wait_for(lambda: orc.store.count_by_status().get("completed") == 12, timeout=HANG, what="12 runs completed")
        tw.stop()
        # Then every run completed once, each append under the lease of the Resumed before it
        for i, run_id in enumerate(ids):
            res = orc.result(run_id)
            assert res.status == "completed" and res.state["n"] == i + 2
            history = orc.history(run_id)
            assert journal_problems(history) == []
            [resumed] = [e for e in history if e["kind"] == "Resumed"]
            assert resumed["data"]["lease"] == 1
        assert tw.worker.counts["completed"] == 12


def test_a_worker_serves_only_its_queues(db_url, thread_worker):
    wf = counter()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        mine = [orc.enqueue(wf, {}, queue="mine") for _ in range(3)]
        theirs = [orc.enqueue(wf, {}, queue="theirs") for _ in range(2)]
        unqueued = orc.start(wf, {})
        tw = thread_worker(Worker(db_url, [wf], queues=["mine"], concurrency=2))
        wait_for(lambda: all(orc.get_run(r).status == "completed" for r in mine), timeout=HANG, what="queue 'mine'")
        tw.stop()
        assert {orc.get_run(r).status for r in theirs + [unqueued]} == {"pending"}
        # And a worker serving every queue takes the rest, runs with no queue included
        tw = thread_worker(Worker(db_url, [wf], concurrency=2))
        wait_for(lambda: orc.store.count_by_status() == {"completed": 6}, timeout=HANG, what="all runs")
        tw.stop()


def test_a_run_whose_workflow_cannot_be_imported_is_left_for_another_worker(db_url, tmp_path, thread_worker, caplog):
    # Given a run of a workflow defined in a file this worker will not find
    module = tmp_path / "elsewhere.py"
    module.write_text("from workflows import Workflow, END\nwf = Workflow('elsewhere')\n"
                      "@wf.step(start=True)\ndef only(ctx, state):\n    return {'done': True}\nwf.edge('only', END)\n")
    wf = load_target(f"{module}:wf")
    with Orchestrator(db_url, workflows=[wf]) as orc:
        run_id = orc.enqueue(wf, {})
        module.rename(tmp_path / "moved.py")
        # When a worker without that code claims it
        with caplog.at_level(logging.ERROR, logger="agentsaga.worker"):
            tw = thread_worker(Worker(db_url, [counter()], concurrency=1, skip_for=60))
            wait_for(lambda: tw.worker.counts["skipped"] >= 1, timeout=HANG, what="the worker to give the run up")
            tw.stop()
        # Then the run is neither failed nor held: it waits for a worker that has the code
        rec = orc.get_run(run_id)
        assert rec.status == "pending" and rec.lease_owner is None
        assert "left for another worker" in caplog.text and "elsewhere" in caplog.text
        assert tw.worker.counts["skipped"] == 1  # and it did not spin on it
        # And a worker that has the workflow completes it
        tw = thread_worker(Worker(db_url, [wf], concurrency=1))
        wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="the other worker")
        tw.stop()


def test_worker_settings_are_checked_at_start(db_url):
    with pytest.raises(ConfigurationError, match="concurrency"):
        Worker(db_url, concurrency=0)
    with pytest.raises(ConfigurationError, match="queues is empty"):
        Worker(db_url, queues=[])
    with pytest.raises(ConfigurationError, match="queue name"):
        Worker(db_url, queues=["ok", " padded"])
    with pytest.raises(ConfigurationError, match="heartbeat"):
        Worker(db_url, lease_ttl=3, heartbeat=3)
    with pytest.raises(ConfigurationError, match="poll"):
        Worker(db_url, poll=0)
    with pytest.raises(WorkflowNotFoundError, match="no attribute 'no_such_flow'"):
        Worker(db_url, [target("no_such_flow")])


def test_a_worker_wakes_runs_on_their_timer_and_on_a_signal(db_url, thread_worker):
    wf = Workflow("patient")

    @wf.step(start=True)
    def nap(ctx, state):
        ctx.sleep(0.3)  # durable timer: the run parks, its lease goes
        return {"napped": True}

    @wf.step()
    def approve(ctx, state):
        return {"approved_by": ctx.wait_for("approval")["by"]}

    wf.edge("nap", "approve")
    wf.edge("approve", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        run_id = orc.enqueue(wf, {})
        tw = thread_worker(Worker(db_url, [wf], concurrency=1, poll=30))
        # When the timer is due the worker drives the run on, until it waits for a person, and
        # gives its lease up (parking and releasing are two writes: the status shows first)
        wait_for(lambda: orc.result(run_id).state.get("napped") and orc.get_run(run_id).status == "waiting"
                 and orc.get_run(run_id).lease_owner is None, timeout=HANG, what="the run to wait for approval")
        # And a signal from anywhere wakes it (on Postgres through NOTIFY, on SQLite by polling)
        orc.signal(run_id, "approval", {"by": "ann"})
        wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="the approved run")
        tw.stop()
        assert orc.result(run_id).state["approved_by"] == "ann"
        assert journal_problems(orc.history(run_id)) == []


def test_a_stopping_worker_hands_a_sync_step_back_at_its_next_boundary(db_url, thread_worker):
    # Given two runs inside a sync step, which nothing can interrupt: it ends when the test says
    gate = threading.Event()
    inside: list[str] = []
    wf = Workflow("held")

    @wf.step(start=True)
    def first(ctx, state):
        inside.append(ctx.run_id)
        assert gate.wait(HANG)
        return {"first": True}

    @wf.step()
    def second(ctx, state):
        return {"second": True}

    wf.edge("first", "second")
    wf.edge("second", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        ids = [orc.enqueue(wf, {}) for _ in range(2)]
        tw = thread_worker(Worker(db_url, [wf], concurrency=2, drain=0))
        wait_for(lambda: sorted(inside) == sorted(ids), timeout=HANG, what="both runs inside their first step")
        # When the worker is stopped, and the steps end only once it has asked both runs to stop
        # (the moment is the worker's heartbeat marking them lost; ending the steps before it
        # would let a run go on to its next step)
        tw.worker.stop()
        heartbeat = tw.worker.orc.engine.heartbeat
        wait_for(lambda: all(heartbeat.lost(r) for r in ids), timeout=HANG, what="the worker to stop the runs")
        gate.set()
        tw.thread.join(HANG)
        assert not tw.thread.is_alive()
        # Then each step's result was kept, and the run handed back before its next step
        assert (tw.worker.counts["handed_back"], tw.worker.counts["completed"]) == (2, 0)
        for run_id in ids:
            assert orc.get_run(run_id).lease_owner is None
            assert [e["data"]["step"] for e in orc.history(run_id) if e["kind"] == "StepCompleted"] == ["first"]
        # And another worker finishes them from there, without taking them over
        tw = thread_worker(Worker(db_url, [wf], concurrency=2))
        wait_for(lambda: orc.store.count_by_status() == {"completed": 2}, timeout=HANG, what="both runs")
        tw.stop()
        for run_id in ids:
            history = orc.history(run_id)
            assert journal_problems(history) == []
            assert [e["data"]["step"] for e in history if e["kind"] == "StepCompleted"] == ["first", "second"]
            assert orc.get_run(run_id).recoveries == 0


def test_a_queued_run_a_worker_is_driving_shows_running(db_url, thread_worker):
    # Given an enqueued run whose step waits on the test inside a worker
    gate = threading.Event()
    inside = threading.Event()
    wf = Workflow("shown")

    @wf.step(start=True)
    def work(ctx, state):
        inside.set()
        assert gate.wait(HANG)
        return {"done": True}

    wf.edge("work", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        run_id = orc.enqueue(wf, {})
        assert orc.get_run(run_id).status == "pending"
        tw = thread_worker(Worker(db_url, [wf], concurrency=1))
        wait_for(inside.is_set, timeout=HANG, what="the run inside its step")
        # When it is read while the worker drives it
        row = orc.get_run(run_id)
        listed = [r.run_id for r in orc.list_runs(status="running")]
        gate.set()
        wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="the run to complete")
        tw.stop()
        # Then it was 'running', held by the worker, and a listing of running runs had it
        assert (row.status, row.lease_owner is not None) == ("running", True)
        assert listed == [run_id]


def test_a_run_whose_changed_code_this_worker_refuses_is_left_for_another_worker(db_url, thread_worker):
    # Given a run interrupted after its first step, whose workflow refuses changed step code
    def flow(answer: int) -> Workflow:
        wf = Workflow("refusing", on_code_change="refuse")
        if answer == 1:
            def first(ctx, state):
                return {"a": 1}
        else:
            def first(ctx, state):
                return {"a": 2}  # a changed body

        def second(ctx, state):
            if state.get("stop"):
                raise KeyboardInterrupt  # the process dies here (a BaseException user code does not catch)
            return {"b": 1}

        wf.step(first)
        wf.step(second)
        return wf

    old = flow(1)
    with Orchestrator(db_url, workflows=[old], lease_ttl=0.5) as orc:
        with pytest.raises(KeyboardInterrupt):
            orc.run(old, {"stop": True}, run_id="cc1")
        # When a worker with the new code claims it once its lease lapsed
        tw = thread_worker(Worker(db_url, [flow(2)], concurrency=1, skip_for=60, lease_ttl=5))
        wait_for(lambda: tw.worker.counts["skipped"] >= 1, timeout=HANG, what="the worker to give the run up")
        tw.stop()
        # Then it was left for another worker: not a failed recovery, not dead, not held
        assert (tw.worker.counts["skipped"], tw.worker.counts["failed_recoveries"], tw.worker.counts["dead"]) == (1, 0, 0)
        rec = orc.get_run("cc1")
        assert rec.status == "running" and rec.lease_owner is None
