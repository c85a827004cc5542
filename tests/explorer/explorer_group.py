"""The group flow: several runs driven at once in one process, so that their commits are grouped.

While one process drives more than one run on its event loop, a run's async commits go to the
group committer (``orchestrator/engine/groupcommit.py``): a lane thread writes whatever is queued
as one ``store.append_many`` transaction, each run fenced by its own token; a run's first
transaction (``create_run``) is made on a creator thread. The single-run flows never take that
path. Here three runs of one workflow are driven together (``asyncio.gather`` of ``arun``):

- ``reserve``: an effect, a car booked through ``ctx.http`` (the body names the run);
- two parallel async branches: ``quote`` (an async durable call, grouped like a completion) and
  ``confirm`` (a synchronous durable call, queued behind its sibling's commit while that one is
  pending; then run ``r2``'s card is declined: its saga cancels its car while the others go on);
- ``wrap``, the join.

A *lockstep* holds each run's step, once its outside-world calls are done, until every run driven
beside it got to the same place (or ended), then releases them all in one turn of the event loop:
their completions reach the committer together and are written in one transaction (an
uninterrupted run shows it: ``append_many`` carries the events of several runs). Only the process
that starts the group is held in lockstep; its successors drive what is left as they find it.

How the runs interleave otherwise (when each lane wakes, which run's call goes first) is the
scheduler's, so a crash point here is *named*, not counted: ``before r2 StepCompleted:reserve`` is
the moment before the transaction that carries that append of r2, whichever path it takes (grouped
with the others, or direct) and whatever else it carries; ``send POST /cars?run=r2`` is r2's
request about to leave. The uninterrupted reference lists every such name once per occurrence, in
every run: that list is what the sweeps enumerate.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from explorer_harness import World, abandon, make_orchestrator
from explorer_process import CURRENT, LEASE_TTL, T0, Plan, Process, ProcessDied
from explorer_store import run_tag, watch_committer

from orchestrator import Orchestrator, RunResult
from orchestrator.engine import TERMINAL_STATUSES
from orchestrator.testing import BookingService, FakeClock
from store import RunNotFoundError
from workflows import END, Workflow

#: the runs of the group (their ids are ``BASE.r1`` ...), and the one whose card is declined
RUNS = ("r1", "r2", "r3")
DECLINED = "r2"
STATUS = {"r1": "completed", "r2": "compensated", "r3": "completed"}
#: the steps in the order the lockstep wakes them
ORDER = ("reserve", "quote", "confirm", "wrap")


class Lockstep:
    """Holds each step that arrives until every run of ``active`` has a step held (or ended), then
    lets them all go in the same turn of the event loop. A run not in ``active`` passes straight through."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.waiting: dict[tuple[str, str], asyncio.Future] = {}

    def begin(self, run_ids: Any) -> None:
        self.active = set(run_ids)
        self.waiting = {}

    async def arrive(self, run_id: str, step: str) -> None:
        if run_id not in self.active:
            return
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting[(run_id, step)] = future
        self._release(loop)
        await future

    def ended(self, run_id: str) -> None:
        self.active.discard(run_id)
        if self.waiting:
            self._release(asyncio.get_running_loop())

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.waiting or not self.active <= {run_id for run_id, _ in self.waiting}:
            return
        # Woken in the workflow's order (quote before confirm), run by run: the same order every time.
        held = [self.waiting[key] for key in sorted(self.waiting, key=lambda key: (ORDER.index(key[1]), key[0]))]
        self.waiting = {}

        def go() -> None:  # on the next turn: every held step wakes in the same turn
            for future in held:
                if not future.done():
                    future.set_result(None)

        loop.call_soon(go)


