"""Dead-letter: runs whose recovery keeps failing go `dead`, are listed, and can be retried by hand."""

from __future__ import annotations

import json

from orchestrator import Orchestrator, RunStateError
from orchestrator.engine import ACTIVE_STATUSES
from orchestrator.scale import Worker
from orchestrator.cli import main
from store import NewEvent

from .conftest import HANG, wait_for
from .test_queues import counter


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def corrupt(orc: Orchestrator, run_id: str) -> None:
    """Append an event kind no code knows: every attempt to restore the run raises."""
    token = orc.store.leases.acquire(run_id, owner="vandal", ttl=1, now=orc.engine.config.clock())
    orc.store.append(run_id, [NewEvent(2, "FromTheFuture", "{}", orc.engine.config.clock())], token=token,
                     now=orc.engine.config.clock())
    orc.store.leases.release(run_id, token=token, now=orc.engine.config.clock())


def test_a_run_that_fails_every_recovery_goes_dead_and_can_be_retried(db_url, thread_worker, capsys):
    wf = counter()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        healthy = orc.enqueue(wf, {})
        broken = orc.enqueue(wf, {})
        corrupt(orc, broken)
        # When a worker that allows one failed recovery meets it
        tw = thread_worker(Worker(db_url, [wf], concurrency=2, max_failures=1))
        # Then the first failure is recorded and retried after a backoff, the second makes it dead
        wait_for(lambda: orc.get_run(broken).status == "dead", timeout=HANG, what="the run to go dead")
        tw.stop()
        rec = orc.get_run(broken)
        assert rec.lease_owner is None
        assert rec.error.startswith("dead after 2 failed recoveries (more than 1)")
        assert "unknown event kind 'FromTheFuture'" in rec.error
        kinds = [f["kind"] for f in orc.dead_letters(broken)]
        assert kinds == ["error", "dead"]
        assert orc.dead_letters(broken)[-1]["status"] == "pending"
        # And the healthy run was not held up
        assert orc.get_run(healthy).status == "completed"
    # And `runs --status dead` lists it, `retry` puts it back as it was
    assert main(["runs", "--db", db_url, "--status", "dead", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["run_id"] for r in listed] == [broken] and "FromTheFuture" in listed[0]["error"]
    assert main(["retry", broken, "--db", db_url]) == 0
    assert "is pending again" in capsys.readouterr().out
    with Orchestrator(db_url, workflows=[wf]) as orc:
        rec = orc.get_run(broken)
        assert (rec.status, rec.error, rec.wake_at) == ("pending", None, None)
        assert [f["kind"] for f in orc.dead_letters(broken)] == ["error", "dead", "retried"]
        # And retrying a run that is not dead is refused, naming its status
        try:
            orc.retry_dead(healthy)
        except RunStateError as exc:
            assert "is completed, not dead" in str(exc)
        else:
            raise AssertionError("retry_dead accepted a completed run")
    assert main(["retry", healthy, "--db", db_url]) == 1
    assert "not dead" in capsys.readouterr().err


def test_a_run_whose_workers_keep_dying_goes_dead_on_the_next_claim(db_url, thread_worker):
    # Given a run whose lease was taken over three times (each of its workers died holding it)
    clock = Clock(1_800_000_000.0)
    wf = counter()
    with Orchestrator(db_url, workflows=[wf], clock=clock) as orc:
        run_id = orc.enqueue(wf, {})
        for owner in ("w1", "w2", "w3", "w4"):
            [(claimed, _)] = orc.store.queues.claim(owner=owner, ttl=5, now=clock(), statuses=ACTIVE_STATUSES)
            assert claimed == run_id
            clock.now += 6
        assert orc.get_run(run_id).recoveries == 3
        # When a worker allowing three failed recoveries claims it (its own takeover is the fourth)
        tw = thread_worker(Worker(Orchestrator(db_url, workflows=[wf], clock=clock), max_failures=3))
        wait_for(lambda: orc.get_run(run_id).status == "dead", timeout=HANG, what="the run to go dead")
        tw.stop()
        tw.worker.orc.close()
        # Then it is dead, and says why, without having been driven
        rec = orc.get_run(run_id)
        assert "dead after 4 failed recoveries (more than 3)" in rec.error
        assert "taken over 4 times" in rec.error
        assert [e["kind"] for e in orc.history(run_id)] == ["RunStarted"]
        # And after a retry its count starts over: the next worker drives it to the end
        assert orc.retry_dead(run_id) == "pending"
        tw = thread_worker(Worker(Orchestrator(db_url, workflows=[wf], clock=clock), max_failures=3))
        wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="the retried run")
        tw.stop()
        tw.worker.orc.close()
