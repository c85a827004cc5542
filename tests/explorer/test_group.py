"""The explorer across the group-commit path: three runs driven at once in one process.

Given an uninterrupted reference of the group (three runs of one workflow on one event loop: their
completions share ``append_many`` transactions, two of the runs are created on the creator thread,
one run compensates while the others complete), which names every moment of every run (before and
after each transaction that carries one of its appends, grouped or direct, each ``create_run``,
each request before it leaves and after the service acted):

- crash sweep: when the process dies at each named moment (every one, on both backends), and a
  fresh process takes the runs over (``resume`` or, alternately, ``recover`` once the leases
  lapsed; the other way round on the other backend), then every run ends as in the reference: no
  completed step executed again, no booking taken twice, the one compensation made once, journal
  seqs 1..n, the same final status and state, ``verify`` clean;
- fault sweep: when a write of the group fails (nothing written: ``raise``), commits with its reply
  lost (``lost``), refuses one run's appends while writing the others' (``item``), or meets a
  takeover of one run's lease just before it (``fence``), or, held until the same run's sibling
  branch queued its own append behind it, fails (``behind``), then the runs the fault did not touch go
  on to their end in that same drive, the touched run stops with exactly the faulted append
  missing (or, for ``lost``, present) and no gap, and once the database answers the same process
  resumes it to the reference's outcome;
- SIGKILL sample: a real child process drives the group and SIGKILLs itself at a moment: two
  sampled per backend (seeded as in test_sigkill.py), and on SQLite also six sampled among the
  moments at a transaction of several runs in the reference; this process then takes the runs
  over, with the same checks.

Replay: ``EXPLORER_ONLY='group:before r2 StepCompleted:reserve#1'`` restricts a sweep or the sample
to the named moments (``,`` between several).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from explorer_calls import outgoing_calls_instrumented
from explorer_group import (
    check_fault,
    check_group,
    check_group_reference,
    explore_group,
    targets,
)
from explorer_process import Plan

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
SEED = int(os.environ.get("EXPLORER_SEED", "20261122"))
KILLS = 2  # SIGKILL sample per backend
GROUPED_KILLS = 6  # and on SQLite, moments at a transaction of several runs
HANG = 120


def chosen(all_targets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    spec = os.environ.get("EXPLORER_ONLY")
    if not spec:
        return all_targets
    name, _, rest = spec.partition(":")
    if name != "group":
        return []
    wanted = {tuple(x.rsplit("#", 1)) for x in rest.split(",")}
    return [(t, n) for t, n in all_targets if (t, str(n)) in wanted]


def reproduce(test: str, backend: str, target: str, nth: int, seed: bool = False) -> str:
    return (f"\n    reproduce: {f'EXPLORER_SEED={SEED} ' if seed else ''}EXPLORER_ONLY='group:{target}#{nth}' "
            f"python -m pytest -p no:cacheprovider tests/explorer/test_group.py -k '{test} and {backend}'")


def reference_of(db_url: str):
    with outgoing_calls_instrumented():
        reference = explore_group(db_url, "group-reference", Plan())
    check_group_reference(reference)
    return reference


def grouped(label: str) -> bool:
    """Whether a point's label is a transaction that carried appends of more than one run."""
    return label.startswith(("before append_many[", "after append_many[")) and len(set(re.findall(r"\br\d\b", label))) > 1


@pytest.mark.slow
def test_a_crash_at_every_moment_of_a_group_leaves_every_run_as_in_the_reference(db_url, explored, request):
    backend = request.node.callspec.params["db_url"]
    reference = reference_of(db_url)
    todo = chosen(targets(reference))
    failures, on_group = [], 0
    with outgoing_calls_instrumented():
        for i, (target, nth) in enumerate(todo):
            takeover = ("recover", "resume")[(i + (backend == "postgres")) % 2]
            outcome = explore_group(db_url, f"group-crash-{i}", Plan(target=target, nth=nth), takeover=takeover)
            dead = outcome.processes[0].dead
            problems = check_group(outcome, reference)
            if dead is None:
                problems.append("the moment was never reached")
            elif grouped(outcome.points[-1]):
                on_group += 1
            if problems:
                failures.append(f"crash at {target} #{nth} ({takeover}) on {backend}: " + "; ".join(problems)
                                + reproduce("crash", backend, target, nth))
    explored[("crash", "group", backend)] = (len(todo), len(failures))
    print(f"explorer crash: group on {backend}: {len(todo)} moments explored, {on_group} of them in a transaction "
          f"of several runs, {len(failures)} violations")
    assert not failures, "\n".join(failures)
    assert not todo or on_group > 0, "no crash landed in a grouped transaction: the flow no longer groups"