class Group:
    """The group's workflow, closed over one exploration's world and lockstep: ``reserve`` books a car
    (an effect); then two parallel async branches, ``quote`` (an async durable call) and ``confirm``
    (a synchronous durable call, then r2's card is declined); a join, ``wrap``. Each run's branches
    wake in the same turn, so a run's two appends can share a transaction, or the second queue
    behind the first (a failed one must stop the other)."""

    def __init__(self, world: World, *, careless: bool = False) -> None:
        """``careless``: the checker's broken world (test_checker.py): each execution of ``reserve``
        books with a fresh idempotency key, so a run re-sent after a crash books twice."""
        self.lockstep = Lockstep()
        lockstep = self.lockstep
        #: awaited by ``confirm`` before its synchronous call (see ``quote_queued``), or None
        self.confirm_gate: Callable[[str], Any] | None = None
        gate = self
        wf = Workflow("group", version="1")

        def cancel(ctx, effect):
            ctx.http.delete(f"{world.api}/cars/{effect.result['car']}?run={run_tag(ctx.run_id)}")

        @wf.step(start=True, effect=True, resend=True, compensate=cancel)
        async def reserve(ctx, state):
            world.executed(ctx)
            tag = run_tag(ctx.run_id)
            headers = {"Idempotency-Key": uuid.uuid4().hex} if careless else None
            booked = ctx.http.post(f"{world.api}/cars?run={tag}", json={"car": tag}, headers=headers).json()
            await lockstep.arrive(ctx.run_id, "reserve")
            return {"car": booked["id"]}

        @wf.step()
        async def quote(ctx, state):
            world.executed(ctx)
            tag = run_tag(ctx.run_id)
            await lockstep.arrive(ctx.run_id, "quote")

            async def ask() -> int:
                return 100 + int(tag[1:])

            # The async durable call: its CallCompleted is an async commit, grouped like a completion.
            return {"price": await ctx.adurable_call("quote", {"run": tag}, ask)}

        @wf.step()
        async def confirm(ctx, state):
            world.executed(ctx)
            tag = run_tag(ctx.run_id)
            await lockstep.arrive(ctx.run_id, "confirm")
            if gate.confirm_gate is not None:
                await gate.confirm_gate(ctx.run_id)
            # A synchronous durable call, made while the sibling's async one is still with the group
            # committer: its commit queues behind it (and must not be written if that one failed).
            ctx.durable_call("check", {"run": tag}, lambda: "ok")
            if tag == DECLINED:
                raise RuntimeError(f"the card of {tag} was declined")
            return {"confirmed": tag}

        @wf.step()
        async def wrap(ctx, state):
            world.executed(ctx)
            await lockstep.arrive(ctx.run_id, "wrap")
            return {"total": state["price"] + 1}

        wf.edge("reserve", "quote")
        wf.edge("reserve", "confirm")
        wf.edge(["quote", "confirm"], "wrap")
        wf.edge("wrap", END)
        self.workflow = wf


def one_lane(orc: Orchestrator) -> None:
    """Give ``orc`` a group committer of one lane. On Postgres it has four, each run's appends in the
    lane its id hashes to: three runs would mostly be written by different lanes, never together,
    and the flow is here to explore writes that carry several runs."""
    from orchestrator.engine.groupcommit import GroupCommitter

    journal = orc.engine.journal
    journal.committer.close()
    journal.committer = GroupCommitter(orc.store, lanes=1)


#: seconds a gate may wait for what it waits for before the exploration counts as hung
HANG = 120.0


def quote_queued(process: Any) -> Callable[[str], Any]:
    """``confirm``'s gate in the first drive: wait until the write carrying the run's ``quote`` call
    result has begun (its "before" moment was reached, grouped or direct), or the process died. So
    the synchronous call after it is made while that write is under way, and queues behind it,
    whatever the scheduler does: not in the same batch (the async call's guard runs on a thread of
    its own first, and a loaded machine could otherwise let both reach the lane together)."""

    async def gate(run_id: str) -> None:
        tag = run_tag(run_id)
        deadline = asyncio.get_running_loop().time() + HANG
        while process.dead is None:
            if any(f"{tag} CallCompleted:quote" in label for label in list(process.points)):
                return
            assert asyncio.get_running_loop().time() < deadline, f"{tag}'s quote never reached the committer"
            await asyncio.sleep(0.001)  # readiness, polled: the committer is on another thread

    return gate


