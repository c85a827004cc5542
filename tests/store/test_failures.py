"""The store contract: `store.failures`, failed attempts and the dead-letter status.
Runs on SQLite and on Postgres. The policy (when a run is dead) is tested with the worker, in
tests/scale/test_deadletter.py; here, what each call writes.
"""

from __future__ import annotations

import pytest
from store_helpers import T0, new_run

from store import FencedError, RunNotFoundError


def test_record_keeps_the_failure_and_hands_the_lease_back(store):
    # Given a leased run
    token = new_run(store, "r1", owner="w1")
    # When an attempt fails and asks not to be retried before T0 + 60
    store.failures.record("r1", token=token, now=T0 + 1, owner="w1", error='{"type": "Boom"}',
                          retry_at=T0 + 60)
    # Then the failure is kept, the lease is free and claims wait until T0 + 60
    assert store.failures.for_run("r1") == [(T0 + 1, "w1", "error", '{"type": "Boom"}', 0, "pending")]
    run = store.get_run("r1")
    assert (run.lease_owner, run.lease_expires_at, run.wake_at, run.lease_token) == (None, None, T0 + 60, token)


def test_dead_letter_then_revive_restores_the_status_it_had(store):
    # Given a leased, running run
    token = new_run(store, "r1", owner="w1", status="running")
    # When it is moved to the dead letters
    store.failures.dead_letter("r1", token=token, now=T0 + 1, owner="w1", error="{}", message="gave up")
    run = store.get_run("r1")
    assert (run.status, run.error, run.lease_owner) == ("dead", "gave up", None)
    # Then reviving it puts it back to "running", claimable now, and says so
    assert store.failures.revive("r1", now=T0 + 2, by="ann") == "running"
    run = store.get_run("r1")
    assert (run.status, run.error, run.wake_at) == ("running", None, None)
    assert [row[2] for row in store.failures.for_run("r1")] == ["dead", "retried"]
    # And a run that is not dead is not revived
    assert store.failures.revive("r1", now=T0 + 3, by="ann") is None


def test_failure_writes_with_a_stale_token_are_fenced_and_write_nothing(store):
    # Given a run taken over by a second owner
    old = new_run(store, "r1", owner="w1")
    store.leases.acquire("r1", owner="w2", ttl=30, now=T0 + 1, force=True)
    # When the first owner records a failure or dead-letters it
    with pytest.raises(FencedError):
        store.failures.record("r1", token=old, now=T0 + 2, owner="w1", error="{}")
    with pytest.raises(FencedError):
        store.failures.dead_letter("r1", token=old, now=T0 + 2, owner="w1", error="{}", message="m")
    # Then nothing was written and w2 still holds the lease
    assert store.failures.for_run("r1") == []
    run = store.get_run("r1")
    assert (run.status, run.lease_owner) == ("pending", "w2")


def test_failures_of_an_unknown_run_raise(store):
    with pytest.raises(RunNotFoundError):
        store.failures.for_run("ghost")
    with pytest.raises(RunNotFoundError):
        store.failures.revive("ghost", now=T0, by="ann")
    with pytest.raises(RunNotFoundError):
        store.failures.record("ghost", token=1, now=T0, owner="w", error="{}")
