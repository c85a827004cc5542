"""The crash-point explorer's harness: one exploration's world, and the invariants it is held to.

``explore`` runs one scenario: a first simulated process (``Process``, explorer_process.py) with a
``Plan``, its store's writes instrumented (explorer_store.py); if it died or a write faulted, a
fresh process finishes the run (and with ``then=[Plan(...)]``, that successor dies too, at a
point of its own, and another one finishes: a crash during the recovery). Its outgoing requests
pass crash points while the caller is inside ``outgoing_calls_instrumented()`` (explorer_calls.py),
and every request carrying an effect's key is checked against the journal before it leaves
(``World.sending``: intent before effect, invariant 4).

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

from explorer_oracle import (doubt_problems, fold_problems, http_positions, in_doubt_failures,
                             invariant_problems)
from explorer_process import CURRENT, LEASE_TTL, T0, Plan, Process, ProcessDied
from explorer_store import instrument_store

from orchestrator import Orchestrator, RunResult
from orchestrator.engine import TERMINAL_STATUSES
from orchestrator.payload import codec
from orchestrator.testing import BookingService, FakeClock
from orchestrator.tools.http import MAX_DURABLE_BODY
from store import RunNotFoundError, StoreUnavailableError, open_store


class ExplorerService(BookingService):
    """The booking service, and a catalog too large to journal: ``GET /catalog/PART`` answers a JSON
    body over ``MAX_DURABLE_BODY`` (1 MiB), so ``ctx.http`` hands it to the step live and journals no
    call for it. Each one served is a ``fetch`` entry of the ledger with the key it carried, so a
    re-send can be told apart, and its key compared with the first send's."""

    #: characters of filler in each catalog answer: the body is over the journal's limit
    FILLER = MAX_DURABLE_BODY + 4096

    def _dispatch(self, method: str, path: str, body: Any, raw: bytes, key: str | None) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        if method == "GET" and len(parts) == 2 and parts[0] == "catalog":
            self._log("fetch", kind="catalog", part=parts[1], idempotency_key=key)
            return 200, {"part": parts[1], "items": "." * self.FILLER}
        return super()._dispatch(method, path, body, raw, key)


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
    #: the run explored, and its workflow's effect steps (what ``sending`` checks requests against)
    run_id: str | None = None
    effects: frozenset[str] = frozenset()
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

    def routed(self, step: str, tick: int) -> None:
        """A router is asked where ``step`` (at ``tick``) goes: never once its decision is journaled
        (invariant 3: replay reads the decision, it does not ask again)."""
        process = CURRENT.get()
        if process is None or process.store is None or self.run_id is None:
            return
        process.fence()
        epoch, completed = self._journal_seen(process.store, self.run_id)
        if (step, tick, epoch) in completed:
            self.violations.append(f"the router of {step!r} (tick {tick}, epoch {epoch}) was asked again by "
                                   f"{process.name} after its decision was journaled (invariant 3)")

    def sending(self, process: Process, method: str, url: str, key: str | None) -> None:
        """A request is about to leave ``process``: if it carries the key of one of the run's effects, the
        journal must already hold that effect's intent with that key, and its key's issue (``KeyIssued``)
        for the attempt under way; a compensation's request, its ``CompensationStarted``, and not after
        that compensation was confirmed (invariants 4 and 5)."""
        if key is None or self.run_id is None or not key.startswith(self.run_id + ":"):
            return
        step = key[len(self.run_id) + 1:].split(":")[0]
        if step not in self.effects:
            return
        journal = [(e["kind"], e["data"]) for e in journal_of(process.store, self.run_id)]
        where = f"{method} {url} with key {key!r} by {process.name}"
        if ":compensate" in key:
            effect_key = key[:key.index(":compensate")]
            # (a tool call's effect is compensated with its step's: its key extends the step's)
            started = [d["effect"] for kind, d in journal if kind == "CompensationStarted"
                       and (effect_key == d.get("key") or effect_key.startswith(f"{d.get('key')}:"))]
            if not started:
                self.violations.append(f"{where}: no CompensationStarted with key {effect_key!r} was journaled "
                                       "before the compensation's request left (invariant 5)")
            elif any(kind == "CompensationCompleted" and d["effect"] == started[-1] for kind, d in journal):
                self.violations.append(f"{where}: the compensation of the effect at seq {started[-1]} was already "
                                       "confirmed, and its request went out again (invariant 5)")
            return
        intent, issued = None, False
        for kind, d in journal:
            if d.get("step") != step:
                continue
            if kind == "StepStarted":
                intent, issued = d, False
            elif kind == "KeyIssued" and intent is not None:
                issued = True
            elif kind == "StepCompleted" or (kind == "StepFailed" and (d.get("final") or not d.get("in_doubt"))):
                intent, issued = None, False
        if intent is None or not (key == intent.get("key") or key.startswith(f"{intent.get('key')}:")):
            self.violations.append(f"{where}: the journal holds no open intent (StepStarted) of {step!r} with its "
                                   f"key ({intent and intent.get('key')!r}) (invariant 4: intent before effect)")
        elif not issued:
            self.violations.append(f"{where}: the attempt's KeyIssued was not journaled before its key left "
                                   "(invariant 4)")

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
    #: the run's journal as each dead process left it (what was durable when it died), in order
    deaths: list[list[dict[str, Any]]] = field(default_factory=list)
    #: the workflow explored
    workflow: Any = None
    #: invariant 2 read from the store at each death and at the end (explorer_oracle.fold_problems)
    fold_problems: list[str] = field(default_factory=list)


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
    process.first_context_cost = getattr(flow, "first_call_cost", 0.0)
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


