"""Group commit: runs driven together on one event loop share transactions, and every guarantee of a
single commit holds for each of them. Runs on SQLite and on Postgres."""

from __future__ import annotations

import asyncio
import threading

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


def test_runs_started_together_are_created_in_shared_transactions(db_url):
    # Given a workflow, and one run of it that exists already (an earlier process made it)
    gate = asyncio.Event()
    wf = three_steps(gate, {})
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.start(wf, {}, run_id="c5")
        groups: list[list[str]] = []
        real = orc.store.create_runs

        def spy(creates):
            creates = list(creates)
            groups.append([c["run_id"] for c in creates])
            return real(creates)

        orc.store.create_runs = spy

        async def main():
            first = asyncio.ensure_future(orc.arun(wf, {}, run_id="c0"))
            while orc.engine.journal.driving < 1:  # driving: later runs are created through the lane
                await asyncio.sleep(0)
            runs = [first] + [asyncio.ensure_future(orc.arun(wf, {}, run_id=f"c{i}")) for i in range(1, RUNS)]
            while orc.engine.journal.driving < RUNS:
                await asyncio.sleep(0)
            gate.set()
            return await asyncio.gather(*runs)

        # When forty runs are started at once, one of them with the existing id
        results = asyncio.run(main())
        # Then every run completed once, the existing one continued (never started twice)
        assert all(r.status == "completed" for r in results)
        for i in range(RUNS):
            kinds = [e["kind"] for e in orc.history(f"c{i}")]
            assert kinds.count("RunStarted") == 1 and kinds.count("StepCompleted") == 3, (i, kinds)
        # And the new runs were created in shared transactions, each id offered once
        created = [run_id for group in groups for run_id in group]
        assert sorted(created) == sorted(f"c{i}" for i in range(1, RUNS)), created
        assert max(len(g) for g in groups) > 1, groups


def test_a_cancelled_run_lets_its_grouped_append_land_before_the_cancellation_goes_on(db_url):
    # Given two runs driven together, the victim's step completion about to be written in a group
    gate = asyncio.Event()
    wf = three_steps(gate, {})
    with Orchestrator(db_url, workflows=[wf]) as orc:
        real = orc.store.append_many
        tasks: dict[str, asyncio.Task] = {}
        asked = threading.Event()

        def spy(appends):
            appends = list(appends)
            victim = tasks.get("victim")
            if victim is not None and not asked.is_set() and any(a["run_id"] == "victim" for a in appends):
                # the victim's task is cancelled while its append is being written
                loop = victim.get_loop()
                loop.call_soon_threadsafe(lambda: (victim.cancel(), asked.set()))
                assert asked.wait(30)
            return real(appends)

        orc.store.append_many = spy

        async def main():
            other = asyncio.ensure_future(orc.arun(wf, {}, run_id="other"))
            while orc.engine.journal.driving < 1:
                await asyncio.sleep(0)
            tasks["victim"] = asyncio.ensure_future(orc.arun(wf, {}, run_id="victim"))
            while orc.engine.journal.driving < 2:
                await asyncio.sleep(0)
            gate.set()
            return await asyncio.gather(other, tasks["victim"], return_exceptions=True)

        # When the victim's task is cancelled during that write
        other, victim = asyncio.run(main())
        # Then the cancellation went on, after the write had landed: the journal holds the step's
        # completion, whole and in order, and resuming the run continues after it (never re-runs it)
        assert isinstance(victim, asyncio.CancelledError) and other.status == "completed"
        history = orc.history("victim")
        assert [e["seq"] for e in history] == list(range(1, len(history) + 1))
        done = [e["data"]["step"] for e in history if e["kind"] == "StepCompleted"]
        assert done and done == [f"s{i}" for i in range(len(done))]
        resumed = orc.resume("victim")
        assert resumed.status == "completed"
        again = [e["data"]["step"] for e in orc.history("victim") if e["kind"] == "StepCompleted"]
        assert again == ["s0", "s1", "s2"]


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the callbacks other threads hand it."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0

    def call_soon_threadsafe(self, callback, *args, context=None):
        self.handed += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


def test_each_group_commit_wakes_the_event_loop_once(db_url):
    # Given forty runs driven together whose steps finish at once
    gate = asyncio.Event()
    wf = three_steps(gate, {})
    with Orchestrator(db_url, workflows=[wf]) as orc:
        writes = []
        for name in ("append_many", "create_runs"):
            real = getattr(orc.store, name)
            setattr(orc.store, name, lambda items, real=real: writes.append(len(items)) or real(items))
        loop = CountingLoop()

        async def main():
            runs = [asyncio.ensure_future(orc.arun(wf, {}, run_id=f"w{i}")) for i in range(RUNS)]
            while orc.engine.journal.driving < RUNS:
                await asyncio.sleep(0)
            gate.set()
            return await asyncio.gather(*runs)

        try:
            results = loop.run_until_complete(main())
        finally:
            loop.close()
        # Then every run completed, and the loop was woken at most once per transaction written for
        # it, not once per run's append
        assert all(r.status == "completed" for r in results)
        appends = RUNS * 3
        assert sum(writes) >= appends and loop.handed <= len(writes) < appends, (loop.handed, writes)
