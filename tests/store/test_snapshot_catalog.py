"""The store contract, snapshots' catalog: metadata without state, validity flags, and the
migration that brings a version-1 database's snapshots into the catalog. SQLite and Postgres."""

from __future__ import annotations

import pytest
from store_helpers import T0, ev, new_run

from store import SCHEMA_VERSION, NewSnapshot, RunNotFoundError, open_store

_V1_SNAPSHOTS = (
    "CREATE TABLE agentsaga_snapshots (run_pk BIGINT NOT NULL, seq INTEGER NOT NULL, state TEXT NOT NULL,"
    " sha256 VARCHAR NOT NULL, schema_version INTEGER NOT NULL, trigger VARCHAR NOT NULL,"
    " created_at FLOAT NOT NULL, PRIMARY KEY (run_pk, seq))"
)


def test_catalog_lists_metadata_newest_first_without_state(store):
    # Given a run with two snapshots written with catalog metadata
    token = new_run(store, events=3)
    for seq in (2, 3):
        store.append("r1", [], token=token, now=T0, snapshot=NewSnapshot(
            seq=seq, state=f'{{"é": {seq}}}', sha256=f"h{seq}", trigger="periodic", created_at=T0 + seq,
            workflow="wf", version="1", fingerprint="fp", agentsaga_version="0.1.0", python_version="3.12.1",
            config_hash="c0ffee"))
    # When the catalog is read
    catalog = store.snapshot_catalog("r1")
    # Then it lists both, newest first, with what wrote them, their size in bytes, and unchecked
    assert [s.seq for s in catalog] == [3, 2]
    top = catalog[0]
    assert (top.trigger, top.created_at, top.workflow, top.version, top.fingerprint) == (
        "periodic", T0 + 3, "wf", "1", "fp")
    assert (top.agentsaga_version, top.python_version, top.config_hash) == ("0.1.0", "3.12.1", "c0ffee")
    assert top.size_bytes == len('{"é": 3}'.encode())
    assert (top.validity, top.validity_reason, top.checked_at) == ("unchecked", None, None)
    assert not hasattr(top, "state")


def test_mark_snapshot_sets_the_flag_and_keep_bad_keeps_an_earlier_verdict(store):
    # Given a run with a snapshot at seq 1
    token = new_run(store, events=1)
    store.append("r1", [], token=token, now=T0, snapshot=NewSnapshot(
        seq=1, state="{}", sha256="h", trigger="final", created_at=T0))
    # When it is quarantined, then "failed" is written with keep_bad
    assert store.mark_snapshot("r1", 1, "quarantined", reason="by hand", checked_at=T0 + 5)
    assert store.mark_snapshot("r1", 1, "failed", reason="later", checked_at=T0 + 6, keep_bad=True)
    # Then the first verdict stands
    (info,) = store.snapshot_catalog("r1")
    assert (info.validity, info.validity_reason, info.checked_at) == ("quarantined", "by hand", T0 + 5)
    # And without keep_bad a new verdict replaces it
    assert store.mark_snapshot("r1", 1, "verified", reason=None, checked_at=T0 + 7)
    assert store.snapshot_catalog("r1")[0].validity == "verified"
    # And a missing snapshot says so, a bad flag and a missing run are errors naming them
    assert store.mark_snapshot("r1", 9, "verified", reason=None, checked_at=T0) is False
    with pytest.raises(ValueError, match="'trusted'"):
        store.mark_snapshot("r1", 1, "trusted", reason=None, checked_at=T0)
    with pytest.raises(RunNotFoundError, match="ghost"):
        store.snapshot_catalog("ghost")


def test_a_version_1_database_migrates_its_snapshots_into_the_catalog(db_url, raw_sql):
    # Given a database whose snapshots table has the version-1 shape and holds one snapshot
    with open_store(db_url) as s:
        new_run(s, events=2, workflow="trip", version="3", fingerprint="abc")
    raw_sql("DROP TABLE agentsaga_snapshots")
    raw_sql(_V1_SNAPSHOTS)
    pk = raw_sql("SELECT pk FROM agentsaga_runs WHERE run_id = 'r1'")[0][0]
    raw_sql("INSERT INTO agentsaga_snapshots VALUES (?, 2, ?, 'h2', 1, 'periodic', ?)", (pk, '{"ü": 1}', T0))
    raw_sql("UPDATE agentsaga_meta SET value = '1' WHERE key = 'schema_version'")
    # When this version opens it
    with open_store(db_url) as s:
        catalog = s.snapshot_catalog("r1")
        # Then the snapshot is in the catalog with its run's workflow, version and fingerprint, its
        # size, unknown writer versions, unchecked; and its state is untouched
        (info,) = catalog
        assert (info.seq, info.workflow, info.version, info.fingerprint) == (2, "trip", "3", "abc")
        assert info.size_bytes == len('{"ü": 1}'.encode())
        assert (info.agentsaga_version, info.python_version, info.validity) == ("", "", "unchecked")
        assert s.snapshot("r1", 2).state == '{"ü": 1}'
        # And new snapshots are written with the new columns
        s.append("r1", [ev(3)], token=1, now=T0, snapshot=NewSnapshot(
            seq=3, state="{}", sha256="h3", trigger="final", created_at=T0, workflow="trip"))
        assert [i.workflow for i in s.snapshot_catalog("r1")] == ["trip", "trip"]
    assert raw_sql("SELECT value FROM agentsaga_meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
