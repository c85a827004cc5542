"""The crash-point explorer's harness: simulated processes, crash points, and the invariants.

A *process* here is one ``Orchestrator`` with a store of its own (its own connections) and a
``Process`` object that counts the crash points it passes:

- before and after every durable write at the store boundary (``append`` with the event kinds it
  carries, ``create_run``/``create_runs``, ``leases.acquire``/``release``, ``wakeups.park``/``wake``,
  ``signals.send``/``consume``, breaker and slot writes, queue claims...);
- before every outgoing HTTP request leaves (``send``) and after the service answered but before
  anything was journaled about it (``sent``), for ``ctx.http``, tool calls and model calls alike
  (httpx's transports and the async client's ``WireTransport``, including the direct path
  ``AsyncLLM`` takes, are wrapped while a process is current).

A ``Plan`` says what happens at point ``k``: the process *dies* (``ProcessDied``, a
``BaseException`` no user code catches; every later write, request or ledger entry of that
process, from any thread it left behind, raises it again: it is fenced off for good), it is
SIGKILLed (the child of the SIGKILL sample), or a store write *faults* once (``raise``: the
write fails and nothing is written; ``lost``: the write commits but its caller hears an error)
while the process lives on.

The world outside the database is a real ``BookingService`` on a loopback socket (its ledger
says which bookings and cancellations took effect), plus the ledger of step executions each step
writes as it starts. ``check`` holds a crashed-and-resumed run against an uninterrupted reference
run: no completed step executed again, no booking taken twice for one logical request, every
compensation exactly once and in the reference's (reverse) order, the same final status and
state, and ``verify`` clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx._transports.default as _httpx_default

from orchestrator import Orchestrator, RunResult
from orchestrator.engine import TERMINAL_STATUSES
from orchestrator.testing import BookingService, FakeClock
from orchestrator.tools.wire import WireTransport
from store import ConflictError, RunNotFoundError, StoreUnavailableError, open_store

T0 = 1_800_000_000.0
#: The explorer's lease: long, so that no heartbeat is needed while a run is driven (heartbeats are
#: hourly); a successor that recovers instead of resuming moves the clock past it.
LEASE_TTL = 7200.0

#: The simulated process the current thread (or task) belongs to; copied into step threads.
CURRENT: ContextVar[Process | None] = ContextVar("explorer_process", default=None)


class ProcessDied(BaseException):
    """The simulated death of a process at a crash point: nothing after it runs in that process."""


@dataclass(frozen=True)
class Plan:
    """What happens at crash point ``at``: ``crash`` (die) or ``kill`` (SIGKILL); or at the ``at``-th
    store write: ``raise`` (it fails, nothing written) or ``lost`` (it commits, its caller hears it failed).

    With ``target`` instead of ``at`` (the runs of a group, whose points interleave as the scheduler
    lets them), the moment is named, not counted: the ``nth`` point that answers to ``target``, such
    as ``before r2 StepCompleted:reserve`` (the write that carries that append of run r2, grouped
    with other runs' or alone) or ``send POST /cars?run=r2``. Group writes have two more faults:
    ``item`` (the targeted run's appends in the batch get an error verdict, the others commit) and
    ``fence`` (another process takes the targeted run's lease over just before the write); and
    ``behind``: the group write is held until another append of the targeted run has been queued
    behind it in the group committer, then fails whole (that later append must not be written)."""

    at: int | None = None
    what: str = "crash"
    target: str | None = None
    nth: int = 1

    def __post_init__(self) -> None:
        if self.what not in ("crash", "kill", "raise", "lost", "item", "fence", "behind"):
            raise ValueError(f"Plan.what must be crash, kill, raise, lost, item, fence or behind, got {self.what!r}")


class Process:
    """One simulated process: the crash points it passed, in order, and whether it is dead."""

    def __init__(self, name: str, plan: Plan = Plan()) -> None:
        self.name = name
        self.plan = plan
        self.points: list[str] = []
        self.dead: str | None = None
        self.faulted: str | None = None
        #: store writes begun (what a fault's ``at`` counts)
        self.writes = 0
        self.store: Any = None
        #: labels name the run each point belongs to (a group of runs driven together)
        self.tag_runs = False
        #: the keys of every point passed, in order (what a targeted plan is matched against)
        self.keys: list[tuple[str, ...]] = []
        self._hits = 0
        #: the seqs, per run tag, of the append a fault hit (what must, or must not, have been written)
        self.fault_items: dict[str, list[int]] = {}
        #: a one-run fault (``item``, ``fence``) that met a write other than an append failed it whole
        self.fault_whole = False
        #: appends handed to the group committer, per run tag (see ``watch_committer``)
        self.queued: Counter[str] = Counter()
        self.queued_changed = threading.Condition()
        #: whether a ``behind`` fault saw a later append of its run queued before it failed the write
        self.behind: bool | None = None
        self._lock = threading.Lock()

    def fence(self) -> None:
        if self.dead is not None:
            raise ProcessDied(f"process {self.name} died at {self.dead}: nothing it runs acts any more")

    def point(self, label: str, keys: tuple[str, ...] | None = None) -> int:
        """Pass one crash point (``keys``: the names a targeted plan may give it, by default its label);
        dies here when the plan says so. Returns the point's number."""
        with self._lock:
            self.fence()
            self.points.append(label)
            keys = keys or (label,)
            self.keys.append(keys)
            k = len(self.points)
            if self.plan.target is not None and self.plan.target in keys and self.plan.what in ("crash", "kill"):
                self._hits += 1
                hit = self._hits == self.plan.nth
            else:
                hit = k == self.plan.at
            if hit and self.plan.what in ("crash", "kill"):
                self.dead = f"point {k} ({label})"
                if self.plan.what == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise ProcessDied(f"process {self.name} died at point {k}: {label}")
            return k

    def fault_here(self, k: int) -> str | None:
        """The fault planned for the store write at point ``k`` (``raise`` / ``lost``), once. A fault's
        ``at`` counts store writes, not crash points (their number does not depend on how threads
        interleave with outgoing calls)."""
        with self._lock:
            self.writes += 1
            if self.plan.what in ("crash", "kill") or self.faulted is not None:
                return None
            if self.plan.target is not None:
                if self.plan.target not in self.keys[k - 1]:
                    return None
                self._hits += 1
                hit = self._hits == self.plan.nth
            else:
                hit = self.writes == self.plan.at
            if hit:
                self.faulted = f"write {self.writes}, point {k} ({self.points[k - 1]})"
                return self.plan.what
        return None


# -- the store boundary ------------------------------------------------------------------------------
#: Every method that writes, per part of the Store ("" is the Store itself).
WRITES: dict[str, tuple[str, ...]] = {
    "": ("create_run", "create_runs", "append", "append_many", "prune_snapshots", "delete_runs"),
    "leases": ("acquire", "release"),
    "queues": ("claim", "claim_some", "claim_from"),
    "wakeups": ("park", "wake"),
    "signals": ("send", "consume"),
    "breakers": ("compare_and_set",),
    "slots": ("acquire", "release", "renew"),
    "failures": ("record", "dead_letter", "revive"),
}


def run_tag(run_id: str) -> str:
    """The short name of a group's run in labels: ``group-crash-17.r2`` is ``r2`` (the same in every exploration)."""
    return run_id.rsplit(".", 1)[-1]


def _kinds(events: Any) -> str:
    kinds = []
    for event in events:
        step = json.loads(event.data).get("step")
        kinds.append(f"{event.kind}:{step}" if step else event.kind)
    return ", ".join(kinds)


def _extra(args: dict[str, Any]) -> str:
    extra = [name for name in ("snapshot", "consume_signals", "release_lease") if args.get(name)]
    return f" +{'+'.join(extra)}" if extra else ""


def _label(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], tag_runs: bool = False) -> tuple[str, list[str]]:
    """The write's label and, for a group's runs, the appends it carries (``r2 StepCompleted:reserve``
    each: what a targeted plan names, whichever path, direct or grouped, the append takes)."""
    if op == "append":
        events = args[1] if len(args) > 1 else kwargs.get("events", ())
        if tag_runs:
            run_id = args[0] if args else kwargs["run_id"]
            item = f"{run_tag(run_id)} {_kinds(events)}"
            return f"append[{item}]{_extra(kwargs)}", [item]
        return f"append[{_kinds(events)}]{_extra(kwargs)}", []
    if op == "append_many":
        appends = list(args[0] if args else kwargs["appends"])
        items = [f"{run_tag(a['run_id'])} {_kinds(a['events'])}" for a in appends]
        shown = "; ".join(f"{item}{_extra(a)}" for item, a in zip(items, appends, strict=True))
        return f"append_many[{shown}]", items
    if op == "create_runs":  # a group create: one transaction making several runs
        creates = list(args[0] if args else kwargs["creates"])
        items = [f"{run_tag(c['run_id'])} create" for c in creates]
        return f"create_runs[{'; '.join(items)}]", items
    if op == "signals.send":
        return f"signals.send[{args[1] if len(args) > 1 else kwargs.get('name')}]", []
    if tag_runs:
        run_id = kwargs.get("run_id") or (args[0] if args and isinstance(args[0], str) else None)
        if run_id is not None:
            return f"{op}[{run_tag(run_id)}]", []
    return op, []


def instrument_store(store: Any, process: Process) -> Any:
    """Wrap the store's writes with crash points and faults (an instance's attributes, nothing global)."""
    process.store = store
    for part, names in WRITES.items():
        obj = getattr(store, part) if part else store
        for name in names:
            op = f"{part}.{name}" if part else name
            setattr(obj, name, _write(process, op, getattr(obj, name)))
    # A heartbeat left behind by a dead process must not renew anything either (no crash point:
    # renewals run on their own clock, not the run's).
    leases = store.leases
    leases.renew = _fenced(process, leases.renew)
    leases.renew_many = _fenced(process, leases.renew_many)
    return store


def _fenced(process: Process, real: Callable[..., Any]) -> Callable[..., Any]:
    def fenced(*args: Any, **kwargs: Any) -> Any:
        process.fence()
        return real(*args, **kwargs)

    return fenced


def _write(process: Process, op: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def write(*args: Any, **kwargs: Any) -> Any:
        label, items = _label(op, args, kwargs, process.tag_runs)
        # What a ``behind`` fault waits past, counted before its point is passed: the point is what
        # lets the sibling branch go on to queue its append, and on a loaded machine that can happen
        # before this thread reaches the wait.
        queued = _queued(process, op)
        k = process.point(f"before {label}", tuple(f"before {item}" for item in items) or None)
        fault = process.fault_here(k)
        if fault is not None and op in ("append", "append_many"):
            process.fault_items = _seqs(op, args, kwargs)
        elif fault is not None and op == "create_runs":  # every run the group create carries is touched
            process.fault_items = {run_tag(c["run_id"]): [] for c in (args[0] if args else kwargs["creates"])}
        if fault == "raise":
            raise StoreUnavailableError(f"explorer: the database went away before {label} (point {k})")
        if fault == "behind":
            process.behind = _wait_for_one_behind(process, queued)
            raise StoreUnavailableError(f"explorer: the database went away before {label} (point {k}), "
                                        "with a later append of its run queued behind it")
        if fault in ("item", "fence") and op not in ("append", "append_many"):
            process.fault_whole = True
            # A one-run fault counted onto a write that is not an append: the write fails whole.
            raise StoreUnavailableError(f"explorer: the database went away before {label} (point {k})")
        if fault in ("item", "fence"):
            out = _fault_one_run(process, op, real, args, kwargs, fault, label, k)
        else:
            out = real(*args, **kwargs)
        if fault == "lost":
            raise StoreUnavailableError(f"explorer: {label} committed but its reply was lost (point {k})")
        process.point(f"after {label}", tuple(f"after {item}" for item in items) or None)
        return out

    return write


#: how long a ``behind`` fault holds its write for a later append to be queued (a guard against a
#: hang, never reached when the flow queues one: the sibling branch's commit comes in the same turn)
BEHIND_WAIT = 30.0


def _queued(process: Process, op: str) -> int | None:
    """How many appends the targeted run has handed to the group committer so far, if ``op`` is a
    group write a ``behind`` fault could hold (None otherwise)."""
    if process.plan.what != "behind" or op != "append_many" or process.plan.target is None:
        return None  # not the lane's write: nothing can queue behind it while it is held
    with process.queued_changed:
        return process.queued[_target_tag(process)]


def _target_tag(process: Process) -> str:
    return process.plan.target.split(" ")[1]


def _wait_for_one_behind(process: Process, queued: int | None) -> bool:
    """Hold the lane's write until the targeted run has queued another append since ``queued`` was
    counted (just before the write's point was passed)."""
    if queued is None:
        return False
    tag = _target_tag(process)
    with process.queued_changed:
        return process.queued_changed.wait_for(lambda: process.queued[tag] > queued, timeout=BEHIND_WAIT)


def watch_committer(orc: Orchestrator, process: Process) -> None:
    """Count the appends ``orc`` hands to its group committer, per run (what a ``behind`` fault waits for)."""
    committer = orc.engine.journal.committer
    real = committer.submit

    def submit(run: Any, item: dict[str, Any], *rest: Any, **options: Any) -> Any:
        future = real(run, item, *rest, **options)
        with process.queued_changed:
            process.queued[run_tag(run.run_id)] += 1
            process.queued_changed.notify_all()
        return future

    committer.submit = submit


def _seqs(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, list[int]]:
    """The seqs an append (or a group's appends) carries, per run tag."""
    if op == "append":
        appends = [{"run_id": args[0] if args else kwargs["run_id"],
                    "events": args[1] if len(args) > 1 else kwargs["events"]}]
    else:
        appends = list(args[0] if args else kwargs["appends"])
    out: dict[str, list[int]] = {}
    for a in appends:
        out.setdefault(run_tag(a["run_id"]), []).extend(e.seq for e in a["events"])
    return out


def _fault_one_run(process: Process, op: str, real: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   fault: str, label: str, k: int) -> Any:
    """A fault that hits one run of a write (the plan's target names it): ``fence``, its lease is taken
    over by another process just before the write (the store then fences that run's appends);
    ``item``, its appends in a group get an error verdict, the others' are written."""
    if op == "append_many":
        appends = list(args[0] if args else kwargs["appends"])
        run_ids = [a["run_id"] for a in appends]
    else:
        run_ids = [args[0] if args else kwargs["run_id"]]
    # The run the target names; a fault counted (``at``) hits the write's first run.
    target_tag = process.plan.target.split(" ")[1] if process.plan.target else run_tag(run_ids[0])
    run_id = next(r for r in run_ids if run_tag(r) == target_tag)
    if fault == "fence":
        # A paused or partitioned process is fenced out by a takeover (which is then never heard of
        # again: the faulted process resumes the run itself, taking the lease back).
        leases = process.store.leases
        type(leases).acquire(leases, run_id, owner="explorer-thief", ttl=LEASE_TTL, now=T0, force=True)  # no crash point
        return real(*args, **kwargs)
    if op != "append_many":
        raise ConflictError(f"explorer: {label} refused for run {run_id} (point {k})", run_id=run_id)
    kept = [a for a in appends if a["run_id"] != run_id]
    verdicts = iter(real(kept) if kept else [])
    refused = ConflictError(f"explorer: the appends of run {run_id} in {label} were refused (point {k})",
                            run_id=run_id)
    return [refused if a["run_id"] == run_id else next(verdicts) for a in appends]


# -- outgoing calls ----------------------------------------------------------------------------------
_http_lock = threading.Lock()
_http_depth = 0
_REAL_SYNC = httpx.HTTPTransport.handle_request
_REAL_ASYNC = httpx.AsyncHTTPTransport.handle_async_request
_REAL_SSL = _httpx_default.create_ssl_context
# The shared async client's own transport, and the direct path AsyncLLM takes through it.
_REAL_WIRE = WireTransport.handle_async_request
_REAL_EXCHANGE = WireTransport.exchange
_ssl_contexts: dict[str, Any] = {}


def _shared_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
    # Every simulated process builds its own httpx clients, and each would load the system's CA
    # bundle again (~50 ms): the explorer's requests go to plain-HTTP loopback services, so one
    # context per setting serves them all. Only speed changes; connections stay per client.
    key = repr((verify, cert, trust_env))
    if key not in _ssl_contexts:
        _ssl_contexts[key] = _REAL_SSL(verify, cert, trust_env)
    return _ssl_contexts[key]


def _request_label(process: Process, request: httpx.Request) -> str:
    """``POST /flights``; for a group's runs, the endpoint and the query that names the run
    (``DELETE /cars?run=r2``: a booking's id depends on how the runs interleaved, the run does not)."""
    return _label_for(process, request.method, request.url)


def _label_for(process: Process, method: str, url: httpx.URL) -> str:
    if not process.tag_runs:
        return f"{method} {url.path}"
    endpoint = "/" + url.path.strip("/").split("/")[0]
    query = url.query.decode()
    return f"{method} {endpoint}" + (f"?{query}" if query else "")


def _sync_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
    process = CURRENT.get()
    if process is None:
        return _REAL_SYNC(self, request)
    label = _request_label(process, request)
    process.point(f"send {label}")
    response = _REAL_SYNC(self, request)
    response.read()
    process.point(f"sent {label}")  # the service acted; nothing about its answer is journaled yet
    return response


def _async_points(real: Callable[..., Any], passes_on: Callable[[Any, httpx.Request], bool] | None = None
                  ) -> Callable[..., Any]:
    """An async transport's ``handle_async_request`` with the send/sent points around ``real``;
    a request ``passes_on`` says the transport hands to another one is counted there instead."""

    async def request_with_points(self: Any, request: httpx.Request) -> httpx.Response:
        process = CURRENT.get()
        if process is None or (passes_on is not None and passes_on(self, request)):
            return await real(self, request)
        label = _request_label(process, request)
        process.point(f"send {label}")
        response = await real(self, request)
        await response.aread()
        process.point(f"sent {label}")
        return response

    return request_with_points


_async_request = _async_points(_REAL_ASYNC)
# (WireTransport hands HEAD, streamed uploads and upgrades to httpx's transport, which counts them)
_wire_request = _async_points(_REAL_WIRE, lambda transport, request: not transport._ours(request))


async def _wire_exchange(self: WireTransport, method: bytes, url: httpx.URL, *args: Any) -> Any:
    process = CURRENT.get()
    if process is None:
        return await _REAL_EXCHANGE(self, method, url, *args)
    label = _label_for(process, method.decode(), url)
    process.point(f"send {label}")
    reply = await _REAL_EXCHANGE(self, method, url, *args)
    process.point(f"sent {label}")
    return reply


@contextlib.contextmanager
def outgoing_calls_instrumented() -> Iterator[None]:
    """While inside: HTTP requests made on behalf of a current ``Process`` pass its crash points."""
    global _http_depth
    with _http_lock:
        _http_depth += 1
        httpx.HTTPTransport.handle_request = _sync_request  # type: ignore[method-assign]
        httpx.AsyncHTTPTransport.handle_async_request = _async_request  # type: ignore[method-assign]
        WireTransport.handle_async_request = _wire_request  # type: ignore[method-assign]
        WireTransport.exchange = _wire_exchange  # type: ignore[method-assign]
        _httpx_default.create_ssl_context = _shared_ssl_context
    try:
        yield
    finally:
        with _http_lock:
            _http_depth -= 1
            if _http_depth == 0:
                httpx.HTTPTransport.handle_request = _REAL_SYNC  # type: ignore[method-assign]
                httpx.AsyncHTTPTransport.handle_async_request = _REAL_ASYNC  # type: ignore[method-assign]
                WireTransport.handle_async_request = _REAL_WIRE  # type: ignore[method-assign]
                WireTransport.exchange = _REAL_EXCHANGE  # type: ignore[method-assign]
                _httpx_default.create_ssl_context = _REAL_SSL


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
