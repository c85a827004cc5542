"""Incremental snapshots and signed snapshots, on SQLite and Postgres.

- a growing conversation is snapshotted as chains: incremental links (the appended tail only)
  closed by a full snapshot every K links; each link names its base's seq and sha256;
- the fold property over chains (hypothesis): whatever the updates, reducers and schedule, every
  snapshot rebuilt from its chain equals the fold of the journal at its seq, and a restore from
  the newest chain plus the events after it equals the fold of every event; a corrupted link is
  skipped with everything built on it, and the restore falls back to an older snapshot (or none);
- retention never leaves an incremental without its base chain;
- with a signing key every snapshot is signed, and one edited in the database with its sha256
  recomputed (or one never signed) is refused by a recovery, which says so.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import tamper_snapshot

from orchestrator.engine.fold import fold
from orchestrator.engine.snapshots import resolve_chains
from orchestrator.payload import codec
from workflows import END, Snapshots, Workflow, reducers


def conversation(turns: int, *, stop_at: int | None = None, every: int = 2, links: int | None = 3,
                 keep: int = 100) -> Workflow:
    """One ~200-byte message appended per step; ``stop_at`` "kills" the process at that turn."""
    wf = Workflow("talk", reducers={"messages": reducers.append},
                  snapshots=Snapshots(every=every, incremental=links, keep=keep), max_visits=turns + 1)

    @wf.step(start=True)
    def say(ctx, state):
        turn = len(state.get("messages", []))
        if turn == stop_at:
            raise KeyboardInterrupt  # the run stays running, leased
        return {"messages": {"turn": turn, "text": "m" * 200}, "turns": turn + 1}

    wf.route("say", lambda s: "say" if s["turns"] < turns else END)
    return wf


def folded_at(orc, run_id: str, wf: Workflow, seq: int | None = None) -> dict:
    events = orc.store.events(run_id, until_seq=seq)
    return fold(((e.seq, e.kind, codec.loads(e.data)) for e in events), wf.reduce).to_json()


def first_resumed(orc, run_id: str) -> dict:
    return next(e["data"] for e in orc.history(run_id) if e["kind"] == "Resumed")


def chain_of(catalog, seq: int) -> list[int]:
    by_seq = {s.seq: s for s in catalog}
    chain = [seq]
    while by_seq[chain[-1]].kind == "incremental":
        chain.append(by_seq[chain[-1]].base_seq)
    return chain


# -- chains -----------------------------------------------------------------------------------------
def test_a_growing_conversation_is_snapshotted_as_chains_of_appended_tails(orc_factory):
    # Given a conversation snapshotted every 2 events, a full snapshot closing each chain after 3 links
    wf = conversation(20)
    orc = orc_factory(wf)
    # When it runs to the end
    assert orc.run(wf, {}, run_id="c").status == "completed"
    catalog = sorted(orc.snapshots("c"), key=lambda s: s.seq)
    # Then the kinds follow the declared bound: full, then 3 incrementals, then full again, ...
    kinds = [s.kind for s in catalog]
    assert kinds[:8] == ["full", "incremental", "incremental", "incremental"] * 2
    # And each link names its base (the previous snapshot) by seq and sha256, and its chain's full snapshot
    for before, link in itertools.pairwise(catalog):
        if link.kind == "incremental":
            assert (link.base_seq, link.base_sha256) == (before.seq, before.sha256)
            assert link.root_seq == max(s.seq for s in catalog if s.kind == "full" and s.seq < link.seq)
        else:
            assert link.base_seq is None and link.root_seq == link.seq
    # And a link stores only the tail appended since its base, not the conversation so far
    first_link = catalog[1]
    doc = codec.loads(orc.store.snapshot("c", first_link.seq).state)
    assert [m["turn"] for m in doc["append"]["messages"]] == [1, 2] and "messages" not in doc["set"]
    assert all(s.size_bytes < 1000 for s in catalog if s.kind == "incremental")
    assert max(s.size_bytes for s in catalog if s.kind == "full") > 3000
    # And every snapshot rebuilt from its chain is the fold of the journal at its seq
    assert orc.verify("c").ok


def test_a_recovery_reads_the_newest_chain_and_resumes_as_if_uninterrupted(orc_factory):
    # Given a conversation interrupted at turn 9 with incremental snapshots
    orc = orc_factory()
    with pytest.raises(KeyboardInterrupt):
        orc.run(conversation(14, stop_at=8), {}, run_id="r")
    catalog = orc.snapshots("r")
    newest = catalog[0]
    assert newest.kind == "incremental"
    # When another process resumes it
    other = orc_factory(conversation(14))
    read: list[int] = []
    real = other.store.snapshot
    other.store.snapshot = lambda run_id, seq: read.append(seq) or real(run_id, seq)
    result = other.resume("r")
    # Then it read the newest snapshot's chain and nothing else, and replayed only the events after it
    assert read == chain_of(catalog, newest.seq)
    resumed = first_resumed(orc, "r")
    assert resumed["snapshot_seq"] == newest.seq
    assert [m["turn"] for m in result.state["messages"]] == list(range(14))


def test_a_corrupted_link_is_skipped_with_what_depends_on_it_and_recovery_falls_back(orc_factory, db_url):
    # Given an interrupted conversation whose middle link was damaged in the database
    orc = orc_factory()
    with pytest.raises(KeyboardInterrupt):
        orc.run(conversation(30, stop_at=7), {}, run_id="x")
    catalog = orc.snapshots("x")
    newest = catalog[0]
    chain = chain_of(catalog, newest.seq)
    assert len(chain) >= 3
    bad = chain[1]
    tamper_snapshot(db_url, "x", bad, lambda s: s.update(seq=s["seq"] + 1000), rehash=False)
    # When it is resumed
    result = orc_factory(conversation(30)).resume("x")
    # Then the damaged link and the newer link built on it were rejected, and said so in the journal
    rejected = {e["data"]["seq"]: e["data"]["reason"] for e in orc.history("x") if e["kind"] == "SnapshotRejected"}
    assert set(rejected) == {newest.seq, bad}
    assert "sha256 mismatch" in rejected[bad] and f"chain is broken at seq {bad}" in rejected[newest.seq]
    # And the catalog marks them failed, so the next recovery skips them unread
    flags = {s.seq: s.validity for s in orc.snapshots("x")}
    assert flags[bad] == flags[newest.seq] == "failed"
    # And the recovery used the newest snapshot not built on the bad link, plus the events after it
    resumed = first_resumed(orc, "x")
    assert resumed["snapshot_seq"] == chain[2]
    assert [m["turn"] for m in result.state["messages"]] == list(range(30))


def test_a_bad_full_snapshot_leaves_its_chain_unusable_and_the_events_alone_rebuild_the_state(orc_factory, db_url):
    # Given an interrupted run with one chain, whose full snapshot was damaged
    orc = orc_factory()
    with pytest.raises(KeyboardInterrupt):
        orc.run(conversation(20, stop_at=6, links=10), {}, run_id="f")
    catalog = orc.snapshots("f")
    [full] = [s.seq for s in catalog if s.kind == "full"]
    tamper_snapshot(db_url, "f", full, lambda s: s.update(tick=99), rehash=False)
    # When it is resumed
    result = orc_factory(conversation(20, links=10)).resume("f")
    # Then every snapshot was rejected and the state was folded from the journal alone
    rejected = {e["data"]["seq"] for e in orc.history("f") if e["kind"] == "SnapshotRejected"}
    assert rejected == {s.seq for s in catalog}
    resumed = first_resumed(orc, "f")
    assert resumed["snapshot_seq"] == 0
    assert [m["turn"] for m in result.state["messages"]] == list(range(20))


# -- the fold property over chains ---------------------------------------------------------------
def _bag(current, update):
    """A user's reducer that changes the current value in place (allowed: it is deterministic)."""
    bag = current if isinstance(current, dict) else {}
    bag.update(update)
    return bag


