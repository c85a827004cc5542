"""The crash-point explorer's harness: one exploration's world, and the invariants it is held to.

``explore`` runs one scenario: a first simulated process (``Process``, explorer_process.py) with a
``Plan``, its store's writes instrumented (explorer_store.py); if it died or a write faulted, a
fresh process finishes the run. Its outgoing requests pass crash points while the caller is inside
``outgoing_calls_instrumented()`` (explorer_calls.py).

The world outside the database is a real ``BookingService`` on a loopback socket (its ledger
says which bookings and cancellations took effect), plus the ledger of step executions each step
writes as it starts. ``check`` holds a crashed-and-resumed run against an uninterrupted reference
run: no completed step executed again, no booking taken twice for one logical request, every
compensation exactly once and in the reference's (reverse) order, the same final status and
state, and ``verify`` clean.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from explorer_process import CURRENT, LEASE_TTL, T0, Plan, Process, ProcessDied
from explorer_store import instrument_store

from orchestrator import Orchestrator, RunResult
from orchestrator.engine import TERMINAL_STATUSES
from orchestrator.testing import BookingService, FakeClock
from store import RunNotFoundError, StoreUnavailableError, open_store


# -- one exploration's world ---------------------------------------------------------------------------
@dataclass
class World:
    """What one run meets outside its database: a booking service, a clock, the execution ledger."""

    service: BookingService
    clock: FakeClock
    chat_url: str | None = None
    #: (process, step, tick, epoch) of every step execution, in order
    executions: list[tuple[str, str, int, int]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    #: where a child process appends its executions and violations (they must outlive a SIGKILL)
    ledger_path: str | None = None
    failed_once: set[str] = field(default_factory=set)
    _seen: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def api(self) -> str:
        assert self.service.url is not None
        return self.service.url

    def flaky(self, what: str, value: Any) -> Any:
        """The outside world failing the first time it is asked for ``what`` (a step's retry covers it)."""
        if what not in self.failed_once:
            self.failed_once.add(what)
            raise ConnectionError(f"{what}: the service dropped the connection")
        return value

    def executed(self, ctx: Any) -> None:
        """A step body starts: fenced for a dead process; a step already completed must not run."""
        process = CURRENT.get()
        if process is None:
            raise RuntimeError("explorer flows run only inside a Process (see drive())")
        process.fence()
        epoch, completed = self._journal_seen(process.store, ctx.run_id)
        violation = None
        if (ctx.step, ctx.tick, epoch) in completed:
            violation = (f"step {ctx.step!r} (tick {ctx.tick}, epoch {epoch}) executed again by {process.name} "
                         "after its completion was journaled (invariant 1)")
            self.violations.append(violation)
        self.executions.append((process.name, ctx.step, ctx.tick, epoch))
        if self.ledger_path is not None:
            line = json.dumps({"process": process.name, "step": ctx.step, "tick": ctx.tick, "epoch": epoch,
                               "violation": violation})
            with open(self.ledger_path, "a", encoding="utf-8") as fh:  # one whole line, on disk before going on
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def read_ledger(self) -> None:
        """Take in what a child process wrote to the ledger file before it died."""
        if self.ledger_path is None or not os.path.exists(self.ledger_path):
            return
        with open(self.ledger_path, encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                self.executions.append((entry["process"], entry["step"], entry["tick"], entry["epoch"]))
                if entry["violation"]:
                    self.violations.append(entry["violation"])

    def _journal_seen(self, store: Any, run_id: str) -> tuple[int, set[tuple[str, int, int]]]:
        """The rollback epoch and the completed (step, tick, epoch) of the journal as it stands now (read
        incrementally: the journal is append-only)."""
        seen = self._seen.setdefault(run_id, {"seq": 0, "epoch": 0, "completed": set()})
        for e in store.events(run_id, after_seq=seen["seq"]):
            seen["seq"] = e.seq
            if e.kind == "RolledBack":
                seen["epoch"] += 1
            elif e.kind == "StepCompleted":
                data = json.loads(e.data)
                seen["completed"].add((data["step"], data["tick"], seen["epoch"]))
        return seen["epoch"], seen["completed"]


@dataclass
class Outcome:
    """A run as the world saw it, to compare with the reference."""

    result: RunResult
    ledger: list[dict[str, Any]]
    history: list[dict[str, Any]]
    verify_ok: bool
    verify_text: str
    points: list[str]
    processes: list[Process]
    violations: list[str]


def fast_url(url: str) -> str:
    """The URL with Postgres commits acknowledged before they reach the server's disk: a crash explored
    here is the *client* process dying, never the server, so what a commit makes visible is the same."""
    if not url.startswith(("postgresql", "postgres:")):
        return url
    if "options=" in url:
        return url.replace("options=", "options=-csynchronous_commit%3Doff%20", 1)
    return url + ("&" if "?" in url else "?") + "options=-csynchronous_commit%3Doff"


def make_orchestrator(url: str, process: Process, world: World, workflows: list[Any]) -> Orchestrator:
    # NORMAL in WAL loses nothing on a process crash (only on power loss), which is what is explored here.
    store = instrument_store(open_store(fast_url(url), sqlite_synchronous="NORMAL"), process)
    return Orchestrator(store=store, workflows=workflows, owner=f"explorer-{process.name}", clock=world.clock.clock,
                        sleep=world.clock.sleep, snapshot_every=5, keep_snapshots=2, lease_ttl=LEASE_TTL,
                        heartbeat=3600.0)


def abandon(orc: Orchestrator) -> None:
    """Free what a dead process left open, once the run has been checked (nothing it does reaches the run
    now: its writes are fenced off; this only returns its connections and stops its idle heartbeat)."""
    orc.engine.heartbeat.stop()
    orc.tools.close()
    orc.store.close()


def drive(flow: Any, world: World, orc: Orchestrator, process: Process, run_id: str, *,
          takeover: str = "resume") -> RunResult:
    """Start or continue the run as its scenario says, until it ends (or the process dies).

    A run that exists is taken over with ``resume`` (the lease at once, a new fencing token), or with
    ``recover`` once the clock has passed the dead owner's lease, as a worker finding it would."""
    token = CURRENT.set(process)
    try:
        try:
            record = orc.store.get_run(run_id)
        except RunNotFoundError:  # the run was never created
            result = orc.run(flow.workflow, flow.input(world), run_id=run_id)
        else:
            if takeover == "recover" and record.status not in TERMINAL_STATUSES:
                world.clock.advance(LEASE_TTL + 1)
                recovered = {r.run_id: r for r in orc.recover()}
                result = recovered[run_id] if run_id in recovered else orc.result(run_id)
            else:
                result = orc.resume(run_id)
        for _ in range(20):
            if result.status != "waiting":
                return result
            result = flow.outside(world, orc, run_id)
        raise AssertionError(f"run {run_id} still waiting after 20 moves of the outside world")
    finally:
        CURRENT.reset(token)


def explore(flow_factory: Callable[[World], Any], url: str, run_id: str, plan: Plan, *,
            chat_url: str | None = None, child: Callable[[World], Any] | None = None) -> Outcome:
    """Run one scenario: a first process with ``plan``; if it died or faulted, a fresh one finishes.

    With ``child``, the first process is a real one: ``child(world)`` runs it (it SIGKILLs itself at
    the plan's point) and returns once it is gone; this process then takes the run over."""
    service = BookingService()
    service.start()
    try:
        world = World(service=service, clock=FakeClock(T0), chat_url=chat_url)
        flow = flow_factory(world)
        flow.prepare(world)
        first = Process("gen0", plan)
        processes = [first]
        orcs: list[Orchestrator] = []
        result: RunResult | None = None
        try:
            if child is not None:
                child(world)
                world.read_ledger()
                first.dead = f"point {plan.at} (SIGKILL)"
            else:
                orcs.append(make_orchestrator(url, first, world, [flow.workflow]))
                try:
                    result = drive(flow, world, orcs[0], first, run_id)
                except ProcessDied:
                    pass
                except StoreUnavailableError:
                    if first.faulted is None:
                        raise
            if first.dead is not None:
                # Its connections die with it (the server sees them drop); threads it left behind are fenced.
                for orc in orcs:
                    abandon(orc)
                orcs.clear()
                # The dead process's successor: a new process with a store (and connections) of its own.
                second = Process("gen1")
                processes.append(second)
                orcs.append(make_orchestrator(url, second, world, [flow.workflow]))
                # Every other crash point, the successor recovers the run once its lease lapsed
                # instead of taking it over at once.
                takeover = "recover" if (plan.at or 0) % 2 == 0 else "resume"
                result = drive(flow, world, orcs[-1], second, run_id, takeover=takeover)
            elif result is None:
                # A process that met a failed write lives on, and resumes the run once the database answers.
                result = drive(flow, world, orcs[0], first, run_id)
            reader = orcs[-1]
            report = reader.verify(run_id)
            history = reader.history(run_id)
        finally:
            for orc in orcs:
                abandon(orc)
        return Outcome(result=result, ledger=service.ledger(), history=history, verify_ok=report.ok,
                       verify_text="\n".join(report.lines()), points=list(first.points), processes=processes,
                       violations=list(world.violations))
    finally:
        # Stopping waits for the server's poll interval: let it happen beside the next exploration.
        threading.Thread(target=service.stop, name="explorer-service-stop", daemon=True).start()


def only(flow: str) -> set[int] | None:
    """``EXPLORER_ONLY=flow:k[,k...]``: explore just those points of that flow (None: all of them)."""
    spec = os.environ.get("EXPLORER_ONLY")
    if not spec:
        return None
    name, _, ks = spec.partition(":")
    return {int(k) for k in ks.split(",")} if name == flow else set()


# -- the invariants ------------------------------------------------------------------------------------
def _body_id(entry: dict[str, Any]) -> str:
    return f"{entry['kind']} {json.dumps(entry.get('body'), sort_keys=True)}"


def _final(outcome: Outcome) -> tuple[str, str]:
    """The final status and state, the run's own id written as RUN (keys derived from it differ per run)."""
    state = json.dumps(outcome.result.state, sort_keys=True).replace(outcome.result.run_id, "RUN")
    return outcome.result.status, state


def check(outcome: Outcome, reference: Outcome) -> list[str]:
    """What is wrong with ``outcome`` compared with the uninterrupted ``reference`` (empty: nothing)."""
    problems = list(outcome.violations)
    booked = [e for e in outcome.ledger if e["action"] == "book"]
    for what, n in Counter(_body_id(e) for e in booked).items():
        if n > 1:
            problems.append(f"{what} took effect {n} times for one logical request")
    ref_booked = sorted(_body_id(e) for e in reference.ledger if e["action"] == "book")
    if sorted(_body_id(e) for e in booked) != ref_booked:
        problems.append(f"bookings {sorted(_body_id(e) for e in booked)} differ from the reference's {ref_booked}")
    cancels = [e["id"] for e in outcome.ledger if e["action"] == "cancel"]
    for what, n in Counter(cancels).items():
        if n > 1:
            problems.append(f"{what} was cancelled {n} times")
    ref_cancels = [e["id"] for e in reference.ledger if e["action"] == "cancel"]
    if cancels != ref_cancels:
        problems.append(f"compensations {cancels} differ from the reference's {ref_cancels} (order or count)")
    done = Counter(e["data"]["effect"] for e in outcome.history if e["kind"] == "CompensationCompleted")
    for seq, n in done.items():
        if n > 1:
            problems.append(f"the effect journaled at seq {seq} was compensated {n} times")
    if _final(outcome) != _final(reference):
        problems.append(f"final {outcome.result.status} {outcome.result.state} differs from the reference's "
                        f"{reference.result.status} {reference.result.state}")
    if not outcome.verify_ok:
        problems.append(f"verify is not clean: {outcome.verify_text}")
    return problems


def check_reference(reference: Outcome, status: str) -> None:
    """The uninterrupted run itself keeps the rules the others are held to."""
    assert reference.result.status == status, (reference.result.status, reference.result.error)
    assert reference.verify_ok, reference.verify_text
    assert not reference.violations, reference.violations
    booked = [e["id"] for e in reference.ledger if e["action"] == "book"]
    cancels = [e["id"] for e in reference.ledger if e["action"] == "cancel"]
    if cancels:  # compensated: everything booked is cancelled, newest first
        assert cancels == [b for b in reversed(booked) if b in cancels], (booked, cancels)
