"""The error tree: every error is a StoreError and survives pickling with its attributes
(workers hand errors across process boundaries)."""

from __future__ import annotations

import pickle

import pytest

from store import (
    ConfigError,
    ConflictError,
    DuplicateRunError,
    FencedError,
    LeaseHeldError,
    RunNotFoundError,
    SchemaVersionError,
    StoreError,
    StoreUnavailableError,
)


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("bad url"),
        SchemaVersionError("newer", found=9, supported=1),
        StoreUnavailableError("down", url="sqlite:///x.db"),
        RunNotFoundError("no run", run_id="r1"),
        DuplicateRunError("dup", run_id="r2", existing_run_id="r1"),
        ConflictError("taken", run_id="r1", seq=3),
        FencedError("stale", run_id="r1", token=1, current_token=2),
        LeaseHeldError("held", run_id="r1", owner="w1", expires_at=5.0),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_are_store_errors_and_pickle_with_their_attributes(error):
    assert isinstance(error, StoreError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)
