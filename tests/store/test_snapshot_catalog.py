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


def test_a_version_2_database_gains_the_chain_and_signature_columns(db_url, raw_sql):
    # Given a version-2 database (the catalog without kind, base, root and signature) holding a snapshot
    with open_store(db_url) as s:
        token = new_run(s, events=2)
        s.append("r1", [], token=token, now=T0, snapshot=NewSnapshot(
            seq=2, state='{"a": 1}', sha256="h2", trigger="periodic", created_at=T0))
    for column in ("kind", "base_seq", "base_sha256", "root_seq", "signature"):
        raw_sql(f"ALTER TABLE agentsaga_snapshots DROP COLUMN {column}")
    raw_sql("UPDATE agentsaga_meta SET value = '2' WHERE key = 'schema_version'")
    # When this version opens it
    with open_store(db_url) as s:
        (info,) = s.snapshot_catalog("r1")
        # Then the old snapshot is a full one, unsigned, with no base
        assert (info.seq, info.kind, info.base_seq, info.base_sha256, info.signature) == (2, "full", None, None, None)
        assert s.snapshot("r1", 2).state == '{"a": 1}'
        # And an incremental written now keeps its base and root
        s.append("r1", [ev(3)], token=token, now=T0, snapshot=NewSnapshot(
            seq=3, state="{}", sha256="h3", trigger="periodic", created_at=T0, kind="incremental",
            base_seq=2, base_sha256="h2", root_seq=2, signature="sig"))
        top = s.snapshot_catalog("r1")[0]
        assert (top.kind, top.base_seq, top.base_sha256, top.root_seq, top.signature) == (
            "incremental", 2, "h2", 2, "sig")
    assert raw_sql("SELECT value FROM agentsaga_meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]


def test_pruning_keeps_the_base_chains_of_the_snapshots_it_keeps(store):
    # Given chains: full 2 <- 3 <- 4, full 5 <- 6 (each incremental names its chain's full snapshot)
    token = new_run(store, events=6)
    chains = {2: None, 3: 2, 4: 2, 5: None, 6: 5}
    for seq, root in chains.items():
        store.append("r1", [], token=token, now=T0, snapshot=NewSnapshot(
            seq=seq, state="{}", sha256=f"h{seq}", trigger="periodic", created_at=T0,
            kind="full" if root is None else "incremental", base_seq=None if root is None else seq - 1,
            root_seq=root))
    # When the newest 1 is kept: its chain (5, 6) stays
    assert store.prune_snapshots("r1", 2) == 3
    assert [s.seq for s in store.snapshot_catalog("r1")] == [6, 5]
    assert store.prune_snapshots("r1", 1) == 0
    # And keeping none drops them all
    assert store.prune_snapshots("r1", 0) == 2 and store.snapshot_catalog("r1") == []


def test_an_append_that_prunes_keeps_the_chain_of_the_newest_k(store):
    # Given a full snapshot and incremental links written with keep=1
    token = new_run(store, events=5)
    for seq in range(2, 6):
        store.append("r1", [], token=token, now=T0, keep_snapshots=1, snapshot=NewSnapshot(
            seq=seq, state="{}", sha256=f"h{seq}", trigger="periodic", created_at=T0,
            kind="full" if seq == 2 else "incremental", base_seq=None if seq == 2 else seq - 1,
            root_seq=2))
    # Then every link back to the full snapshot is still there
    assert [s.seq for s in store.snapshot_catalog("r1")] == [5, 4, 3, 2]