_FIELDS = {
    "log": st.integers(0, 9),                                       # append
    "items": st.lists(st.integers(0, 9), max_size=3),               # extend
    "n": st.integers(-5, 5),                                        # add
    "meta": st.dictionaries(st.sampled_from("abc"), st.integers(0, 3), max_size=2),  # merge
    "name": st.one_of(st.none(), st.text("xyz", max_size=3), st.lists(st.integers(0, 3), max_size=2)),  # replace
    "bag": st.dictionaries(st.sampled_from("pq"), st.integers(0, 3), max_size=2),   # in place
}
_RUNS = itertools.count()
updates = st.lists(st.fixed_dictionaries({}, optional=_FIELDS), min_size=1, max_size=14)


def property_workflow(plan: list[dict], every: int, links: int) -> Workflow:
    wf = Workflow("prop", max_visits=len(plan) + 2,
                  reducers={"log": reducers.append, "items": reducers.extend, "n": reducers.add,
                            "meta": reducers.merge, "bag": _bag},
                  snapshots=Snapshots(every=every, incremental=links, keep=1000))

    @wf.step(start=True)
    def step(ctx, state):
        i = state["i"]
        return {**plan[i], "i": i + 1}

    wf.route("step", lambda s: "step" if s["i"] < len(plan) else END)
    return wf


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=updates, every=st.integers(1, 4), links=st.integers(1, 4), data=st.data())
def test_fold_property_every_chain_rebuilds_the_fold_and_a_bad_link_falls_back(orc_factory, db_url, plan, every,
                                                                              links, data):
    wf = property_workflow(plan, every, links)
    orc = orc_factory(wf)
    run_id = f"p{next(_RUNS)}"
    assert orc.run(wf, {"i": 0}, run_id=run_id).status == "completed"
    stored = orc.store.snapshots(run_id)
    # Every snapshot, rebuilt from its chain, is the fold of the journal at its seq
    rebuilt, problems = resolve_chains(stored)
    assert problems == {}
    for snap in rebuilt:
        assert codec.loads(snap.state) == folded_at(orc, run_id, wf, snap.seq)
    # And a restore (newest chain + events after it) is the fold of every event
    everything = folded_at(orc, run_id, wf)
    restored, _, rejected = orc.engine.restore(run_id, wf)
    assert restored.to_json() == everything and rejected == []
    # When any one link is damaged, the restore skips it and whatever is built on it, and still folds right
    bad = data.draw(st.sampled_from([s.seq for s in stored]))
    tamper_snapshot(db_url, run_id, bad, lambda s: s.update(seq=-1), rehash=False)
    restored, snap_seq, rejected = orc.engine.restore(run_id, wf)
    assert restored.to_json() == everything
    catalog = orc.snapshots(run_id)
    depends = {s.seq for s in catalog if bad in chain_of(catalog, s.seq)}
    assert snap_seq not in depends and {seq for seq, _ in rejected} <= depends
    if catalog[0].seq in depends:  # the newest is built on the bad link: both are named
        assert {bad, catalog[0].seq} <= {seq for seq, _ in rejected}