def run_ids(base: str) -> list[str]:
    return [f"{base}.{tag}" for tag in RUNS]


def new_process(name: str, plan: Plan | None = None) -> Process:
    process = Process(name, plan or Plan())
    process.tag_runs = True
    return process


def drive_group(group: Group, world: World, orc: Orchestrator, process: Process, ids: list[str], *,
                takeover: str = "resume", lockstep: bool = True) -> dict[str, RunResult | BaseException]:
    """Drive the group's runs together on one event loop until each ends (or the process dies).

    Runs that do not exist yet are started (``arun``). Runs that exist are taken over with ``resume``
    (the lease at once), or with ``recover`` once the clock has passed the dead owner's lease, as a
    worker finding them would; a finished run just gives its result."""
    token = CURRENT.set(process)
    try:
        existing: dict[str, str] = {}
        for rid in ids:
            try:
                existing[rid] = orc.store.get_run(rid).status
            except RunNotFoundError:
                pass
        if takeover == "recover" and any(s not in TERMINAL_STATUSES for s in existing.values()):
            world.clock.advance(LEASE_TTL + 1)
            orc.recover()

        async def main() -> list[Any]:
            group.lockstep.begin(rid for rid in ids if lockstep and existing.get(rid) not in TERMINAL_STATUSES)

            async def one(rid: str) -> RunResult:
                try:
                    if rid not in existing:
                        return await orc.arun(group.workflow, {}, run_id=rid)
                    if takeover == "recover" or existing[rid] in TERMINAL_STATUSES:
                        # After recover, a run it left unfinished stays so: the check reports it.
                        return orc.result(rid)
                    return await orc.aresume(rid)
                finally:
                    group.lockstep.ended(rid)

            return await asyncio.gather(*(one(rid) for rid in ids), return_exceptions=True)

        results = asyncio.run(main())
        return dict(zip(ids, results, strict=True))
    finally:
        CURRENT.reset(token)


def created_runs(orc: Orchestrator, ids: list[str]) -> set[str]:
    created = set()
    for rid in ids:
        try:
            orc.store.get_run(rid)
        except RunNotFoundError:
            continue
        created.add(rid)
    return created


def close_group(orc: Orchestrator) -> None:
    """``abandon``, with the engine's lane and creator threads stopped too (a dead process's lanes can
    only meet its fence: every write it attempts raises ``ProcessDied``)."""
    try:
        orc.engine.close()
    except ProcessDied:
        pass
    abandon(orc)


@dataclass
class GroupOutcome:
    """The group's runs as the world saw them, to compare with the reference."""

    results: dict[str, RunResult]  # tag -> final result
    first: dict[str, Any]  # tag -> what the first process's drive returned (a result or an exception)
    ledger: list[dict[str, Any]]
    histories: dict[str, list[dict[str, Any]]]
    verify: dict[str, tuple[bool, str]]
    points: list[str]
    keys: list[tuple[str, ...]]
    processes: list[Process]
    violations: list[str]
    #: tag -> the run's journal right after a faulted first drive (before it was resumed)
    mid: dict[str, list[dict[str, Any]]]

    def batches(self) -> list[list[str]]:
        """The runs of each ``append_many`` the first process wrote (or attempted), in order."""
        return [sorted({k.split(" ")[1] for k in keys}) for label, keys in zip(self.points, self.keys, strict=True)
                if label.startswith("before append_many[")]


def targets(reference: GroupOutcome, *, writes_only: bool = False) -> list[tuple[str, int]]:
    """Every named moment of the reference, with its occurrence: (``before r2 StepCompleted:reserve``, 1)..."""
    seen: Counter[str] = Counter()
    out = []
    for keys in reference.keys:
        for key in keys:
            if writes_only and not key.startswith("before "):
                continue
            seen[key] += 1
            out.append((key, seen[key]))
    return out


