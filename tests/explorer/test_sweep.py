"""The exhaustive sweep: every crash point of every explorer flow, on SQLite and Postgres.

Given an uninterrupted reference run of a flow (which counts its crash points: each durable write
before and after, each outgoing request before it leaves and after the service acted), when a
process dies at crash point k (for every k) and a fresh process takes the run over and drives it
to the end, then the world and the journal are as after the reference run: no completed step
executed again, no booking taken twice, every compensation once and newest first, the same final
status and state, and ``verify`` clean.

The same sweep with faults instead of deaths: at every store write, the write fails once (nothing
written) or commits with its reply lost (the two alternate along the writes, the other way round on
the other backend); the process lives on and resumes the run itself.

One test per (flow, backend) reports every failing k with its reproduction line. To replay one
point: ``EXPLORER_ONLY=trip:17 python -m pytest tests/explorer/test_sweep.py -k "crash and trip"``.
"""

from __future__ import annotations

import pytest
from explorer_calls import outgoing_calls_instrumented
from explorer_flows import FLOWS
from explorer_harness import check, check_reference, explore, only
from explorer_process import Plan


def sweep(kind: str, name: str, db_url: str, chat_url: str, backend: str, explored: dict) -> None:
    flow = FLOWS[name]
    with outgoing_calls_instrumented():
        reference = explore(flow, db_url, f"{name}-reference", Plan(), chat_url=chat_url)
        check_reference(reference, flow.status)
        points = reference.points
        if kind == "crash":
            ks = list(range(1, len(points) + 1))
        else:  # faults hit store writes only: k counts them
            ks = list(range(1, sum(label.startswith("before ") for label in points) + 1))
        chosen = only(name)
        if chosen is not None:
            ks = [k for k in ks if k in chosen]
        failures = []
        explored_n = 0
        for i, k in enumerate(ks):
            # Faults alternate between the two kinds, the other way round on the other backend: across
            # both backends every store write both fails once and loses its reply.
            modes = ["crash"] if kind == "crash" else [("raise", "lost")[(i + (backend == "postgres")) % 2]]
            for mode in modes:
                outcome = explore(flow, db_url, f"{name}-{mode}-{k}", Plan(at=k, what=mode), chat_url=chat_url)
                explored_n += 1
                hit = outcome.processes[0].dead or outcome.processes[0].faulted
                problems = check(outcome, reference)
                if hit is None:
                    problems.append(f"point {k} was never reached (the flow is not deterministic)")
                if problems:
                    where = f"point {k} ({points[k - 1]})" if kind == "crash" else f"store write {k}"
                    failures.append(f"{mode} at {where} on {backend}: " + "; ".join(problems)
                                    + f"\n    reproduce: EXPLORER_ONLY={name}:{k} python -m pytest -p no:cacheprovider "
                                      f"tests/explorer/test_sweep.py -k '{kind} and {name} and {backend}'")
    explored[(kind, name, backend)] = (explored_n, len(failures))
    print(f"explorer {kind}: {name} on {backend}: {len(points)} crash points in the reference run, "
          f"{explored_n} {'crash points' if kind == 'crash' else 'store writes'} explored, "
          f"{len(failures)} violations")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FLOWS))
def test_every_crash_point_resumes_to_the_reference_outcome(name, db_url, chat_url, explored, request):
    backend = request.node.callspec.params["db_url"]
    sweep("crash", name, db_url, chat_url, backend, explored)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FLOWS))
def test_every_store_write_that_fails_once_or_loses_its_reply_resumes_to_the_reference_outcome(
        name, db_url, chat_url, explored, request):
    backend = request.node.callspec.params["db_url"]
    sweep("fault", name, db_url, chat_url, backend, explored)
