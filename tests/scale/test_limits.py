"""Bulkheads: queue concurrency and rate across owners, tool slots, and settings checked at start."""

from __future__ import annotations

import pytest

from orchestrator import ConfigurationError, Orchestrator
from orchestrator.engine import ACTIVE_STATUSES
from orchestrator.scale import Limits, QueueLimit
from orchestrator.scale.limits import parse_count, parse_rate
from orchestrator.engine.loader import load_target
from orchestrator.scale import Worker
from orchestrator.cli import main
from store import NewEvent

from .conftest import HANG, target, wait_for

T0 = 1_800_000_000.0


def make_runs(store, n: int, queue: str) -> None:
    for i in range(n):
        store.create_run(run_id=f"{queue}-{i}", workflow="w", version="1", fingerprint="f", target="",
                         created_at=T0 + i, events=[NewEvent(1, "RunStarted", "{}", T0 + i)], queue=queue)


def claim(store, owner: str, now: float, **kw):
    return store.queues.claim_from("q", owner=owner, ttl=30, now=now, statuses=ACTIVE_STATUSES, limit=10, **kw)


def test_queue_concurrency_holds_across_owners_and_frees_with_leases(store):
    # Given five runs on a queue limited to two in flight
    make_runs(store, 5, "q")
    # When two owners claim all they can
    first, cut_a = claim(store, "A", T0 + 10, concurrency=2)
    second, cut_b = claim(store, "B", T0 + 10, concurrency=2)
    # Then two runs are leased in all, and the second owner was held back by the limit
    assert [r for r, _ in first] == ["q-0", "q-1"] and cut_a
    assert second == [] and cut_b
    assert store.queues.in_flight("q", now=T0 + 10, statuses=ACTIVE_STATUSES) == 2
    # And a released lease makes room for exactly one more
    store.leases.release("q-0", token=first[0][1], now=T0 + 11)
    assert [r for r, _ in claim(store, "B", T0 + 11, concurrency=2)[0]] == ["q-0"]
    # And expired leases (their worker died) count no more: their runs are claimable again
    assert [r for r, _ in claim(store, "C", T0 + 42, concurrency=2)[0]] == ["q-0", "q-1"]
    assert store.queues.in_flight("q", now=T0 + 42, statuses=ACTIVE_STATUSES) == 2


def test_queue_rate_is_a_sliding_window(store):
    make_runs(store, 8, "q")
    # At most three runs handed out in any ten seconds, whoever asks
    assert len(claim(store, "A", T0 + 100, rate=(3, 10.0))[0]) == 3
    assert claim(store, "B", T0 + 105, rate=(3, 10.0)) == ([], True)
    assert claim(store, "B", T0 + 109.9, rate=(3, 10.0))[0] == []
    # And once the first hand-outs leave the window, three more
    got, cut = claim(store, "B", T0 + 110.5, rate=(3, 10.0))
    assert len(got) == 3 and cut
    # A queue with fewer runs than room is not "cut": nothing waits
    got, cut = claim(store, "C", T0 + 121, rate=(3, 10.0))
    assert len(got) == 2 and not cut


def test_tool_slots_are_exclusive_and_expire(store):
    # Given a tool limited to two calls in flight
    a = store.slots.acquire("api", limit=2, holder="a", ttl=5, now=T0)
    b = store.slots.acquire("api", limit=2, holder="b", ttl=5, now=T0)
    assert {a, b} == {0, 1}
    # Then a third caller waits
    assert store.slots.acquire("api", limit=2, holder="c", ttl=5, now=T0 + 1) is None
    assert store.slots.held("api", now=T0 + 1) == 2
    # And a release frees one, for one caller
    assert store.slots.release("api", a, holder="a")
    assert store.slots.acquire("api", limit=2, holder="c", ttl=5, now=T0 + 1) == a
    assert store.slots.acquire("api", limit=2, holder="d", ttl=5, now=T0 + 1) is None
    # And a holder that stops renewing loses its slot when it expires; its late release is refused
    assert store.slots.renew("api", a, holder="c", ttl=5, now=T0 + 3)
    assert store.slots.acquire("api", limit=2, holder="d", ttl=5, now=T0 + 6) == b
    assert not store.slots.release("api", b, holder="b")


@pytest.mark.parametrize("make, words", [
    (lambda: QueueLimit(concurrency=0), "concurrency"),
    (lambda: QueueLimit(worker_concurrency=-1), "worker_concurrency"),
    (lambda: QueueLimit(rate=(0, 1.0)), "run count"),
    (lambda: QueueLimit(rate=(5, 0)), "period"),
    (lambda: QueueLimit(rate=5), "pair"),
    (lambda: Limits(queues={"q": 3}), "QueueLimit"),
    (lambda: Limits(queues={"": QueueLimit()}), "queue name"),
    (lambda: Limits(tools={"api": 0}), "Limits.tools"),
    (lambda: parse_rate("q=lots", "--rate"), "NAME=N/PERIOD"),
    (lambda: parse_count("q", "--queue-concurrency"), "NAME=N"),
])
def test_invalid_limits_are_clear_errors(make, words):
    with pytest.raises(ConfigurationError, match=words):
        make()


def test_limit_spellings_on_the_command_line():
    assert parse_rate("emails=100/60s", "--rate") == ("emails", (100, 60.0))
    assert parse_rate("emails=10/s", "--rate") == ("emails", (10, 1.0))
    assert parse_rate("emails=500/1h", "--rate") == ("emails", (500, 3600.0))
    assert parse_count("api.example.com:443=4", "--tool-limit") == ("api.example.com:443", 4)


def test_the_worker_verb_refuses_bad_limits_before_starting(sqlite_url, capsys):
    assert main(["worker", "--db", sqlite_url, "--rate", "emails=fast"]) == 2
    assert "NAME=N/PERIOD" in capsys.readouterr().err
    assert main(["worker", "--db", sqlite_url, "--queue-concurrency", "emails=0"]) == 2
    assert "must be an integer >= 1" in capsys.readouterr().err


def test_in_flight_calls_to_one_tool_never_exceed_its_limit(db_url, slow_service, thread_worker):
    # Given runs that call the service three at a time (parallel branches), and a worker with
    # eight slots, but at most two calls to the service in flight
    fanout = load_target(target("fanout"))
    host = slow_service.url.split("//", 1)[1]
    with Orchestrator(db_url, workflows=[fanout]) as orc:
        for n in range(4):
            orc.enqueue(fanout, {"api": slow_service.url, "n": n})
        tw = thread_worker(Worker(db_url, [fanout], concurrency=8, limits=Limits(tools={host: 2})))
        wait_for(lambda: orc.store.count_by_status().get("completed") == 4, timeout=HANG, what="4 runs")
        tw.stop()
    # Then the service saw all twelve calls, never more than two at once
    assert len([e for e in slow_service.ledger() if e["action"] == "book"]) == 12
    assert slow_service.stats()["max_in_flight"] == 2
