"""Group commit: runs driven together on one event loop share transactions, and every guarantee of a
single commit holds for each of them. Runs on SQLite and on Postgres."""

from __future__ import annotations

import asyncio

from orchestrator import Orchestrator
from store import FencedError
from workflows import END, Snapshots, Workflow

RUNS = 40


def three_steps(gate: asyncio.Event, thief: dict) -> Workflow:
    wf = Workflow("grouped")

    async def step(ctx, state, name):
        await gate.wait()  # every run reaches this step, then all finish it at once
        if ctx.run_id == thief.get("victim") and name == "s1":
            # another process takes this run's lease over while its step runs
            thief["store"].leases.acquire(ctx.run_id, owner="thief", ttl=30, now=ctx.now().timestamp(), force=True)
        return {name: ctx.run_id}

    for i in range(3):
        async def s(ctx, state, name=f"s{i}"):
            return await step(ctx, state, name)

        s.__name__ = f"s{i}"
        wf.step(name=f"s{i}", start=i == 0)(s)
        if i:
            wf.edge(f"s{i - 1}", f"s{i}")
    wf.edge("s2", END)
    return wf


def test_runs_finishing_together_share_transactions_and_each_is_fenced_alone(db_url):
    gate = asyncio.Event()
    thief: dict = {"victim": "r7"}
    wf = three_steps(gate, thief)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        thief["store"] = orc.store
        groups: list[set[str]] = []
        real = orc.store.append_many

        def spy(appends):  # the real method, its batches recorded
            appends = list(appends)
            groups.append({a["run_id"] for a in appends})
            return real(appends)

        orc.store.append_many = spy

        async def main():
            runs = [asyncio.ensure_future(orc.arun(wf, {}, run_id=f"r{i}")) for i in range(RUNS)]
            while orc.engine.journal.driving < RUNS:  # every run started (observable, no sleep)
                await asyncio.sleep(0)
            gate.set()
            return await asyncio.gather(*runs, return_exceptions=True)

        # When forty runs are driven at once and their steps finish together
        results = asyncio.run(main())
        # Then every run but the victim completed, each journal whole and in order
        for i, res in enumerate(results):
            run_id = f"r{i}"
            kinds = [e["kind"] for e in orc.history(run_id)]
            seqs = [e["seq"] for e in orc.history(run_id)]
            assert seqs == list(range(1, len(seqs) + 1)), run_id
            if run_id == "r7":
                # And the run whose lease was taken over was fenced: its step's completion is not journaled
                assert isinstance(res, FencedError), res
                assert kinds.count("StepCompleted") == 1
            else:
                assert not isinstance(res, BaseException), res
                assert res.status == "completed" and kinds.count("StepCompleted") == 3
                assert res.state == {"s0": run_id, "s1": run_id, "s2": run_id}
        # And completions of several runs were written in one transaction
        assert max(len(g) for g in groups) > 1, groups


def test_a_single_run_commits_without_the_group_committer(db_url):
    # Given one run driven alone
    gate = asyncio.Event()
    gate.set()
    wf = three_steps(gate, {})
    with Orchestrator(db_url, workflows=[wf]) as orc:
        calls = []
        real = orc.store.append_many
        orc.store.append_many = lambda appends: calls.append(appends) or real(appends)
        # When it runs
        res = orc.run(wf, {}, run_id="alone")
        # Then it completed with its appends written directly (no hand-off to another thread)
        assert res.status == "completed" and calls == []


def snapshotted(gate: asyncio.Event) -> Workflow:
    wf = Workflow("snapshotted", snapshots=Snapshots(every=2, gates=("s2",), keep=3))
    for i in range(5):
        async def s(ctx, state, name=f"s{i}"):
            await gate.wait()
            return {name: ctx.run_id}

        s.__name__ = f"s{i}"
        wf.step(name=f"s{i}", start=i == 0)(s)
        if i:
            wf.edge(f"s{i - 1}", f"s{i}")
    wf.edge("s4", END)
    return wf


def catalog(orc, run_id: str) -> list[tuple]:
    return [(s.seq, s.trigger, s.workflow, s.version, s.fingerprint, s.config_hash)
            for s in orc.store.snapshot_catalog(run_id)]


def test_grouped_commits_write_the_snapshots_a_run_driven_alone_writes(db_url):
    # Given a workflow whose policy snapshots every 2 events, at gate s2, keeping 3
    gate = asyncio.Event()
    gate.set()
    wf = snapshotted(gate)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # and the snapshots of one run driven alone (every commit written directly)
        assert orc.run(wf, {}, run_id="alone").status == "completed"
        alone = catalog(orc, "alone")
        assert alone and alone[0][1] == "final" and any(t == "gate:s2" for _, t, *_ in alone)
        assert len(alone) == 3 and {w for _, _, w, *_ in alone} == {"snapshotted"}
        grouped: list[int] = []
        real = orc.store.append_many

        def spy(appends):
            appends = list(appends)
            grouped.append(sum(a.get("snapshot") is not None for a in appends))
            return real(appends)

        orc.store.append_many = spy
        gate.clear()

        async def main():
            runs = [asyncio.ensure_future(orc.arun(wf, {}, run_id=f"g{i}")) for i in range(RUNS)]
            while orc.engine.journal.driving < RUNS:
                await asyncio.sleep(0)
            gate.set()
            return await asyncio.gather(*runs)

        # When forty runs of it are driven together (their commits grouped)
        results = asyncio.run(main())
        # Then each has the same snapshots, triggers and catalog metadata as the lone run, pruned to 3
        assert all(r.status == "completed" for r in results)
        for i in range(RUNS):
            assert catalog(orc, f"g{i}") == alone, f"g{i}"
        # And snapshots did ride in grouped transactions
        assert sum(grouped) > 0, grouped
