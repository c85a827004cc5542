"""The lease heartbeat renews every held lease in one round, and marks the ones taken over as lost.
Runs on SQLite and on Postgres, with an injected clock (no waiting for the heartbeat's thread)."""

from __future__ import annotations

from orchestrator.engine.events import ACTIVE_STATUSES
from orchestrator.engine.leases import Heartbeat
from orchestrator.testing import FakeClock
from store import NewEvent, open_store


def test_one_round_renews_the_held_leases_and_marks_a_taken_over_run_lost(db_url):
    # Given three runs leased to this process, one of which another worker has since taken over
    clock = FakeClock()
    store = open_store(db_url)
    try:
        tokens = {}
        for run_id in ("a", "b", "c"):
            tokens[run_id] = store.create_run(
                run_id=run_id, workflow="wf", version="1", fingerprint="fp", target="{}", created_at=clock.now,
                events=[NewEvent(1, "RunStarted", "{}", clock.now)], lease_owner="me", lease_ttl=30)
        clock.advance(31)
        [(claimed, _token)] = store.queues.claim(owner="other", ttl=30, now=clock.now, statuses=ACTIVE_STATUSES,
                                                 limit=1)
        taken = [r for r in ("a", "b", "c") if store.get_run(r).lease_owner == "other"]
        assert taken == [claimed]
        beat = Heartbeat(store, ttl=30, clock=clock.clock)
        for run_id, token in tokens.items():
            beat.hold(run_id, token)
        beat.stop()  # the thread is not needed: this test drives the rounds itself
        # When one round of renewals runs
        beat.renew_all()
        # Then the runs still held are leased to now + ttl, and only the taken-over one is lost
        for run_id in ("a", "b", "c"):
            rec = store.get_run(run_id)
            if run_id in taken:
                assert beat.lost(run_id) and rec.lease_owner == "other"
            else:
                assert not beat.lost(run_id)
                assert (rec.lease_owner, rec.lease_expires_at) == ("me", clock.now + 30)
    finally:
        store.close()
