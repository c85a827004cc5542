"""Pin the store's public surface: a change here is a change to the contract."""

import store

EXPECTED = {
    "open_store",
    "default_url",
    "Store",
    "SCHEMA_VERSION",
    "RunRecord",
    "NewEvent",
    "EventRecord",
    "NewSnapshot",
    "SnapshotRecord",
    "SnapshotInfo",
    "VALIDITY",
    "StoreError",
    "ConfigError",
    "SchemaVersionError",
    "StoreUnavailableError",
    "RunNotFoundError",
    "DuplicateRunError",
    "ConflictError",
    "FencedError",
    "LeaseHeldError",
}


def test_store_exports_exactly_the_documented_names():
    assert set(store.__all__) == EXPECTED
    assert len(store.__all__) == len(EXPECTED)  # no duplicates


def test_every_exported_name_exists():
    for name in store.__all__:
        assert getattr(store, name) is not None, name


def test_every_store_error_derives_from_store_error():
    for name in store.__all__:
        value = getattr(store, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, store.StoreError), name
