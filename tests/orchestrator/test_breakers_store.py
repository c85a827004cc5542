"""Store-backed circuit breakers: one breaker for every process, on SQLite and on Postgres.

Time is an injected clock, so reset timeouts are exact; the cross-process test runs a real child
process with its own store connection.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from compensations import BreakerConfig
from orchestrator.tools import StoreBreakers
from orchestrator import CircuitOpenError
from store import open_store

ROOT = Path(__file__).parent.parent.parent
T0 = 1_700_000_000.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def trip(breakers: StoreBreakers, cfg: BreakerConfig, n: int) -> list[dict]:
    transitions = []
    for _ in range(n):
        breakers.before_call(cfg)
        t = breakers.after_call(cfg, ok=False)
        if t:
            transitions.append(t)
    return transitions


def test_threshold_opens_and_the_open_breaker_fails_fast(store):
    # Given a breaker opening at 3 failures
    clock = Clock()
    breakers = StoreBreakers(store, clock)
    cfg = BreakerConfig(name="payments", failure_threshold=3, reset_timeout=30)
    # When three calls fail
    transitions = trip(breakers, cfg, 3)
    # Then it opened once, and the next call fails fast naming the breaker and when it will probe
    assert [(t["from"], t["to"]) for t in transitions] == [("closed", "open")]
    clock.now += 10
    with pytest.raises(CircuitOpenError, match=r"'payments' is open.*in 20s") as info:
        breakers.before_call(cfg)
    assert info.value.tool == "payments"
    assert info.value.retry_at == T0 + 30


def test_half_open_probe_then_close(store):
    clock = Clock()
    breakers = StoreBreakers(store, clock)
    cfg = BreakerConfig(name="search", failure_threshold=1, reset_timeout=30)
    trip(breakers, cfg, 1)
    # When the reset timeout has passed, one probe is admitted and a second call is refused
    clock.now += 30
    assert breakers.before_call(cfg)["to"] == "half_open"
    with pytest.raises(CircuitOpenError, match="half-open"):
        breakers.before_call(cfg)
    # Then the probe's success closes it and calls flow again
    assert breakers.after_call(cfg, ok=True)["to"] == "closed"
    assert breakers.before_call(cfg) is None
    assert breakers.state("search").state == "closed"


def test_failed_probe_reopens(store):
    clock = Clock()
    breakers = StoreBreakers(store, clock)
    cfg = BreakerConfig(name="search", failure_threshold=1, reset_timeout=5)
    trip(breakers, cfg, 1)
    clock.now += 5
    breakers.before_call(cfg)
    assert breakers.after_call(cfg, ok=False)["to"] == "open"
    with pytest.raises(CircuitOpenError) as info:
        breakers.before_call(cfg)
    assert info.value.retry_at == T0 + 10


def test_a_healthy_tool_never_writes_breaker_state(store):
    breakers = StoreBreakers(store, Clock())
    cfg = BreakerConfig(name="healthy")
    for _ in range(5):
        breakers.before_call(cfg)
        breakers.after_call(cfg, ok=True)
    assert store.breakers.get("healthy") == (None, 0)


class Interleaved:
    """A store on which another worker records a failure right before our first write."""

    def __init__(self, store, rival: StoreBreakers, cfg: BreakerConfig) -> None:
        self._store, self._rival, self._cfg, self.cas_calls = store, rival, cfg, 0
        self.breakers = self  # the part StoreBreakers uses: get and compare_and_set below

    def get(self, name):
        return self._store.breakers.get(name)

    def compare_and_set(self, name, **kw):
        self.cas_calls += 1
        if self.cas_calls == 1:
            self._rival.after_call(self._cfg, ok=False)
        return self._store.breakers.compare_and_set(name, **kw)


def test_a_lost_compare_and_set_is_re_read_and_re_applied(store):
    # Given another worker that records a failure between our read and our write
    clock = Clock()
    cfg = BreakerConfig(name="api", failure_threshold=2)
    racy = Interleaved(store, StoreBreakers(store, clock), cfg)
    # When we record a failure
    transition = StoreBreakers(racy, clock).after_call(cfg, ok=False)
    # Then our first write lost, we re-applied on the rival's state, and both failures count
    assert racy.cas_calls == 2
    assert transition is not None and transition["reason"] == "2 failures in 60s"


def test_concurrent_callers_take_exactly_the_half_open_slots(db_url):
    # Given an open breaker whose reset timeout has passed, and eight workers with their own stores
    clock = Clock()
    cfg = BreakerConfig(name="slots", failure_threshold=1, reset_timeout=1, half_open_max_calls=2)
    seed = open_store(db_url)
    trip(StoreBreakers(seed, clock), cfg, 1)
    clock.now += 1
    stores = [open_store(db_url) for _ in range(8)]
    admitted, refused, errors = [], [], []
    start = threading.Barrier(len(stores))

    def worker(s) -> None:
        start.wait()
        try:
            StoreBreakers(s, clock).before_call(cfg)
            admitted.append(1)
        except CircuitOpenError:
            refused.append(1)
        except Exception as exc:  # surfaced below: a store error must fail the test, not hang it
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for s in [seed, *stores]:
            s.close()
    # Then exactly two probes went out
    assert errors == []
    assert (len(admitted), len(refused)) == (2, 6)


CHILD = """
import sys
from compensations import BreakerConfig
from orchestrator.tools import StoreBreakers
from store import open_store

url, n, now = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
store = open_store(url)
breakers = StoreBreakers(store, lambda: now)
cfg = BreakerConfig(name="shared", failure_threshold=3, reset_timeout=60)
for _ in range(n):
    breakers.before_call(cfg)
    breakers.after_call(cfg, ok=False)
print(breakers.state("shared").state)
store.close()
"""


@pytest.mark.slow
def test_breaker_state_is_shared_between_processes(db_url):
    # Given this process's view of a closed breaker
    store = open_store(db_url)
    try:
        breakers = StoreBreakers(store, Clock(T0 + 1))
        cfg = BreakerConfig(name="shared", failure_threshold=3, reset_timeout=60)
        assert breakers.before_call(cfg) is None
        # When a child process, through its own connection, records three failures
        child = subprocess.run([sys.executable, "-c", CHILD, db_url, "3", str(T0)],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "open"
        # Then this process sees the breaker open and fails fast
        with pytest.raises(CircuitOpenError, match="'shared' is open") as info:
            breakers.before_call(cfg)
        assert info.value.retry_at == T0 + 60
    finally:
        store.close()
