"""The store contract: `store.signals`, a run's inbox, and consuming signals inside an append.
Runs on SQLite and on Postgres."""

from __future__ import annotations

import pytest
from store_helpers import T0, ev, new_run

from store import ConflictError, RunNotFoundError


def test_signals_are_pending_until_consumed(store):
    # Given a run, and signals sent to it
    new_run(store, "r1")
    first = store.signals.send("r1", "approve", '{"by": "ann"}', now=T0 + 1)
    second = store.signals.send("r1", "comment", '"hi"', now=T0 + 2)
    # Then both are pending, oldest first, and can be filtered by name
    assert store.signals.pending("r1") == [
        (first, "approve", '{"by": "ann"}', T0 + 1),
        (second, "comment", '"hi"', T0 + 2),
    ]
    assert [s[0] for s in store.signals.pending("r1", "comment")] == [second]
    # When one is consumed, it is no longer pending; consuming it again conflicts
    store.signals.consume(first)
    assert [s[0] for s in store.signals.pending("r1")] == [second]
    with pytest.raises(ConflictError):
        store.signals.consume(first)


def test_append_consumes_signals_in_the_same_transaction(store):
    # Given a pending signal
    token = new_run(store, "r1")
    sid = store.signals.send("r1", "approve", "{}", now=T0)
    # When the event recording it is appended together with consuming it
    store.append("r1", [ev(2, "SignalReceived")], token=token, now=T0, consume_signals=[sid])
    # Then the event exists and the signal is consumed
    assert [e.kind for e in store.events("r1")] == ["StepCompleted", "SignalReceived"]
    assert store.signals.pending("r1") == []
    # And a second append consuming it again writes nothing (someone else handled it)
    with pytest.raises(ConflictError):
        store.append("r1", [ev(3, "SignalReceived")], token=token, now=T0, consume_signals=[sid])
    assert store.last_seq("r1") == 2


def test_append_cannot_consume_another_runs_signal(store):
    token = new_run(store, "r1")
    new_run(store, "r2")
    theirs = store.signals.send("r2", "approve", "{}", now=T0)
    with pytest.raises(ConflictError):
        store.append("r1", [ev(2)], token=token, now=T0, consume_signals=[theirs])
    assert store.last_seq("r1") == 1
    assert [s[0] for s in store.signals.pending("r2")] == [theirs]


def test_signals_to_unknown_run_raise(store):
    with pytest.raises(RunNotFoundError):
        store.signals.send("ghost", "approve", "{}", now=T0)
    with pytest.raises(RunNotFoundError):
        store.signals.pending("ghost")