def parallel_workflow(plan: list[tuple[dict, dict]], every: int, links: int) -> Workflow:
    """Each round, two parallel branches return their updates: a snapshot between the two
    completions holds one branch's update not yet merged (it merges when the tick ends)."""
    wf = Workflow("prop_par", max_visits=len(plan) + 2,
                  reducers={"log": reducers.append, "items": reducers.extend, "n": reducers.add,
                            "meta": reducers.merge, "bag": _bag},
                  snapshots=Snapshots(every=every, incremental=links, keep=1000))

    @wf.step(start=True)
    def step(ctx, state):
        return {"i": state["i"] + 1}

    @wf.step()
    def left(ctx, state):
        return plan[state["i"] - 1][0]

    @wf.step()
    def right(ctx, state):
        return plan[state["i"] - 1][1]

    wf.route("step", lambda s: ["left", "right"] if s["i"] <= len(plan) else END,
             targets=["left", "right", END])
    wf.edge("left", "step")
    wf.edge("right", "step")
    return wf


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.fixed_dictionaries({}, optional=_FIELDS), st.fixed_dictionaries({}, optional=_FIELDS)),
                     min_size=1, max_size=6),
       every=st.integers(1, 3), links=st.integers(1, 3))
def test_fold_property_holds_with_parallel_branches_merged_between_snapshots(orc_factory, plan, every, links):
    wf = parallel_workflow(plan, every, links)
    orc = orc_factory(wf)
    run_id = f"q{next(_RUNS)}"
    assert orc.run(wf, {"i": 0}, run_id=run_id).status == "completed"
    rebuilt, problems = resolve_chains(orc.store.snapshots(run_id))
    assert problems == {}
    for snap in rebuilt:
        assert codec.loads(snap.state) == folded_at(orc, run_id, wf, snap.seq)
    if every == 1:  # a snapshot after every commit: some fell between the two branches' completions
        assert any(codec.loads(snap.state)["done"] for snap in rebuilt)
    restored, _, rejected = orc.engine.restore(run_id, wf)
    assert restored.to_json() == folded_at(orc, run_id, wf) and rejected == []


