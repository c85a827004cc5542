"""The store contract: `store.leases` and fencing (invariant 6). Runs on SQLite and on Postgres.

Times are explicit `now` values: the store never reads the clock, so expiry is exact.
"""

from __future__ import annotations

import pytest
from store_helpers import T0, ev, new_run

from store import FencedError, LeaseHeldError, RunNotFoundError


def test_acquire_free_lease_increments_token(store):
    # Given a run that was never leased (token 0)
    new_run(store, "r1", owner=None)
    # When a worker acquires it, setting a status
    token = store.leases.acquire("r1", owner="w1", ttl=10, now=T0 + 5, status="running")
    # Then it gets token 1, expiring now + ttl, and this is not a recovery
    run = store.get_run("r1")
    assert token == 1
    assert (run.lease_owner, run.lease_token, run.lease_expires_at) == ("w1", 1, T0 + 15)
    assert (run.status, run.updated_at, run.recoveries) == ("running", T0 + 5, 0)


def test_acquire_held_lease_raises_lease_held(store):
    # Given a lease held by w1 until T0 + 30
    new_run(store, "r1", owner="w1", ttl=30)
    # When w2 tries to acquire it one second before expiry
    with pytest.raises(LeaseHeldError, match="w1") as raised:
        store.leases.acquire("r1", owner="w2", ttl=10, now=T0 + 29)
    # Then the error names owner and expiry, and nothing changed
    assert (raised.value.owner, raised.value.expires_at) == ("w1", T0 + 30)
    run = store.get_run("r1")
    assert (run.lease_owner, run.lease_token) == ("w1", 1)


def test_acquire_expired_lease_counts_a_recovery(store):
    # Given a lease held by w1 that expires at T0 + 30, never released
    new_run(store, "r1", owner="w1", ttl=30)
    # When w2 acquires it exactly at expiry
    token = store.leases.acquire("r1", owner="w2", ttl=10, now=T0 + 30)
    # Then w2 holds token 2, and the run has been recovered once
    run = store.get_run("r1")
    assert token == 2
    assert (run.lease_owner, run.lease_expires_at, run.recoveries) == ("w2", T0 + 40, 1)


def test_acquire_after_release_is_not_a_recovery(store):
    token = new_run(store, "r1", owner="w1")
    store.leases.release("r1", token=token, now=T0 + 1)
    assert store.leases.acquire("r1", owner="w2", ttl=10, now=T0 + 2) == token + 1
    assert store.get_run("r1").recoveries == 0


def test_force_takeover_fences_the_old_owner(store):
    # Given w1 holds a live lease
    old = new_run(store, "r1", owner="w1", ttl=30)
    # When w2 takes it over by force, before expiry
    new = store.leases.acquire("r1", owner="w2", ttl=30, now=T0 + 1, force=True)
    # Then the token moved on, and every write by w1 is fenced while w2's succeed
    assert new == old + 1
    assert store.get_run("r1").lease_owner == "w2"
    with pytest.raises(FencedError):
        store.append("r1", [ev(2)], token=old, now=T0 + 2)
    with pytest.raises(FencedError):
        store.leases.renew("r1", token=old, ttl=30, now=T0 + 2)
    with pytest.raises(FencedError):
        store.leases.release("r1", token=old, now=T0 + 2)
    with pytest.raises(FencedError):
        store.wakeups.park("r1", token=old, wake_at=T0 + 99, now=T0 + 2)
    store.append("r1", [ev(2)], token=new, now=T0 + 2)
    assert [e.seq for e in store.events("r1")] == [1, 2]
    assert store.get_run("r1").lease_owner == "w2"


def test_taking_a_parked_runs_lease_unparks_it_so_claims_find_it_if_the_new_owner_dies(store):
    # Given a run parked until a signal comes (wake_at far ahead), its lease released
    token = new_run(store, "r1", owner="w1", ttl=30)
    store.wakeups.park("r1", token=token, wake_at=1e18, now=T0 + 1, release=True)
    # When a process takes its lease (a resume, a rollback) and dies holding it
    store.leases.acquire("r1", owner="w2", ttl=10, now=T0 + 2, force=True, status="running")
    # Then the run is no longer parked: once the lease expires, a claim takes it
    assert store.get_run("r1").wake_at is None
    assert store.queues.claim(owner="w3", ttl=10, now=T0 + 13) == [("r1", 3)]


