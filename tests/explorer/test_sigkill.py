"""The SIGKILL sample: for a seeded sample of crash points per flow, a real child process drives the
run and is SIGKILLed at that point; this process then takes the run over and finishes it.

Given the crash points of an uninterrupted reference run, when a child process dies by SIGKILL at a
sampled point k (no cleanup at all: open transactions, sockets and threads die with it), then a new
process resumes the run to the reference's outcome, with the same checks as the in-process sweep
(the child's step executions are read from its fsynced ledger file). The sample is drawn with
``random.Random(SEED)``; the seed and each k are printed. Replay one point with
``EXPLORER_ONLY=trip:17 python -m pytest tests/explorer/test_sigkill.py -k trip``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from explorer_calls import outgoing_calls_instrumented
from explorer_flows import FLOWS
from explorer_harness import check, check_reference, explore, only
from explorer_process import Plan

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
SEED = int(os.environ.get("EXPLORER_SEED", "20261122"))
PER_FLOW = 1
HANG = 120  # seconds a child may take before the test calls it hung (it takes about one)


def run_child(db_url: str, run_id: str, name: str, k: int, chat_url: str, ledger: Path):
    def child(world):
        done = subprocess.run(
            [sys.executable, str(HERE / "explorer_child.py"), db_url, run_id, name, str(k), world.api, chat_url or "",
             str(ledger)],
            check=False, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
        assert done.returncode == -signal.SIGKILL, (
            f"child for {name} k={k} exited {done.returncode} instead of being SIGKILLed:\n{done.stderr[-3000:]}")
        world.ledger_path = str(ledger)
    return child


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FLOWS))
def test_a_process_sigkilled_at_a_sampled_crash_point_is_resumed_to_the_reference_outcome(
        name, db_url, chat_url, explored, request, tmp_path):
    backend = request.node.callspec.params["db_url"]
    flow = FLOWS[name]
    with outgoing_calls_instrumented():
        reference = explore(flow, db_url, f"{name}-reference", Plan(), chat_url=chat_url)
    check_reference(reference, flow.status)
    n = len(reference.points)
    rng = random.Random(f"{SEED}:{name}:{backend}")
    ks = sorted(rng.sample(range(1, n + 1), PER_FLOW))
    chosen = only(name)
    if chosen is not None:
        ks = sorted(chosen)
    print(f"explorer sigkill: {name} on {backend}: seed {SEED}, points {ks} of {n}")
    failures = []
    for k in ks:
        ledger = tmp_path / f"ledger-{k}.jsonl"
        with outgoing_calls_instrumented():
            outcome = explore(flow, db_url, f"{name}-kill-{k}", Plan(at=k, what="kill"), chat_url=chat_url,
                              child=run_child(db_url, f"{name}-kill-{k}", name, k, chat_url, ledger))
        problems = check(outcome, reference)
        if problems:
            failures.append(f"SIGKILL at k={k} ({reference.points[k - 1]}) on {backend}: " + "; ".join(problems)
                            + f"\n    reproduce: EXPLORER_SEED={SEED} EXPLORER_ONLY={name}:{k} python -m pytest "
                              f"-p no:cacheprovider tests/explorer/test_sigkill.py -k '{name} and {backend}'")
    explored[("sigkill", name, backend)] = (len(ks), len(failures))
    assert not failures, "\n".join(failures)