# -- retention ---------------------------------------------------------------------------------------
def test_keeping_the_newest_k_keeps_their_base_chains(orc_factory):
    # Given a conversation whose policy keeps the newest 2 snapshots, chains of 3 links
    wf = conversation(24, keep=2)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="k").status == "completed"
    catalog = orc.snapshots("k")
    # Then the newest 2 are kept with every link their chains need, and nothing older than that
    needed = set(chain_of(catalog, catalog[0].seq)) | set(chain_of(catalog, catalog[1].seq))
    assert {s.seq for s in catalog} == needed
    assert orc.verify("k").ok
    # When gc keeps only the newest one of this finished run
    orc.gc(keep_snapshots=1)
    catalog = orc.snapshots("k")
    # Then its chain is kept whole, and it still rebuilds the run's state
    assert {s.seq for s in catalog} == set(chain_of(catalog, catalog[0].seq))
    assert orc.verify("k").ok and orc.result("k").state["turns"] == 24


def test_a_savepoint_of_a_run_snapshotted_incrementally_holds_a_self_contained_snapshot(orc_factory, tmp_path):
    # Given a run whose newest snapshot is an incremental link
    orc = orc_factory()
    with pytest.raises(KeyboardInterrupt):
        orc.run(conversation(12, stop_at=7), {}, run_id="s")
    newest = orc.snapshots("s")[0]
    assert newest.kind == "incremental"
    # When a savepoint is written
    path = orc.savepoint("s", name="move", path=tmp_path / "s.savepoint.json.gz")
    # Then it carries the whole state at that seq, rebuilt from the chain, with the sha256 of that
    import gzip
    import hashlib
    import json

    doc = json.loads(gzip.decompress(path.read_bytes()))
    snap = doc["snapshot"]
    assert snap["seq"] == newest.seq and hashlib.sha256(snap["state"].encode()).hexdigest() == snap["sha256"]
    assert codec.loads(snap["state"]) == folded_at(orc, "s", conversation(12), newest.seq)


# -- signed snapshots ----------------------------------------------------------------------------------
def test_with_a_key_every_snapshot_is_signed_and_an_edit_with_its_hash_recomputed_is_refused(orc_factory, db_url):
    # Given an interrupted run written by processes holding a signing key
    key = "snapshot-key"
    orc = orc_factory(signing_key=key)
    with pytest.raises(KeyboardInterrupt):
        orc.run(conversation(16, stop_at=8), {}, run_id="h")
    catalog = orc.snapshots("h")
    assert catalog and all(s.signature for s in catalog)
    # When someone edits the newest snapshot in the database and recomputes its sha256
    newest = catalog[0].seq
    tamper_snapshot(db_url, "h", newest, lambda s: s["run"].update(tick=99), rehash=True)
    # Then a recovery with the key refuses it, says why, marks it, and folds from an older one
    result = orc_factory(conversation(16), signing_key=key).resume("h")
    rejected = [e["data"] for e in orc.history("h") if e["kind"] == "SnapshotRejected"]
    assert [r["seq"] for r in rejected] == [newest] and "signature does not match" in rejected[0]["reason"]
    assert {s.seq: s.validity for s in orc.snapshots("h")}[newest] == "failed"
    resumed = first_resumed(orc, "h")
    assert 0 < resumed["snapshot_seq"] < newest
    assert [m["turn"] for m in result.state["messages"]] == list(range(16))


