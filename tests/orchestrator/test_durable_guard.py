"""The lease check before an async durable call leaves the process (invariant 6), batched.

Async calls hand their lease check to a guard lane, which reads the current tokens of every run whose
call is waiting there in one statement. Each caller must still get its own verdict, from a read that
started after it asked.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from orchestrator import FencedError, Orchestrator
from orchestrator.engine.durable import CallGuard, _GuardLane
from store import RunNotFoundError
from workflows import END, Workflow


def test_of_several_runs_calling_at_once_only_the_one_taken_over_is_fenced(orc_factory):
    # Given three runs in one process, each booking a flight, then (once all three have) a hotel
    wf = Workflow("book-three")
    performed: list[tuple[str, str]] = []
    holder: dict[str, Orchestrator] = {}
    booked: list[str] = []
    all_booked = asyncio.Event()

    async def perform(run_id: str, what: str) -> str:
        performed.append((run_id, what))
        return f"{what}-{run_id}"

    @wf.step(start=True, effect=True)
    async def book(ctx, state):
        flight = await ctx.adurable_call("booking", {"what": "flight"}, lambda: perform(ctx.run_id, "flight"))
        booked.append(ctx.run_id)
        if len(booked) == 3:
            # And run b is taken over by another process while all three are about to ask for the hotel
            thief = holder["thief"]
            thief.store.leases.acquire("b", owner="thief", ttl=30, now=thief.engine.config.clock(), force=True)
            all_booked.set()
        await all_booked.wait()
        hotel = await ctx.adurable_call("booking", {"what": "hotel"}, lambda: perform(ctx.run_id, "hotel"))
        return {"flight": flight, "hotel": hotel}

    wf.edge("book", END)
    orc = orc_factory(wf)
    holder["thief"] = orc_factory(wf)

    # When the three are driven together
    async def drive() -> list:
        return await asyncio.gather(*(orc.arun(wf, {}, run_id=r) for r in "abc"), return_exceptions=True)

    a, b, c = asyncio.run(drive())
    # Then only run b is fenced, with an error naming it and both tokens
    assert isinstance(b, FencedError)
    assert (b.run_id, b.token, b.current_token) == ("b", 1, 2)
    assert "run 'b'" in str(b) and "token 1 is no longer current, 2 is" in str(b)
    # And its hotel request never left the process, while a's and c's did and they completed
    assert sorted(performed) == [("a", "flight"), ("a", "hotel"), ("b", "flight"), ("c", "flight"), ("c", "hotel")]
    assert (a.status, c.status) == ("completed", "completed")
    # And the journals say the same: b holds only its flight call
    for run_id, calls in (("a", ["flight", "hotel"]), ("b", ["flight"]), ("c", ["flight", "hotel"])):
        journaled = [e["data"]["request"]["what"] for e in orc.history(run_id) if e["kind"] == "CallCompleted"]
        assert journaled == calls, run_id


def test_a_call_whose_run_is_taken_over_while_it_is_out_is_not_journaled(orc_factory):
    # Given an async call during which another process takes the run over: its lease was current
    # when it left, and is not read again before its result is journaled
    wf = Workflow("taken-while-out")
    holder: dict[str, Orchestrator] = {}

    async def perform(ctx) -> str:
        thief = holder["thief"]
        thief.store.leases.acquire(ctx.run_id, owner="thief", ttl=30, now=thief.engine.config.clock(), force=True)
        return "F-1"

    @wf.step(start=True, effect=True)
    async def book(ctx, state):
        return {"flight": await ctx.adurable_call("booking", {"what": "flight"}, lambda: perform(ctx))}

    wf.edge("book", END)
    orc = orc_factory(wf)
    holder["thief"] = orc_factory(wf)
    # When the first owner records the call's result, Then the store refuses it (the append is fenced)
    with pytest.raises(FencedError) as fenced:
        orc.run(wf, {}, run_id="t1")
    assert (fenced.value.run_id, fenced.value.token, fenced.value.current_token) == ("t1", 1, 2)
    # And nothing of the call reached the journal
    assert [e["kind"] for e in orc.history("t1") if e["kind"].startswith("Call")] == []


class _Run:
    """What a guard knows of a run it drives: its id and its lease token."""

    def __init__(self, run_id: str, token: int) -> None:
        self.run_id = run_id
        self.token = token


class _HeldStore:
    """A store whose lease reads wait until released (so guards queue up behind one), and are recorded."""

    def __init__(self, store) -> None:
        self._store = store
        self.dialect = store.dialect
        self.url = store.url
        self.leases = self
        self.reads: list[list[str]] = []
        self.reading = threading.Event()
        self.release = threading.Event()

    def tokens(self, run_ids):
        self.reads.append(list(run_ids))
        self.reading.set()
        assert self.release.wait(timeout=60), "the test never released the held read"
        return self._store.leases.tokens(run_ids)


def test_a_batch_of_lease_checks_is_one_read_and_fences_only_the_run_taken_over_after_it_asked(store):
    # Given three leased runs, and a guard lane whose one worker is busy with an earlier read
    for run_id in ("r1", "r2", "r3", "earlier"):
        store.create_run(run_id=run_id, workflow="leased", version="1", fingerprint="fp", target="{}",
                         created_at=0.0, events=[], lease_owner="me", lease_ttl=1e9)
    held = _HeldStore(store)
    lane = _GuardLane(workers=1)

    def never_abandoned() -> None:
        """The in-memory part of the guard: this attempt is never abandoned."""

    async def check_all() -> list:
        first = lane.check(CallGuard(never_abandoned, held, _Run("earlier", 1)))
        await asyncio.get_running_loop().run_in_executor(None, held.reading.wait)
        # When three calls ask while the worker is busy, run r2 is taken over after they asked,
        # and the worker is then let go
        futures = [lane.check(CallGuard(never_abandoned, held, _Run(r, 1))) for r in ("r1", "r2", "r3")]
        store.leases.acquire("r2", owner="thief", ttl=30, now=1.0, force=True)
        held.release.set()
        await first
        return await asyncio.gather(*futures, return_exceptions=True)

    verdicts = asyncio.run(check_all())
    # Then the three were answered by one read, which started after the takeover
    assert held.reads == [["earlier"], ["r1", "r2", "r3"]]
    # And only r2 is fenced, named with both tokens; r1 and r3 may go on
    r1, r2, r3 = verdicts
    assert r1 is None and r3 is None
    assert isinstance(r2, FencedError)
    assert (r2.run_id, r2.token, r2.current_token) == ("r2", 1, 2)
    assert "run 'r2': the lease was taken over (token 1 is no longer current, 2 is)" in str(r2)


def test_a_lease_check_of_a_run_that_is_gone_names_the_run(store):
    # Given a guard for a run that does not exist in the store
    lane = _GuardLane(workers=1)

    async def check():
        await lane.check(CallGuard(lambda: None, store, _Run("ghost", 1)))

    # When its lease is checked, Then the error names the run
    with pytest.raises(RunNotFoundError, match="no run 'ghost'"):
        asyncio.run(check())