@pytest.mark.slow
def test_a_fault_in_a_group_write_stops_only_the_runs_it_touched_and_they_resume_to_the_reference(
        db_url, explored, request):
    backend = request.node.callspec.params["db_url"]
    reference = reference_of(db_url)
    todo = chosen(targets(reference, writes_only=True))
    failures, explored_n, on_group = [], 0, 0
    with outgoing_calls_instrumented():
        for i, (target, nth) in enumerate(todo):
            appends = "create_run[" not in target
            # Whole-write faults alternate between the two kinds, the other way round on the other
            # backend; the one-run faults (an append's verdict, a takeover) hit every append.
            modes = [("raise", "lost")[(i + (backend == "postgres")) % 2]] + (["item", "fence"] if appends else [])
            if target == "before r1 CallCompleted:quote":
                # r1's async durable call, held in the lane until its sibling branch's synchronous
                # commit queues behind it, then failed: the one behind must not be written. (Only the
                # run the lockstep wakes first: behind a later run's held write, an earlier run's
                # synchronous commit may queue too, and it holds the event loop until the lane answers.)
                modes.append("behind")
            for mode in modes:
                outcome = explore_group(db_url, f"group-{mode}-{i}", Plan(target=target, nth=nth, what=mode))
                explored_n += 1
                problems = check_fault(outcome, target, mode) + check_group(outcome, reference)
                if mode == "behind" and not outcome.processes[0].behind:
                    problems.append("no append of the run was queued behind the held write (the flow changed?)")
                faulted = outcome.processes[0].faulted or ""
                on_group += grouped(faulted.partition("(")[2])
                if problems:
                    failures.append(f"{mode} at {target} #{nth} on {backend}: " + "; ".join(problems)
                                    + reproduce("fault", backend, target, nth))
    explored[("fault", "group", backend)] = (explored_n, len(failures))
    print(f"explorer fault: group on {backend}: {explored_n} faults explored, {on_group} of them in a transaction "
          f"of several runs, {len(failures)} violations")
    assert not failures, "\n".join(failures)
    assert not todo or on_group > 0, "no fault landed in a grouped transaction: the flow no longer groups"


def _labels(reference) -> list[str]:
    """The label of the point each target of ``targets(reference)`` names, in the same order."""
    return [label for label, keys in zip(reference.points, reference.keys, strict=True) for _ in keys]


@pytest.mark.slow
def test_a_group_sigkilled_at_a_sampled_moment_is_taken_over_to_the_reference(db_url, explored, request, tmp_path):
    backend = request.node.callspec.params["db_url"]
    reference = reference_of(db_url)
    every = targets(reference)
    # Sampled from the names sorted (the reference lists them in the order its runs interleaved).
    todo = random.Random(f"{SEED}:group:{backend}").sample(sorted(every), KILLS)
    if backend == "sqlite":
        # On SQLite (a child takes about a second) also moments at a transaction that carried several
        # runs in the reference: a real death around a grouped commit (GROUPED_KILLS of them, seeded).
        at_group = sorted({(key, n) for (key, n), label in zip(every, _labels(reference), strict=True)
                           if grouped(label)})
        todo += random.Random(f"{SEED}:group-commit:{backend}").sample(at_group, min(GROUPED_KILLS, len(at_group)))
    todo = sorted(set(todo))
    only = os.environ.get("EXPLORER_ONLY")
    if only:
        todo = chosen(every)
    print(f"explorer sigkill: group on {backend}: seed {SEED}, moments {todo} of {len(every)}")
    failures = []
    for i, (target, nth) in enumerate(todo):
        base = f"group-kill-{i}"
        ledger = tmp_path / f"ledger-{i}.jsonl"

        def child(world, base=base, ledger=ledger, target=target, nth=nth):
            done = subprocess.run(
                [sys.executable, str(HERE / "explorer_child.py"), db_url, base, "group", f"{nth}|{target}", world.api,
                 "", str(ledger)], check=False, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
            assert done.returncode == -signal.SIGKILL, (
                f"child for group at {target} #{nth} exited {done.returncode} instead of being SIGKILLed:\n"
                f"{done.stderr[-3000:]}")
            world.ledger_path = str(ledger)

        takeover = ("resume", "recover")[i % 2]
        with outgoing_calls_instrumented():
            outcome = explore_group(db_url, base, Plan(target=target, nth=nth, what="kill"), takeover=takeover,
                                    child=child)
        problems = check_group(outcome, reference)
        if problems:
            failures.append(f"SIGKILL at {target} #{nth} ({takeover}) on {backend}: " + "; ".join(problems)
                            + reproduce("sigkill", backend, target, nth, seed=True))
    explored[("sigkill", "group", backend)] = (len(todo), len(failures))
    assert not failures, "\n".join(failures)