def test_with_a_key_an_unsigned_snapshot_is_refused(orc_factory):
    # Given an interrupted run whose snapshots were written without a key
    orc = orc_factory()
    with pytest.raises(KeyboardInterrupt):
        orc.run(conversation(10, stop_at=5), {}, run_id="u")
    assert all(s.signature is None for s in orc.snapshots("u"))
    # When a process with a key resumes it
    result = orc_factory(conversation(10), signing_key=b"k").resume("u")
    # Then none was trusted, each said so, and the journal alone rebuilt the run
    rejected = [e["data"] for e in orc.history("u") if e["kind"] == "SnapshotRejected"]
    assert rejected and all("not signed" in r["reason"] for r in rejected)
    assert first_resumed(orc, "u")["snapshot_seq"] == 0
    assert [m["turn"] for m in result.state["messages"]] == list(range(10))
    # And verify with the key says the same of what is left unsigned
    report = orc_factory(conversation(10), signing_key=b"k").verify("u", mark=False)
    assert any("not signed" in p.message for p in report.problems)


def test_incremental_links_written_through_group_commits_keep_their_chain(orc_factory):
    # Given several async conversations driven at once (their commits share transactions: group
    # commit), snapshotting every 2 events in chains of 3
    import asyncio

    wf = Workflow("group_talk", reducers={"messages": reducers.append},
                  snapshots=Snapshots(every=2, incremental=3, keep=100), max_visits=20)
    gate = asyncio.Event()

    @wf.step(start=True)
    async def say(ctx, state):
        await gate.wait()
        turn = len(state.get("messages", []))
        return {"messages": {"turn": turn, "text": "m" * 200}, "turns": turn + 1}

    wf.route("say", lambda s: "say" if s["turns"] < 12 else END)
    orc = orc_factory(wf)
    grouped: list[int] = []
    real = orc.store.append_many

    def spy(appends):
        appends = list(appends)
        grouped.append(sum(1 for a in appends if a.get("snapshot") is not None))
        return real(appends)

    orc.store.append_many = spy

    async def main():
        runs = [asyncio.ensure_future(orc.arun(wf, {}, run_id=f"g{i}")) for i in range(6)]
        while orc.engine.journal.driving < 6:  # every run started (observable, no sleep)
            await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*runs)

    # When they run to the end
    results = asyncio.run(main())
    # Then snapshots went through group commits, with their kind, base and chain
    assert all(r.status == "completed" for r in results) and sum(grouped) > 0
    for i in range(6):
        catalog = sorted(orc.snapshots(f"g{i}"), key=lambda s: s.seq)
        assert "incremental" in {s.kind for s in catalog}
        for before, link in itertools.pairwise(catalog):
            if link.kind == "incremental":
                assert (link.base_seq, link.base_sha256) == (before.seq, before.sha256)
        # And every one of them rebuilds the fold at its seq
        assert orc.verify(f"g{i}").ok


def test_an_on_demand_snapshot_of_a_held_run_does_not_prune_the_chain_its_driver_builds_on(orc_factory):
    # Given a run held by a process (its lease alive), keeping 1 snapshot, its newest one a link
    orc = orc_factory()
    with pytest.raises(KeyboardInterrupt):
        orc.run(conversation(20, stop_at=8, keep=1), {}, run_id="d")
    before = {s.seq for s in orc.snapshots("d")}
    assert orc.snapshots("d")[0].kind == "incremental" and len(before) > 1
    # When another process takes an on-demand snapshot of it
    seq = orc_factory(conversation(20, keep=1)).snapshot("d")
    # Then it is written (full), and the chain the holder builds on is still all there
    catalog = {s.seq: s for s in orc.snapshots("d")}
    assert catalog[seq].kind == "full" and catalog[seq].trigger == "on_demand"
    assert before <= set(catalog)
