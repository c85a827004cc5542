"""Checkpoints: the snapshot catalog, validity flags set by verify, and recovery from the newest
snapshot that is not marked bad, read alone. SQLite and Postgres; the CLI through its console script."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import agentsaga, assert_one_line_error, tamper_snapshot

from orchestrator import Orchestrator, RunStateError
from workflows import END, Snapshots, Workflow, reducers


def counter_workflow(limit: int, *, stop_at: int | None = None, full_every: int | None = None) -> Workflow:
    """Counts to ``limit``; with ``stop_at`` the process "dies" (KeyboardInterrupt) at that count.
    With ``full_every`` its runs write only full snapshots, every ``full_every`` events, 10 kept."""
    snapshots = Snapshots(every=full_every, keep=10, incremental=None) if full_every else None
    wf = Workflow("counter", version="4", reducers={"seen": reducers.append}, snapshots=snapshots)

    @wf.step(start=True)
    def tick(ctx, state):
        if state["n"] == stop_at:
            raise KeyboardInterrupt  # the run stays running, leased
        return {"n": state["n"] + 1, "seen": state["n"]}

    wf.route("tick", lambda s: "tick" if s["n"] < limit else END)
    return wf


def interrupted(orc: Orchestrator, run_id: str, limit: int, stop_at: int) -> None:
    with pytest.raises(KeyboardInterrupt):
        orc.run(counter_workflow(limit, stop_at=stop_at), {"n": 0}, run_id=run_id)


def resumed_kinds(orc: Orchestrator, run_id: str, kind: str) -> list[dict]:
    return [e["data"] for e in orc.history(run_id) if e["kind"] == kind]


# -- the catalog -----------------------------------------------------------------------------------
def test_every_snapshot_is_catalogued_with_what_wrote_it(orc_factory, fake_time):
    # Given a workflow whose runs snapshot every 4 events
    wf = counter_workflow(6)
    orc = orc_factory(wf, snapshot_every=4, keep_snapshots=10)
    # When a run completes
    orc.run(wf, {"n": 0}, run_id="cat")
    catalog = orc.snapshots("cat")
    # Then each snapshot says its trigger, seq, time, code, versions, configuration, size and validity
    assert catalog[0].trigger == "final" and "periodic" in {s.trigger for s in catalog}
    assert [s.seq for s in catalog] == sorted((s.seq for s in catalog), reverse=True)
    for info in catalog:
        stored = orc.store.snapshot("cat", info.seq)
        assert (info.workflow, info.version, info.fingerprint) == ("counter", "4", wf.fingerprint)
        assert info.python_version == platform.python_version() and info.agentsaga_version
        assert info.schema_version == 1 and info.created_at == fake_time.now
        assert info.size_bytes == len(stored.state.encode()) and info.sha256 == stored.sha256
        assert info.validity == "unchecked"
    # And the configuration hash changes with the snapshot settings, not from run to run
    other = orc_factory(wf, snapshot_every=5, keep_snapshots=10)
    other.run(wf, {"n": 0}, run_id="cat2")
    orc.run(wf, {"n": 0}, run_id="cat3")
    assert orc.snapshots("cat3")[0].config_hash == catalog[0].config_hash != other.snapshots("cat2")[0].config_hash


def test_recovery_reads_only_the_newest_snapshot_that_verifies(orc_factory):
    # Given an interrupted run with several snapshots kept
    orc = orc_factory(snapshot_every=2, keep_snapshots=10)
    interrupted(orc, "one", 12, stop_at=8)
    assert len(orc.snapshots("one")) >= 3
    newest = orc.snapshots("one")[0].seq
    # When another process resumes it, counting the snapshot states it reads
    other = orc_factory(counter_workflow(12))
    read: list[int] = []
    real_snapshot = other.store.snapshot
    other.store.snapshot = lambda run_id, seq: read.append(seq) or real_snapshot(run_id, seq)
    other.store.snapshots = lambda run_id: pytest.fail("recovery read every snapshot's state")
    result = other.resume("one")
    # Then it read exactly one chain of states: the newest and its bases back to a full snapshot
    # (incremental snapshots are the default), and finished as an uninterrupted run would
    assert result.state["n"] == 12 and result.state["seen"] == list(range(12))
    catalog = {s.seq: s for s in orc.snapshots("one")}
    chain = [newest]
    while catalog[chain[-1]].kind == "incremental":
        chain.append(catalog[chain[-1]].base_seq)
    assert len(chain) > 1 and read == chain
    assert resumed_kinds(orc, "one", "Resumed")[0]["snapshot_seq"] == newest


def test_recovery_marks_a_snapshot_that_does_not_verify_and_the_next_one_skips_it_unread(orc_factory, db_url):
    # Given an interrupted run whose newest snapshot's bytes were damaged
    orc = orc_factory(snapshot_every=2, keep_snapshots=10)
    interrupted(orc, "bad", 20, stop_at=6)
    newest = orc.snapshots("bad")[0].seq
    tamper_snapshot(db_url, "bad", newest, lambda s: s.update(seq=99), rehash=False)
    # When it is resumed and interrupted again before its next snapshot
    with pytest.raises(KeyboardInterrupt):
        orc_factory(counter_workflow(20, stop_at=7), snapshot_every=100).resume("bad")
    # Then the first recovery journaled why it skipped it and marked it failed in the catalog
    rejected = resumed_kinds(orc, "bad", "SnapshotRejected")
    assert [r["seq"] for r in rejected] == [newest] and "sha256 mismatch" in rejected[0]["reason"]
    info = {s.seq: s for s in orc.snapshots("bad")}[newest]
    assert info.validity == "failed" and "sha256 mismatch" in info.validity_reason
    # And the next recovery skips it without reading it, saying it is marked
    third = orc_factory(counter_workflow(20))
    read: list[int] = []
    real_snapshot = third.store.snapshot
    third.store.snapshot = lambda run_id, seq: read.append(seq) or real_snapshot(run_id, seq)
    result = third.resume("bad")
    assert newest not in read
    assert result.state == {"n": 20, "seen": list(range(20))}
    again = resumed_kinds(orc, "bad", "SnapshotRejected")[-1]
    assert again["seq"] == newest and again["reason"].startswith("marked failed in the catalog: sha256 mismatch")


# -- verify sets the flags ---------------------------------------------------------------------------
def test_verify_marks_each_snapshot_verified_failed_or_quarantined(orc_factory, db_url):
    # Given a finished run with four full snapshots: one's bytes damaged, one rewritten with its hash
    # recomputed (only the journal can tell), the others intact
    wf = counter_workflow(8, full_every=2)
    orc = orc_factory(wf, snapshot_every=2, keep_snapshots=10)
    orc.run(wf, {"n": 0}, run_id="v")
    seqs = sorted(s.seq for s in orc.snapshots("v"))
    broken, rehashed = seqs[0], seqs[1]
    tamper_snapshot(db_url, "v", broken, lambda s: s["state"].update(n=-1), rehash=False)
    tamper_snapshot(db_url, "v", rehashed, lambda s: s["state"].update(n=-1), rehash=True)
    # When it is verified without marking, nothing changes in the catalog
    assert not orc.verify("v", mark=False).ok
    assert {s.validity for s in orc.snapshots("v")} == {"unchecked"}
    # When it is verified
    report = orc.verify("v")
    # Then the catalog holds each verdict and why
    flags = {s.seq: (s.validity, s.validity_reason) for s in orc.snapshots("v")}
    assert flags[broken][0] == "failed" and "sha256 mismatch" in flags[broken][1]
    assert flags[rehashed][0] == "quarantined" and "differs from the fold" in flags[rehashed][1]
    assert all(flags[s] == ("verified", None) for s in seqs[2:])
    assert {v[0]: v[1] for v in report.verdicts} == {s: f[0] for s, f in flags.items()}


def test_the_cli_lists_the_catalog_marks_it_by_verify_and_quarantines_by_hand(orc_factory, db_url):
    # Given a finished run with snapshots every 3 events
    wf = counter_workflow(6)
    orc = orc_factory(wf, snapshot_every=3, keep_snapshots=10)
    orc.run(wf, {"n": 0}, run_id="cli")
    seqs = sorted(s.seq for s in orc.snapshots("cli"))
    # When `agentsaga snapshots` lists it
    listed = agentsaga("snapshots", "cli", db=db_url)
    # Then every snapshot is a row with its trigger, validity and workflow
    assert listed.returncode == 0, listed.stderr
    assert "VALIDITY" in listed.stdout and "counter@4" in listed.stdout and "final" in listed.stdout
    assert listed.stdout.count("unchecked") == len(seqs)
    # When `agentsaga verify` runs, the verdicts are recorded and said
    verified = agentsaga("verify", "cli", db=db_url)
    assert verified.returncode == 0, verified.stderr
    assert "catalog (recorded in the catalog): " in verified.stdout
    as_json = [json.loads(line) for line in agentsaga("snapshots", "cli", "--json", db=db_url).stdout.splitlines()]
    assert {row["validity"] for row in as_json} == {"verified"} and len(as_json) == len(seqs)
    # When a person quarantines the oldest one, with a reason
    done = agentsaga("snapshots", "cli", "--quarantine", str(seqs[0]), "--reason", "suspect disk", db=db_url)
    assert done.returncode == 0, done.stderr
    assert f"seq {seqs[0]} quarantined at " in done.stdout and "suspect disk" in done.stdout
    # Then a later verify keeps that mark
    agentsaga("verify", "cli", db=db_url)
    assert {s.seq: s.validity for s in orc.snapshots("cli")}[seqs[0]] == "quarantined"
    # And bad requests are one-line errors naming what is wrong
    assert_one_line_error(agentsaga("snapshots", "cli", "--quarantine", "999", "--reason", "x", db=db_url),
                          "no snapshot at seq 999")
    assert_one_line_error(agentsaga("snapshots", "cli", "--quarantine", "1", db=db_url), "--reason")
    assert_one_line_error(agentsaga("snapshots", "ghost", db=db_url), "ghost")


def test_a_quarantined_snapshot_is_skipped_by_recovery_which_says_so(orc_factory):
    # Given an interrupted run whose newest snapshot a person set aside
    orc = orc_factory(snapshot_every=2, keep_snapshots=10)
    interrupted(orc, "q", 10, stop_at=5)
    newest = orc.snapshots("q")[0].seq
    orc.quarantine("q", newest, reason="written during the disk incident")
    with pytest.raises(RunStateError, match="no snapshot at seq 4242"):
        orc.quarantine("q", 4242, reason="x")
    # When it is resumed
    result = orc_factory(counter_workflow(10)).resume("q")
    # Then it finishes from an older snapshot, and the journal says which one was skipped and why
    assert result.state["n"] == 10
    rejected = resumed_kinds(orc, "q", "SnapshotRejected")
    assert rejected == [{"seq": newest, "reason": "marked quarantined in the catalog: written during the disk incident"}]
    resumed = resumed_kinds(orc, "q", "Resumed")[0]
    assert 0 < resumed["snapshot_seq"] < newest
    # And the person's mark stands
    assert {s.seq: s.validity for s in orc.snapshots("q")}[newest] == "quarantined"
