"""The pure breaker state machine: time is a number passed in, so every test is exact."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compensations import BreakerConfig, BreakerConfigError, BreakerRegistry, BreakerStateError, declare_breaker
from compensations.breaker_machine import CLOSED, HALF_OPEN, OPEN, BreakerState, decide, record


def fail_n(config, state, n, *, start=0.0, step=1.0):
    transition = None
    for i in range(n):
        state, t = record(config, state, start + i * step, ok=False)
        transition = t or transition
    return state, transition


def test_threshold_failures_open_the_breaker():
    # Given a breaker opening at 3 failures in 60s
    cfg = BreakerConfig(name="payments", failure_threshold=3)
    # When two failures are recorded it stays closed; the third opens it
    state, t = fail_n(cfg, BreakerState(), 2)
    assert state.state == CLOSED and t is None
    state, t = record(cfg, state, 2.0, ok=False)
    # Then the transition names the breaker and says why
    assert state.state == OPEN and state.opened_at == 2.0
    assert t == {"breaker": "payments", "from": "closed", "to": "open", "reason": "3 failures in 60s", "at": 2.0}


def test_successes_do_not_change_a_count_only_breaker():
    # A healthy tool's breaker state never changes, so the store is never written for it
    cfg = BreakerConfig(name="t", failure_threshold=3)
    state = BreakerState()
    assert record(cfg, state, 1.0, ok=True).state is state


def test_open_breaker_fails_fast_until_the_reset_timeout():
    cfg = BreakerConfig(name="t", failure_threshold=1, reset_timeout=30)
    state, _ = record(cfg, BreakerState(), 100.0, ok=False)
    # When a call is about to be made before the reset timeout
    allowed, after, retry_at, transition = decide(cfg, state, 129.9)
    # Then it is refused, with when it will probe, and nothing changes
    assert not allowed and retry_at == 130.0
    assert after == state and transition is None


def test_half_open_after_reset_timeout_admits_exactly_the_configured_probes():
    cfg = BreakerConfig(name="t", failure_threshold=1, reset_timeout=30, half_open_max_calls=2)
    state, _ = record(cfg, BreakerState(), 100.0, ok=False)
    # When the reset timeout has elapsed, the first call half-opens it and is a probe
    allowed, state, _, t = decide(cfg, state, 130.0)
    assert allowed and state.state == HALF_OPEN
    assert t["from"] == "open" and t["to"] == "half_open"
    # Then exactly one more probe is admitted, and the next call is refused
    allowed, state, _, t = decide(cfg, state, 130.5)
    assert allowed and t is None and len(state.probes) == 2
    allowed, _, retry_at, _ = decide(cfg, state, 131.0)
    assert not allowed and retry_at == 160.0


def test_a_successful_probe_closes_the_breaker():
    cfg = BreakerConfig(name="t", failure_threshold=1, reset_timeout=10)
    state, _ = record(cfg, BreakerState(), 0.0, ok=False)
    _, state, _, _ = decide(cfg, state, 10.0)
    state, t = record(cfg, state, 10.5, ok=True)
    assert state == BreakerState()
    assert (t["from"], t["to"]) == ("half_open", "closed")
    assert decide(cfg, state, 11.0).allowed


def test_success_threshold_needs_that_many_probe_successes():
    cfg = BreakerConfig(name="t", failure_threshold=1, reset_timeout=10, success_threshold=2)
    state, _ = record(cfg, BreakerState(), 0.0, ok=False)
    _, state, _, _ = decide(cfg, state, 10.0)
    state, t = record(cfg, state, 10.1, ok=True)
    assert state.state == HALF_OPEN and t is None
    # The slot is free again, so a second probe goes out and its success closes the breaker
    allowed, state, _, _ = decide(cfg, state, 10.2)
    assert allowed
    state, t = record(cfg, state, 10.3, ok=True)
    assert state.state == CLOSED and t["to"] == "closed"


def test_a_failed_probe_reopens_the_breaker_with_a_new_timeout():
    cfg = BreakerConfig(name="t", failure_threshold=1, reset_timeout=10)
    state, _ = record(cfg, BreakerState(), 0.0, ok=False)
    _, state, _, _ = decide(cfg, state, 10.0)
    state, t = record(cfg, state, 11.0, ok=False)
    assert state.state == OPEN and state.opened_at == 11.0
    assert (t["from"], t["to"]) == ("half_open", "open")
    assert decide(cfg, state, 20.0).retry_at == 21.0


def test_a_lost_probe_frees_its_slot_after_a_reset_timeout():
    # Given a half-open breaker whose only probe was never reported (its process died)
    cfg = BreakerConfig(name="t", failure_threshold=1, reset_timeout=10)
    state, _ = record(cfg, BreakerState(), 0.0, ok=False)
    _, state, _, _ = decide(cfg, state, 10.0)
    assert not decide(cfg, state, 19.0).allowed
    # Then after another reset timeout a new probe is admitted
    allowed, state, _, _ = decide(cfg, state, 20.5)
    assert allowed and state.probes == (20.5,)


def test_failure_rate_opens_only_after_min_calls():
    # Given a rate rule: 50% failures over at least 4 calls, and no count rule
    cfg = BreakerConfig(name="t", failure_threshold=None, failure_rate=0.5, min_calls=4)
    state = BreakerState()
    state, t1 = record(cfg, state, 1.0, ok=False)
    state, t2 = record(cfg, state, 2.0, ok=False)
    state, t3 = record(cfg, state, 3.0, ok=True)
    # Then 2 of 3 failed is not enough calls; the fourth call decides it
    assert state.state == CLOSED and t1 is t2 is t3 is None
    state, t = record(cfg, state, 4.0, ok=True)
    assert state.state == OPEN
    assert t["reason"] == "failure rate 50% over 4 calls in 60s (threshold 50%)"


def test_failure_rate_below_the_threshold_stays_closed():
    cfg = BreakerConfig(name="t", failure_threshold=None, failure_rate=0.5, min_calls=4)
    state = BreakerState()
    for i, ok in enumerate([True, False, True, True, True, False, True]):
        state, t = record(cfg, state, float(i), ok=ok)
        assert t is None
    assert state.state == CLOSED


def test_window_expiry_forgets_old_failures():
    # Given two failures long ago and a breaker opening at three in 60s
    cfg = BreakerConfig(name="t", failure_threshold=3, window=60)
    state, _ = fail_n(cfg, BreakerState(), 2, start=0.0)
    # When a third failure comes after the first two left the window
    state, t = record(cfg, state, 61.0, ok=False)
    # Then it stays closed, and only the recent failure is kept
    assert state.state == CLOSED and t is None
    assert state.failures == (61.0,)


def test_recorded_samples_are_bounded():
    cfg = BreakerConfig(name="t", failure_threshold=None, failure_rate=1.0, min_calls=1)
    state = BreakerState()
    for i in range(500):
        state, _ = record(cfg, state, i * 0.01, ok=True)
    assert len(state.successes) == cfg.max_samples == 100


def test_a_result_reported_while_open_changes_nothing():
    cfg = BreakerConfig(name="t", failure_threshold=1)
    state, _ = record(cfg, BreakerState(), 0.0, ok=False)
    assert record(cfg, state, 1.0, ok=True) == (state, None)


@pytest.mark.parametrize("field, value", [
    ("failure_threshold", 0), ("failure_rate", 1.5), ("failure_rate", 0), ("window", 0),
    ("reset_timeout", -1), ("half_open_max_calls", 0), ("success_threshold", 1.5), ("min_calls", True),
])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(BreakerConfigError, match=f"'x': {field}="):
        BreakerConfig(name="x", **{field: value})


def test_a_config_that_could_never_open_is_refused():
    with pytest.raises(BreakerConfigError, match="never open"):
        BreakerConfig(name="x", failure_threshold=None)
    with pytest.raises(BreakerConfigError, match="name"):
        BreakerConfig(name="")


def test_one_breaker_name_with_two_configurations_is_an_error_at_definition():
    registry = BreakerRegistry()
    declare_breaker("payments", failure_threshold=5, registry=registry)
    # The same settings again are fine (a module imported twice)
    declare_breaker("payments", failure_threshold=5, registry=registry)
    with pytest.raises(BreakerConfigError, match=r"breaker 'payments' declared twice with different settings: "
                                                 r"failure_threshold 5 != 3"):
        declare_breaker("payments", failure_threshold=3, registry=registry)
    assert registry.get("payments").failure_threshold == 5


def test_an_undeclared_name_gets_the_default_configuration():
    registry = BreakerRegistry()
    assert registry.config_for("api.example.com") == BreakerConfig(name="api.example.com")


def test_a_never_written_state_is_a_closed_breaker_and_garbage_is_a_clear_error():
    assert BreakerState.from_json(None) == BreakerState()
    with pytest.raises(BreakerStateError, match="not JSON"):
        BreakerState.from_json("{nope")
    with pytest.raises(BreakerStateError, match="'ajar'"):
        BreakerState.from_json('{"state": "ajar"}')
    with pytest.raises(BreakerStateError, match="v=2"):
        BreakerState.from_json('{"v": 2}')


times = st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20).map(tuple)
states = st.builds(
    BreakerState,
    state=st.sampled_from([CLOSED, OPEN, HALF_OPEN]),
    failures=times,
    successes=times,
    opened_at=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    probes=times,
    probe_successes=st.integers(min_value=0, max_value=10**6),
)


@given(states)
def test_state_json_round_trips(state):
    assert BreakerState.from_json(state.to_json()) == state


@given(states, st.floats(min_value=-1e9, max_value=1e9), st.booleans())
def test_machine_output_always_round_trips(state, now, ok):
    cfg = BreakerConfig(name="p", failure_threshold=3, failure_rate=0.5, min_calls=2)
    for after in (decide(cfg, state, now).state, record(cfg, state, now, ok).state):
        assert BreakerState.from_json(after.to_json()) == after