def explore_group(url: str, base: str, plan: Plan, *, takeover: str = "resume",
                  child: Callable[[World], Any] | None = None, careless: bool = False) -> GroupOutcome:
    """One scenario of the group: a first process with ``plan`` drives the three runs together; if it
    died, a fresh process takes the runs over (``takeover``: ``resume``, or ``recover`` once their
    leases lapsed); if a write failed, the same process resumes the runs once the database answers.

    With ``child``, the first process is a real one: ``child(world)`` runs it (it SIGKILLs itself at
    the plan's moment) and returns once it is gone; this process then takes the runs over."""
    service = BookingService()
    service.start()
    try:
        world = World(service=service, clock=FakeClock(T0))
        group = Group(world, careless=careless)
        ids = run_ids(base)
        first = new_process("gen0", plan)
        processes = [first]
        orcs: list[Orchestrator] = []
        firsts: dict[str, Any] = {}
        mid: dict[str, list[dict[str, Any]]] = {}
        try:
            if child is not None:
                child(world)
                world.read_ledger()
                first.dead = f"{plan.target} #{plan.nth} (SIGKILL)"
            else:
                orcs.append(make_orchestrator(url, first, world, [group.workflow]))
                one_lane(orcs[0])
                watch_committer(orcs[0], first)
                group.confirm_gate = quote_queued(first)
                try:
                    firsts = drive_group(group, world, orcs[0], first, ids)
                except ProcessDied:
                    pass
                finally:
                    group.confirm_gate = None  # the first drive's interleaving only
            results: dict[str, Any] = dict(firsts)
            if first.dead is not None:
                for orc in orcs:
                    close_group(orc)
                orcs.clear()
                second = new_process("gen1")
                processes.append(second)
                orcs.append(make_orchestrator(url, second, world, [group.workflow]))
                results = drive_group(group, world, orcs[-1], second, ids, takeover=takeover, lockstep=False)
            elif any(isinstance(r, BaseException) for r in results.values()):
                # A process that met a failed write lives on, and resumes its runs once the database
                # answers; first, what the journals hold right after the fault.
                mid = {run_tag(rid): orcs[0].history(rid) if rid in created_runs(orcs[0], ids) else [] for rid in ids}
                results = drive_group(group, world, orcs[0], first, ids)
            reader = orcs[-1]
            final = {}
            for rid in ids:
                res = results[rid]
                final[run_tag(rid)] = res if isinstance(res, RunResult) else reader.result(rid)
            histories = {run_tag(rid): reader.history(rid) for rid in ids}
            verify = {}
            for rid in ids:
                report = reader.verify(rid)
                verify[run_tag(rid)] = (report.ok, "\n".join(report.lines()))
        finally:
            for orc in orcs:
                close_group(orc)
        return GroupOutcome(results=final, first={run_tag(r): v for r, v in firsts.items()}, ledger=service.ledger(),
                            histories=histories, verify=verify, points=list(first.points), keys=list(first.keys),
                            processes=processes, violations=list(world.violations), mid=mid)
    finally:
        threading.Thread(target=service.stop, name="explorer-service-stop", daemon=True).start()


# -- the invariants, for every run of the group ----------------------------------------------------------
def _bodies(ledger: list[dict[str, Any]]) -> dict[str, str]:
    """Booking id -> its logical request (the body names the run: ids depend on how the runs interleaved)."""
    return {e["id"]: json.dumps(e["body"], sort_keys=True) for e in ledger if e["action"] == "book"}


def _final(outcome: GroupOutcome, tag: str) -> tuple[str, str]:
    result = outcome.results[tag]
    text = json.dumps(result.state, sort_keys=True).replace(result.run_id, "RUN")
    for booking, body in _bodies(outcome.ledger).items():
        text = re.sub(f'"{re.escape(booking)}"', json.dumps(body), text)
    return result.status, text