def test_renew_extends_the_lease(store):
    # Given a lease expiring at T0 + 30
    token = new_run(store, "r1", ttl=30)
    # When renewed at T0 + 25 for 30 s
    store.leases.renew("r1", token=token, ttl=30, now=T0 + 25)
    # Then it expires at T0 + 55, so another worker cannot take it at T0 + 40
    assert store.get_run("r1").lease_expires_at == T0 + 55
    with pytest.raises(LeaseHeldError):
        store.leases.acquire("r1", owner="w2", ttl=10, now=T0 + 40)


def test_release_frees_the_lease_and_keeps_the_token(store):
    # Given w1 holds the lease
    token = new_run(store, "r1", owner="w1", status="running")
    # When it releases with a status and error
    store.leases.release("r1", token=token, now=T0 + 3, status="suspended", error="waiting")
    # Then owner and expiry are cleared, token unchanged, status and error set
    run = store.get_run("r1")
    assert (run.lease_owner, run.lease_expires_at, run.lease_token) == (None, None, token)
    assert (run.status, run.error, run.updated_at) == ("suspended", "waiting", T0 + 3)


def test_release_and_renew_with_stale_token_change_nothing(store):
    # Given a run leased twice over (token 2)
    new_run(store, "r1", owner="w1", ttl=30)
    current = store.leases.acquire("r1", owner="w2", ttl=30, now=T0 + 30)
    # When the stale token 1 tries to renew and release
    with pytest.raises(FencedError) as renew:
        store.leases.renew("r1", token=1, ttl=100, now=T0 + 31)
    with pytest.raises(FencedError):
        store.leases.release("r1", token=1, now=T0 + 31, status="failed")
    # Then w2's lease is intact
    assert (renew.value.token, renew.value.current_token) == (1, current)
    run = store.get_run("r1")
    assert (run.lease_owner, run.lease_expires_at, run.status) == ("w2", T0 + 60, "pending")


def test_lease_operations_on_unknown_run_raise_run_not_found(store):
    with pytest.raises(RunNotFoundError):
        store.leases.acquire("ghost", owner="w", ttl=1, now=T0)
    with pytest.raises(RunNotFoundError):
        store.leases.acquire("ghost", owner="w", ttl=1, now=T0, force=True)
    with pytest.raises(RunNotFoundError):
        store.leases.renew("ghost", token=1, ttl=1, now=T0)
    with pytest.raises(RunNotFoundError):
        store.leases.release("ghost", token=1, now=T0)


def test_renew_many_extends_every_current_lease_and_names_the_lost_ones(store):
    # Given three runs leased by w1, one since taken over by w2, and a run id that does not exist
    for run_id in ("r1", "r2", "r3"):
        new_run(store, run_id, owner="w1", ttl=30)
    store.leases.acquire("r2", owner="w2", ttl=30, now=T0 + 30)
    # When w1 renews all its leases at once at T0 + 20
    lost = store.leases.renew_many({"r1": 1, "r2": 1, "r3": 1, "ghost": 1}, ttl=30, now=T0 + 20)
    # Then the two it still holds run to T0 + 50, and the taken-over and missing runs are reported lost
    assert lost == ["r2", "ghost"]
    assert [store.get_run(r).lease_expires_at for r in ("r1", "r3")] == [T0 + 50, T0 + 50]
    # And w2's lease is untouched
    run = store.get_run("r2")
    assert (run.lease_owner, run.lease_token, run.lease_expires_at) == ("w2", 2, T0 + 60)


def test_renew_many_of_many_runs_spans_several_statements(store):
    # Given more runs than one renewal statement carries
    ids = [f"r{i}" for i in range(1203)]
    for run_id in ids:
        new_run(store, run_id, owner="w1", ttl=30)
    # When they are renewed at once
    lost = store.leases.renew_many(dict.fromkeys(ids, 1), ttl=100, now=T0 + 1)
    # Then none is lost and every one was extended
    assert lost == []
    assert {store.get_run(r).lease_expires_at for r in ids} == {T0 + 101}


def test_renew_many_of_nothing_and_bad_ttl(store):
    assert store.leases.renew_many({}, ttl=30, now=T0) == []
    with pytest.raises(ValueError, match="ttl"):
        store.leases.renew_many({"r1": 1}, ttl=0, now=T0)


def test_tokens_reads_the_current_token_of_many_runs_at_once(store):
    # Given three runs leased by w1, one since taken over by w2
    for run_id in ("r1", "r2", "r3"):
        new_run(store, run_id, owner="w1", ttl=30)
    store.leases.acquire("r2", owner="w2", ttl=30, now=T0 + 30)
    # When their tokens are read together with a run id that does not exist (and a repeated one)
    tokens = store.leases.tokens(["r1", "r2", "r3", "ghost", "r1"])
    # Then each existing run has its current token, the taken-over one its new token, and the missing one is absent
    assert tokens == {"r1": 1, "r2": 2, "r3": 1}


