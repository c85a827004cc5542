"""Starting a run whose create committed but whose reply was lost (the `lost_reply` fixture,
tests/conftest.py): the store's retry finds the run it wrote, and the run goes on as if nothing
had happened."""

from __future__ import annotations

import random

from orchestrator import Orchestrator
from workflows import END, Workflow


def test_run_without_an_id_whose_create_reply_was_lost_completes(lost_reply, fake_time):
    # Given a two-step workflow, and a network that will lose the reply to the run's create
    wf = Workflow("lost-create")

    @wf.step(start=True)
    def first(ctx, state):
        return {"first": state["n"] + 1}

    @wf.step()
    def second(ctx, state):
        return {"second": state["first"] * 2}

    wf.edge("first", "second")
    wf.edge("second", END)
    orc = Orchestrator(lost_reply.url, workflows=[wf], clock=fake_time.clock, sleep=fake_time.sleep,
                       rng=random.Random(7), store_options={"retry_for": 30})
    try:
        lost_reply.arm(orc.store, "insert")
        # When running it without naming the run (the id is generated: nobody else can hold it)
        result = orc.run(wf, {"n": 1})
        # Then the lost reply did not make it a duplicate: the run completed, once, with one start
        assert lost_reply.ate
        assert (result.status, result.state["second"]) == ("completed", 4)
        assert [r.run_id for r in orc.store.list_runs(limit=None)] == [result.run_id]
        kinds = [e.kind for e in orc.store.events(result.run_id)]
        assert kinds.count("RunStarted") == 1
        assert kinds.count("StepCompleted") == 2
        assert orc.store.get_run(result.run_id).lease_owner is None  # released at the end
    finally:
        orc.close()