def journal_of(store: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's journal as ``{"seq", "kind", "data"}`` (empty when the run was never created)."""
    try:
        events = store.events(run_id)
    except RunNotFoundError:
        return []
    return [{"seq": e.seq, "kind": e.kind, "data": codec.loads(e.data)} for e in events]


def explore(flow_factory: Callable[[World], Any], url: str, run_id: str, plan: Plan, *,
            chat_url: str | None = None, child: Callable[[World], Any] | None = None,
            then: tuple[Plan, ...] = ()) -> Outcome:
    """Run one scenario: a first process with ``plan``; if it died or faulted, a fresh one finishes.

    ``then``: the plans of the successors, in order (each dies at its own point ``at``, counted from
    its own start); once they are used up, a last process drives the run to its end.

    With ``child``, the first process is a real one: ``child(world)`` runs it (it SIGKILLs itself at
    the plan's point) and returns once it is gone; this process then takes the run over."""
    service = ExplorerService()
    service.start()
    try:
        world = World(service=service, clock=FakeClock(T0), chat_url=chat_url, run_id=run_id)
        flow = flow_factory(world)
        world.effects = frozenset(n for n, step in flow.workflow.steps.items() if step.effect)
        flow.prepare(world)
        first = Process("gen0", plan)
        first.on_send = world.sending
        processes = [first]
        orcs: list[Orchestrator] = []
        deaths: list[list[dict[str, Any]]] = []
        folds: list[str] = []
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
            plans = list(then)
            while processes[-1].dead is not None:
                dead = processes[-1]
                # Its connections die with it (the server sees them drop); threads it left behind are fenced.
                for orc in orcs:
                    abandon(orc)
                orcs.clear()
                # The dead process's successor: a new process with a store (and connections) of its own.
                successor = Process(f"gen{len(processes)}", plans.pop(0) if plans else Plan())
                successor.on_send = world.sending
                processes.append(successor)
                orcs.append(make_orchestrator(url, successor, world, [flow.workflow]))
                deaths.append(journal_of(orcs[-1].store, run_id))
                if child is not None and len(processes) == 2:
                    # A real child's clock lived in its memory (a scenario may have moved it on, to a
                    # timer or a timeout): this process's is never behind what the child journaled.
                    ats = [e.at for e in orcs[-1].store.events(run_id)] if deaths[-1] else []
                    world.clock.now = max([world.clock.now, *ats])
                folds += fold_problems(orcs[-1].store, run_id, flow.workflow, f"after {dead.name} died at {dead.dead}")
                # Every other crash point, the successor recovers the run once its lease lapsed
                # instead of taking it over at once.
                takeover = "recover" if (dead.plan.at or 0) % 2 == 0 else "resume"
                try:
                    result = drive(flow, world, orcs[-1], successor, run_id, takeover=takeover)
                except ProcessDied:
                    if successor.dead is None:
                        raise
            if result is None:
                # A process that met a failed write lives on, and resumes the run once the database answers.
                result = drive(flow, world, orcs[0], first, run_id)
            reader = orcs[-1]
            report = reader.verify(run_id)
            history = reader.history(run_id)
            folds += fold_problems(reader.store, run_id, flow.workflow, "at the end")
        finally:
            for orc in orcs:
                abandon(orc)
        return Outcome(result=result, ledger=service.ledger(), history=history, verify_ok=report.ok,
                       verify_text="\n".join(report.lines()), points=list(first.points), processes=processes,
                       violations=list(world.violations), deaths=deaths, workflow=flow.workflow,
                       fold_problems=folds)
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
    problems += _calls_made_again(outcome, reference)
    problems += _big_answers(outcome, reference)
    problems += timed_out(outcome)
    if _final(outcome) != _final(reference):
        problems.append(f"final {outcome.result.status} {outcome.result.state} differs from the reference's "
                        f"{reference.result.status} {reference.result.state}")
    if not outcome.verify_ok:
        problems.append(f"verify is not clean: {outcome.verify_text}")
    problems += outcome.fold_problems
    if outcome.workflow is not None:
        problems += invariant_problems(outcome.history, outcome.ledger, outcome.workflow, outcome.result.run_id)
    return problems


def judge(outcome: Outcome, reference: Outcome, flow: Any, variant: str) -> list[str]:
    """What is wrong with ``outcome`` of one or several crashes, for a flow whose effects follow
    ``variant``'s in-doubt rule: with ``resend`` or a ``check`` hook, no effect is ever failed as in
    doubt and the run ends as the reference did (``check``); with the default rule, the effects a
    death left with their intent durable and their key not issued are failed as in doubt, exactly
    those (explorer_oracle.doubt_problems), and otherwise the run ends as the reference did. Every
    outcome keeps invariants 1-5 on the journal and the ledger, and ends (it is not left running)."""
    doubt = doubt_problems(outcome, reference, flow) if variant == "default" else None
    if doubt is None:
        problems = check(outcome, reference)
        if variant != "default" and in_doubt_failures(outcome.history):
            problems.append(f"a step failed as in doubt under the {variant!r} rule: "
                            f"{[f['step'] for f in in_doubt_failures(outcome.history)]}")
        return problems
    problems = list(outcome.violations) + doubt + outcome.fold_problems + timed_out(outcome)
    problems += invariant_problems(outcome.history, outcome.ledger, outcome.workflow, outcome.result.run_id)
    bodies = Counter(_body_id(e) for e in outcome.ledger if e["action"] == "book")
    problems += [f"{what} took effect {n} times for one logical request" for what, n in bodies.items() if n > 1]
    if outcome.result.status not in TERMINAL_STATUSES:
        problems.append(f"the run was left {outcome.result.status}")
    if not outcome.verify_ok:
        problems.append(f"verify is not clean: {outcome.verify_text}")
    return problems


def timed_out(outcome: Outcome) -> list[str]:
    """Step attempts that timed out: none does in the explorer's flows, whose timeouts no step's own
    work reaches; one that did was charged for what its process makes once (its HTTP clients, which
    the engine makes before a timed attempt's timer starts; explorer_calls makes that slow)."""
    return [f"step {e['data']['step']!r} (tick {e['data']['tick']}) timed out in attempt {e['data']['attempt']}: "
            f"{e['data']['error'].get('message')}" for e in outcome.history
            if e["kind"] == "StepFailed" and e["data"]["error"]["type"].endswith("StepTimeoutError")]


def _big_answers(outcome: Outcome, reference: Outcome) -> list[str]:
    """The answers too large to journal (``fetch`` in the ledger) were requested as in the reference:
    each with the key the reference sent it with (run id written RUN), however often it was fetched
    again; and the journaled HTTP calls sit at the reference's positions (a big answer keeps its
    position though nothing is journaled for it: the calls after it do not move up, and each sits
    where the reference's does)."""
    def keys(o: Outcome) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for e in o.ledger:
            if e["action"] == "fetch":
                out.setdefault(e["part"], set()).add(str(e.get("idempotency_key")).replace(o.result.run_id, "RUN"))
        return out

    ref = keys(reference)
    if not ref:
        return []
    problems = []
    if keys(outcome) != ref:
        problems.append(f"the big answers were requested with the keys {keys(outcome)}, the reference's with {ref}")
    got = [(*p[:4], p[4].replace(outcome.result.run_id, "RUN")) for p in http_positions(outcome.history)]
    want = [(*p[:4], p[4].replace(reference.result.run_id, "RUN")) for p in http_positions(reference.history)]
    moved = [p for p in got if p not in want]
    if moved:
        # (fewer is no problem: an effect a check hook settled from the service is not run again, and
        # the calls its crashed attempt made but did not journal never are)
        problems.append(f"the journaled HTTP calls {moved} sit where the reference has none ({want}): a call moved")
    return problems


def _calls_made_again(outcome: Outcome, reference: Outcome) -> list[str]:
    """Durable calls the journal holds twice: a position of a step execution (its tick, since the last
    rollback) completed twice was performed (paid for) twice; one ``replaced`` where the reference
    has none was renumbered or changed on resume (a call inside another one counted as a later one)."""
    def journaled(history: list[dict[str, Any]]) -> tuple[Counter, int]:
        epoch, seen, replaced = 0, Counter(), 0
        for e in history:
            if e["kind"] == "RolledBack":
                epoch += 1
            elif e["kind"] == "CallCompleted":
                data = e["data"]
                seen[(data["step"], data["tick"], epoch, str(data["index"]))] += 1
                replaced += bool(data.get("replaced"))
        return seen, replaced

    seen, replaced = journaled(outcome.history)
    problems = [f"call {index} of step {step!r} (tick {tick}) was journaled {n} times: performed again"
                for (step, tick, _, index), n in seen.items() if n > 1]
    if replaced != journaled(reference.history)[1]:
        problems.append(f"{replaced} calls were journaled as replacing a changed request, the reference has "
                        f"{journaled(reference.history)[1]}: a resumed call met another request at its position")
    return problems


def check_reference(reference: Outcome, status: str) -> None:
    """The uninterrupted run itself keeps the rules the others are held to."""
    assert reference.result.status == status, (reference.result.status, reference.result.error)
    assert reference.verify_ok, reference.verify_text
    assert not reference.violations, reference.violations
    assert not timed_out(reference), timed_out(reference)
    first = reference.processes[0]
    # (a flow whose first HTTP client is slow to make: it was, so the timeouts were put to the test)
    assert first.context_made or not first.first_context_cost, "the process never made its HTTP clients"
    problems = invariant_problems(reference.history, reference.ledger, reference.workflow, reference.result.run_id)
    assert not problems, problems
    booked = [e["id"] for e in reference.ledger if e["action"] == "book"]
    cancels = [e["id"] for e in reference.ledger if e["action"] == "cancel"]
    if cancels:  # compensated: everything booked is cancelled, newest first
        assert cancels == [b for b in reversed(booked) if b in cancels], (booked, cancels)