def test_tokens_of_many_runs_spans_several_statements_and_of_nothing_is_empty(store):
    # Given more runs than one statement names
    ids = [f"r{i}" for i in range(1203)]
    for run_id in ids:
        new_run(store, run_id, owner="w1", ttl=30)
    store.leases.acquire("r1202", owner="w2", ttl=30, now=T0 + 30)
    # When their tokens are read at once
    tokens = store.leases.tokens(ids)
    # Then every run is answered, the last one (in the last chunk) with its new token
    assert len(tokens) == 1203 and tokens["r1202"] == 2 and tokens["r0"] == 1
    assert store.leases.tokens([]) == {}


def wait_until_renewal_waits_on_a_lock(libpq: str) -> None:
    """Readiness, not timing: poll Postgres until a lease renewal is waiting for a row lock."""
    import time

    import psycopg

    with psycopg.connect(libpq, autocommit=True) as watcher:
        deadline = time.monotonic() + 120
        while not watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                  " AND query LIKE 'UPDATE agentsaga_runs SET lease_expires_at%'").fetchone()[0]:
            assert time.monotonic() < deadline, "the renewal never waited for a row lock"
            time.sleep(0.01)


@pytest.mark.postgres
def test_renew_many_takes_its_rows_in_run_id_order_as_a_group_commit_does(pg_url):
    # Given runs a..z leased by w1 (made z first, so the table's own order is the reverse), and
    # another transaction (a group commit's, which locks its runs in run id order) holding run m
    import string
    import threading

    import psycopg

    from store import open_store

    store = open_store(pg_url)
    ids = list(reversed(string.ascii_lowercase))
    for run_id in ids:
        new_run(store, run_id, owner="w1", ttl=30)
    libpq = "postgresql://" + pg_url.split("://", 1)[1]
    group = psycopg.connect(libpq)
    group.execute("SELECT 1 FROM agentsaga_runs WHERE run_id = 'm' FOR NO KEY UPDATE")
    # When the heartbeat renews them all in a thread of its own
    renewed: list[list[str]] = []
    heartbeat = threading.Thread(target=lambda: renewed.append(
        store.leases.renew_many(dict.fromkeys(ids, 1), ttl=30, now=T0 + 10)))
    heartbeat.start()
    wait_until_renewal_waits_on_a_lock(libpq)
    # Then it waits at m holding none after it: the group can still take n..z, as its run id order
    # says it will (two transactions locking in one order cannot deadlock)
    group.execute("SET lock_timeout = '1s'")
    group.execute("SELECT 1 FROM agentsaga_runs WHERE run_id > 'm' ORDER BY run_id FOR NO KEY UPDATE")
    group.rollback()
    group.close()
    heartbeat.join(120)
    assert renewed == [[]]
    store.close()


@pytest.mark.postgres
def test_a_store_write_chosen_as_a_deadlock_victim_is_run_again(pg_url):
    # Given runs a and b leased by w1, and another transaction that holds b and will not give up
    # first when a deadlock forms (its deadlock_timeout is long: the store's session detects it)
    import threading

    import psycopg

    from store import open_store

    store = open_store(pg_url)
    for run_id in ("a", "b"):
        new_run(store, run_id, owner="w1", ttl=30)
    libpq = "postgresql://" + pg_url.split("://", 1)[1]
    other = psycopg.connect(libpq)
    other.execute("SET deadlock_timeout = '60s'")
    other.execute("SELECT 1 FROM agentsaga_runs WHERE run_id = 'b' FOR NO KEY UPDATE")
    # When the heartbeat renews a and b (taking a, then waiting for b) ...
    renewed: list[object] = []

    def renew() -> None:
        try:
            renewed.append(store.leases.renew_many({"a": 1, "b": 1}, ttl=30, now=T0 + 10))
        except Exception as exc:  # noqa: BLE001 (the assertion below shows it)
            renewed.append(exc)

    heartbeat = threading.Thread(target=renew)
    heartbeat.start()
    wait_until_renewal_waits_on_a_lock(libpq)
    # ... and the other transaction then asks for a: a deadlock, whose victim is the renewal
    other.execute("SELECT 1 FROM agentsaga_runs WHERE run_id = 'a' FOR NO KEY UPDATE")
    other.rollback()
    other.close()
    heartbeat.join(120)
    # Then the renewal was rolled back by the server and run again: both leases are renewed
    assert renewed == [[]]
    assert [store.get_run(r).lease_expires_at for r in ("a", "b")] == [T0 + 40, T0 + 40]
    store.close()
