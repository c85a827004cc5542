"""The explorer's store boundary: a simulated process's crash points and faults at its durable writes.

``instrument_store`` wraps one store's writes (an instance's attributes, nothing global): before and
after every durable write (``append`` with the event kinds it carries, ``create_run``/``create_runs``,
``leases.acquire``/``release``, ``wakeups.park``/``wake``, ``signals.send``/``consume``, breaker and
slot writes, queue claims...) the ``Process`` passes a crash point, and the write its ``Plan`` names
faults (``raise``, ``lost``; for a group's runs also ``item``, ``fence`` and ``behind``, the last
waiting for an append counted by ``watch_committer`` to be queued behind it in the group committer).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from explorer_process import LEASE_TTL, T0, Process

from orchestrator import Orchestrator
from store import ConflictError, StoreUnavailableError

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
