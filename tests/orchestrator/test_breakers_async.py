"""``StoreBreakers.ahooks``: the async breaker hooks share their reads of a breaker's state, and still
decide every call on a read that began after the call asked (an open breaker written by another
process is honoured at once). On SQLite and on Postgres; time is an injected clock, and the order
of events is made by gates, never by waiting.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from compensations import BreakerConfig
from orchestrator import CircuitOpenError
from orchestrator.tools import StoreBreakers
from store import open_store

T0 = 1_700_000_000.0


class GatedRows:
    """``store.breakers`` that counts reads and, while ``hold`` is set, keeps each read's answer
    until ``release`` is set (the read itself is done at once: its answer is from before)."""

    def __init__(self, store) -> None:
        self._rows = store.breakers
        self.breakers = self
        self.reads = 0
        self.hold = False
        self.read_done = threading.Event()
        self.release = threading.Event()

    def get(self, name):
        self.reads += 1
        answer = self._rows.get(name)
        self.read_done.set()
        if self.hold:
            self.release.wait(60)
        return answer

    def compare_and_set(self, name, **kw):
        return self._rows.compare_and_set(name, **kw)


def configs(cfg: BreakerConfig):
    return lambda name: cfg


def test_callers_asking_during_a_read_share_the_next_one(store):
    # Given a healthy breaker, and reads held until the test releases them
    rows = GatedRows(store)
    cfg = BreakerConfig(name="shared-reads", failure_threshold=3)
    before, _ = StoreBreakers(rows, lambda: T0).ahooks(configs(cfg))
    rows.hold = True

    async def scenario() -> None:
        calls = [asyncio.create_task(before(cfg.name)) for _ in range(50)]
        await asyncio.sleep(0)  # every task has asked: the first started a read, the rest wait for the next
        rows.release.set()
        await asyncio.gather(*calls)

    asyncio.run(scenario())
    # Then fifty admissions cost two reads, and a healthy breaker was never written
    assert rows.reads == 2
    assert store.breakers.get(cfg.name) == (None, 0)


def test_a_read_that_began_before_the_caller_asked_is_not_used(store, db_url):
    # Given a read of a closed breaker under way (done, its answer held back)
    rows = GatedRows(store)
    cfg = BreakerConfig(name="fresh", failure_threshold=1, reset_timeout=60)
    before, _ = StoreBreakers(rows, lambda: T0).ahooks(configs(cfg))
    rows.hold = True
    other = open_store(db_url)  # another worker, with its own connection

    async def scenario() -> tuple[object, object]:
        early = asyncio.create_task(before(cfg.name))
        await asyncio.to_thread(rows.read_done.wait, 60)
        # When another worker opens the breaker, and only then a second call asks
        other_breakers = StoreBreakers(other, lambda: T0)
        other_breakers.before_call(cfg)
        other_breakers.after_call(cfg, ok=False)
        late = asyncio.create_task(before(cfg.name))
        await asyncio.sleep(0)
        rows.hold = False
        rows.release.set()
        return tuple(await asyncio.gather(early, late, return_exceptions=True))

    try:
        early, late = asyncio.run(scenario())
    finally:
        other.close()
    # Then the call that asked before the breaker opened was admitted; the later one fails fast
    assert early is None
    assert isinstance(late, CircuitOpenError) and late.retry_at == T0 + 60


def test_failures_are_written_and_trip_the_breaker_for_everybody(store):
    # Given async hooks reporting transitions
    seen: list[dict] = []
    cfg = BreakerConfig(name="trips", failure_threshold=3, reset_timeout=30)
    before, after = StoreBreakers(store, lambda: T0).ahooks(configs(cfg), seen.append)

    async def fail_three() -> None:
        for _ in range(3):
            await before(cfg.name)
            await after(cfg.name, False)

    # When three calls fail
    asyncio.run(fail_three())
    # Then the breaker opened (once), in the store: a synchronous caller elsewhere fails fast too
    assert [(t["from"], t["to"]) for t in seen] == [("closed", "open")]
    with pytest.raises(CircuitOpenError, match="'trips' is open"):
        StoreBreakers(store, lambda: T0 + 1).before_call(cfg)
    with pytest.raises(CircuitOpenError):
        asyncio.run(before(cfg.name))


def test_concurrent_async_callers_take_exactly_the_half_open_slots(store):
    # Given an open breaker whose reset timeout has passed
    clock = [T0]
    cfg = BreakerConfig(name="probes", failure_threshold=1, reset_timeout=10, half_open_max_calls=2,
                        success_threshold=2)
    breakers = StoreBreakers(store, lambda: clock[0])
    breakers.before_call(cfg)
    breakers.after_call(cfg, ok=False)
    clock[0] += 10
    seen: list[dict] = []
    before, after = breakers.ahooks(configs(cfg), seen.append)

    async def admit() -> bool:
        try:
            await before(cfg.name)
        except CircuitOpenError:
            return False
        return True

    async def scenario() -> list[bool]:
        admitted = await asyncio.gather(*(admit() for _ in range(6)))
        for _ in range(sum(admitted)):
            await after(cfg.name, True)
        return admitted

    # When six calls ask at once, and the admitted probes succeed
    admitted = asyncio.run(scenario())
    # Then exactly two probes went out, and their successes closed the breaker
    assert sum(admitted) == 2
    assert [(t["from"], t["to"]) for t in seen] == [("open", "half_open"), ("half_open", "closed")]
    assert breakers.state(cfg.name).state == "closed"


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_with_max_age_a_recent_read_decides_and_another_workers_change_is_seen_once_it_is_older(store, db_url):
    # Given async hooks that may decide on a read up to one second old
    rows = GatedRows(store)
    mono = Monotonic()
    cfg = BreakerConfig(name="aged", failure_threshold=1, reset_timeout=60)
    before, after = StoreBreakers(rows, lambda: T0).ahooks(configs(cfg), max_age=1.0, monotonic=mono)
    other = open_store(db_url)

    async def call() -> object:
        try:
            await before(cfg.name)
        except CircuitOpenError as exc:
            return exc
        await after(cfg.name, True)
        return None

    async def scenario() -> tuple[list, int, object, object]:
        # When ten calls run within the second, another worker opens the breaker, and time moves on
        first = [await call() for _ in range(10)]
        reads_within = rows.reads
        other_breakers = StoreBreakers(other, lambda: T0)
        other_breakers.before_call(cfg)
        other_breakers.after_call(cfg, ok=False)
        mono.now += 0.5
        still_admitted = await call()
        mono.now += 0.6
        return first, reads_within, still_admitted, await call()

    try:
        first, reads_within, still_admitted, refused = asyncio.run(scenario())
    finally:
        other.close()
    # Then the ten calls cost one read; within the second the old read still decides; after it, the
    # breaker the other worker opened is honoured
    assert first == [None] * 10 and reads_within == 1
    assert still_admitted is None
    assert isinstance(refused, CircuitOpenError)


def test_with_max_age_a_breaker_this_process_trips_is_honoured_at_once(store):
    # Given hooks deciding on reads up to a minute old, and a breaker opening at the first failure
    mono = Monotonic()
    cfg = BreakerConfig(name="mine", failure_threshold=1, reset_timeout=60)
    before, after = StoreBreakers(store, lambda: T0).ahooks(configs(cfg), max_age=60.0, monotonic=mono)

    async def scenario() -> None:
        await before(cfg.name)  # a read of the closed breaker, recent for a minute
        await after(cfg.name, False)  # this process trips it
        await before(cfg.name)

    # When the next call asks within the minute, it is refused: the old read no longer stands
    with pytest.raises(CircuitOpenError, match="'mine' is open"):
        asyncio.run(scenario())


def test_call_limits_wrap_async_breaker_hooks_and_an_open_breaker_takes_no_slot(store):
    # Given a tool limited to one call in flight, behind async breaker hooks
    from orchestrator.tools.limits import CallLimits

    cfg = BreakerConfig(name="limited", failure_threshold=1, reset_timeout=60)
    limits = CallLimits(store, {"limited": 1}, owner="me", clock=lambda: T0)
    before, after = limits.wrap(StoreBreakers(store, lambda: T0).ahooks(configs(cfg)), is_async=True)

    async def scenario() -> None:
        # When a call goes out and fails (the breaker opens), and another one asks
        await before(cfg.name)
        assert store.slots.held("limited", now=T0) == 1
        await after(cfg.name, False)
        assert store.slots.held("limited", now=T0) == 0
        await before(cfg.name)

    # Then the second is refused by the breaker, before taking the slot
    with pytest.raises(CircuitOpenError):
        asyncio.run(scenario())
    assert store.slots.held("limited", now=T0) == 0


def test_past_half_its_age_a_read_is_begun_ahead_and_decides_the_calls_after_the_old_one_expired(store):
    # Given a gate deciding on reads up to a second old, and a call that read the healthy breaker
    rows = GatedRows(store)
    mono = Monotonic()
    cfg = BreakerConfig(name="ahead", failure_threshold=3)
    gate = StoreBreakers(rows, lambda: T0).gate(configs(cfg), max_age=1.0, monotonic=mono)

    async def landed_before(now: float) -> None:
        """Until a call at ``now`` finds a read recent enough to decide at once (the read begun ahead
        has been handed to the loop): asked without time passing, only the loop turning."""
        for _ in range(100_000):
            pending = gate.admit(cfg.name) if mono.now == now else None
            if pending is None:
                return
            pending.close()  # (not awaited: it asked for no read)
            await asyncio.sleep(0)
        raise AssertionError("the read begun ahead never landed")

    async def scenario() -> tuple[int, object, int, int]:
        await gate.before(cfg.name)
        reads_first = rows.reads
        # When a call asks past half the read's age, and another once the first read is too old
        mono.now += 0.6
        decided = gate.admit(cfg.name)
        mono.now += 0.6
        await landed_before(mono.now)
        reads_after = rows.reads
        await gate.before(cfg.name)
        return reads_first, decided, reads_after, rows.reads

    reads_first, decided, reads_after, reads_last = asyncio.run(scenario())
    # Then the call past half the age was decided at once and began a read nobody waited for; the
    # calls after the first read expired were decided on that one, with no read of their own
    assert reads_first == 1
    assert decided is None
    assert reads_after == 2 and reads_last == 2


def test_a_gate_decides_a_healthy_breaker_without_a_coroutine_and_an_open_one_fails_fast(store):
    # Given a gate whose breaker opens at the first failure, and a call that read it closed
    mono = Monotonic()
    cfg = BreakerConfig(name="gate", failure_threshold=1, reset_timeout=60)
    seen: list[dict] = []
    gate = StoreBreakers(store, lambda: T0).gate(configs(cfg), seen.append, max_age=1.0, monotonic=mono)

    async def scenario() -> tuple[object, object, object, BaseException | None]:
        await gate.before(cfg.name)
        # When the next call asks and succeeds, one fails, and one more asks
        admitted = gate.admit(cfg.name)
        settled = gate.settle(cfg.name, True)
        failing = gate.settle(cfg.name, False)
        await failing  # a change: written with compare-and-set
        pending = gate.admit(cfg.name)
        try:
            if pending is not None:
                await pending
        except CircuitOpenError as exc:
            return admitted, settled, pending, exc
        return admitted, settled, pending, None

    admitted, settled, pending, refused = asyncio.run(scenario())
    # Then the healthy call was decided at once both ways; the failure was written, so the next call
    # is decided on a fresh read (not on the one from before this process changed the breaker),
    # which refuses it
    assert admitted is None and settled is None
    assert [(t["from"], t["to"]) for t in seen] == [("closed", "open")]
    assert pending is not None
    assert isinstance(refused, CircuitOpenError) and "'gate' is open" in str(refused)