def check_group(outcome: GroupOutcome, reference: GroupOutcome) -> list[str]:
    """What is wrong with ``outcome`` compared with the uninterrupted ``reference``, run by run."""
    problems = list(outcome.violations)
    bodies = _bodies(outcome.ledger)
    booked = Counter(bodies.values())
    for what, n in booked.items():
        if n > 1:
            problems.append(f"booking {what} took effect {n} times for one logical request")
    ref_booked = sorted(_bodies(reference.ledger).values())
    if sorted(booked.elements()) != ref_booked:
        problems.append(f"bookings {sorted(booked.elements())} differ from the reference's {ref_booked}")
    cancels = [bodies.get(e["id"], e["id"]) for e in outcome.ledger if e["action"] == "cancel"]
    for what, n in Counter(cancels).items():
        if n > 1:
            problems.append(f"booking {what} was cancelled {n} times")
    ref_bodies = _bodies(reference.ledger)
    ref_cancels = [ref_bodies[e["id"]] for e in reference.ledger if e["action"] == "cancel"]
    if sorted(cancels) != sorted(ref_cancels):
        problems.append(f"compensations {cancels} differ from the reference's {ref_cancels}")
    for tag in RUNS:
        history = outcome.histories[tag]
        seqs = [e["seq"] for e in history]
        if seqs != list(range(1, len(seqs) + 1)):
            problems.append(f"run {tag}: the journal's seqs are not 1..n: {seqs}")
        done = Counter(e["data"]["effect"] for e in history if e["kind"] == "CompensationCompleted")
        for seq, n in done.items():
            if n > 1:
                problems.append(f"run {tag}: the effect journaled at seq {seq} was compensated {n} times")
        if _final(outcome, tag) != _final(reference, tag):
            res, ref = outcome.results[tag], reference.results[tag]
            problems.append(f"run {tag}: final {res.status} {res.state} ({res.error}) differs from the reference's "
                            f"{ref.status} {ref.state}")
        ok, text = outcome.verify[tag]
        if not ok:
            problems.append(f"run {tag}: verify is not clean: {text}")
    return problems


def check_fault(outcome: GroupOutcome, target: str, mode: str) -> list[str]:
    """A fault's own promises: the runs it did not touch went on to their end in the same drive; the
    runs it touched hold exactly what the fault let through (nothing of a refused write, all of a
    write whose reply was lost), with no gap, right after it."""
    first = outcome.processes[0]
    if first.faulted is None:
        return ["the write was never reached"]
    problems = []
    tag = re.findall(r"\br\d\b", target)[0]
    items = first.fault_items
    touched = {tag} if mode in ("item", "fence") and not first.fault_whole else (set(items) or {tag})
    for other in RUNS:
        if other in touched:
            continue
        res = outcome.first.get(other)
        if not isinstance(res, RunResult) or res.status != STATUS[other]:
            problems.append(f"run {other}, untouched by the fault, did not go on to its end: {res!r}")
    for run, seqs in items.items():
        journal = {e["seq"] for e in outcome.mid.get(run, [])}
        written = [s for s in seqs if s in journal]
        should = mode == "lost" or run not in touched
        if should and written != seqs:
            problems.append(f"run {run}: seqs {seqs} of the faulted write should be journaled, found {written}")
        if not should and written:
            problems.append(f"run {run}: seqs {written} of the refused write were journaled (half-written)")
    for run, history in outcome.mid.items():
        seqs = [e["seq"] for e in history]
        if seqs != list(range(1, len(seqs) + 1)):
            problems.append(f"run {run}: right after the fault its journal's seqs are not 1..n: {seqs}")
    return problems


def check_group_reference(reference: GroupOutcome) -> None:
    """The uninterrupted group keeps the rules the others are held to, and its commits were grouped."""
    for tag in RUNS:
        res = reference.results[tag]
        assert res.status == STATUS[tag], (tag, res.status, res.error)
        assert reference.verify[tag][0], reference.verify[tag][1]
    assert not reference.violations, reference.violations
    assert not check_group(reference, reference)
    # The point of this flow: at least one transaction carried the events of several runs.
    assert any(len(runs) > 1 for runs in reference.batches()), reference.points
    cancels = [e for e in reference.ledger if e["action"] == "cancel"]
    assert [_bodies(reference.ledger)[e["id"]] for e in cancels] == [json.dumps({"car": DECLINED})], cancels
