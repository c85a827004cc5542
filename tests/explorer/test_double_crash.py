"""A second crash during the recovery: the successor of a dead process dies too, at any point of its own.

test_sweep.py and test_in_doubt.py kill the first process once; its successor then always runs to
the end. Here, for a first crash point k of the reference run, the successor's own crash points are
counted (each durable write before and after, each outgoing request before it leaves and after the
service acted, a check hook's ``GET /ledger`` included); then for a point j of those, the first
process dies at k, its successor dies at j, and a third process recovers the run to its end (the
successors take the run over with ``resume``, or with ``recover`` once the lease lapsed, by the
parity of the point their predecessor died at). Every flow, in every variant of its in-doubt rule
(``resend``, ``check``, ``default``; see explorer_flows.py), on SQLite and Postgres.

Given the reference run, when the process dies at k and its successor at j, then invariants 1-5 hold
on the journal and the ledger (explorer_oracle.invariant_problems, fold_problems and what the
processes saw as they went: no completed step executed again, no router asked again, every snapshot
+ tail and what recovery restores equal to the fold of the whole journal, no request leaving before
its intent and its key's issue were journaled, each effect compensated at most once, newest first),
``verify`` is clean, and the run ends: as the reference did, or, under the default rule, failed as in
doubt exactly when one of the deaths left an effect's intent durable with its key not issued
(explorer_harness.judge).

Size: the full product (every k, every j of its successor) is about 24,000 explorations per backend
(resend 7,700, check 7,500, default 8,800 on SQLite); it runs with ``EXPLORER_FULL=1`` (nightly:
about 2 hours per backend on this 2-core machine under load). The default suite explores a seeded
subset per flow, variant and backend: ``FIRSTS`` first points (chosen among those where the rule
decides, and the others), and for each ``SECONDS`` points of its successor, the first of them among
the successor's first writes and calls (where it reconciles), 15 explorations each, 255 per backend,
about 40 s per backend here. ``EXPLORER_SEED`` changes the subset; a failure prints the line that
replays it (``EXPLORER_ONLY=trip:14/3``).
"""

from __future__ import annotations

import functools

import pytest
from explorer_calls import outgoing_calls_instrumented
from explorer_flows import FLOWS
from explorer_harness import check_reference, explore, judge
from explorer_oracle import rule_points
from explorer_process import Plan
from explorer_select import FULL, SEED, only, sample

#: first crash points per flow, variant and backend in the default suite: one where the rule
#: decides what the successor does, one elsewhere
FIRSTS = 2
#: the successor's crash points per first point: one among its first EARLY points (where it takes
#: the run over and settles what was in flight), the others anywhere
SECONDS = 2
EARLY = 8

CASES = [(name, variant) for name in sorted(FLOWS) for variant in FLOWS[name].variants]


def firsts(points: list[str], name: str, variant: str, backend: str) -> list[int]:
    decided = rule_points(points)
    others = [k for k in range(1, len(points) + 1) if k not in decided]
    if FULL:
        return list(range(1, len(points) + 1))
    return sorted(sample(decided, FIRSTS // 2, "double", name, variant, backend, "decided")
                  + sample(others, FIRSTS - FIRSTS // 2, "double", name, variant, backend, "others"))


def seconds(n: int, name: str, variant: str, backend: str, k: int) -> list[int]:
    every = list(range(1, n + 1))
    if FULL:
        return every
    early = sample(every[:EARLY], 1, "double", name, variant, backend, k, "early")
    rest = [j for j in every if j not in early]
    return sorted(early + sample(rest, SECONDS - 1, "double", name, variant, backend, k, "rest"))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "variant"), CASES, ids=[f"{n}-{v}" for n, v in CASES])
def test_a_second_crash_at_any_point_of_the_recovery_keeps_invariants_1_to_5(
        name, variant, db_url, chat_url, explored, request):
    backend = request.node.callspec.params["db_url"]
    flow = functools.partial(FLOWS[name], variant=variant)
    replay = only(name)
    failures, pairs, first_n, unreached = [], 0, 0, 0
    with outgoing_calls_instrumented():
        # Given the uninterrupted run, and the first crash points to explore
        reference = explore(flow, db_url, f"{name}-{variant}-reference", Plan(), chat_url=chat_url)
        check_reference(reference, FLOWS[name].status)
        points = reference.points
        todo = firsts(points, name, variant, backend)
        if replay is not None:
            todo = sorted(replay[0] | {k for k, _ in replay[1]})
        for k in todo:
            # The successor's own crash points, counted in a recovery that runs to its end
            once = explore(flow, db_url, f"{name}-{variant}-{k}", Plan(at=k), chat_url=chat_url)
            first_n += 1
            if len(once.processes) < 2:
                failures.append(f"first crash point {k} of {name} [{variant}] on {backend} was never reached")
                continue
            recovery = once.processes[1].points
            problems = judge(once, reference, FLOWS[name], variant)
            if problems:  # (the single crash is held to the same checks: its recovery is what is crashed next)
                failures.append(f"crash at point {k} ({points[k - 1]}) of {name} [{variant}] on {backend}: "
                                + "; ".join(problems))
            js = seconds(len(recovery), name, variant, backend, k)
            if replay is not None:
                js = sorted(j for kk, j in replay[1] if kk == k)
            for j in js:
                # When the process dies at k and its successor at j, and a third process recovers the run
                outcome = explore(flow, db_url, f"{name}-{variant}-{k}-{j}", Plan(at=k), chat_url=chat_url,
                                  then=(Plan(at=j),))
                pairs += 1
                # Then invariants 1-5 hold, and the run ends as its rule says
                problems = judge(outcome, reference, FLOWS[name], variant)
                if len(outcome.processes) < 3 or outcome.processes[1].dead is None:
                    # (threads: point k is another moment when the scheduler ordered the branches otherwise,
                    # and its recovery can be shorter; the run still keeps every invariant)
                    unreached += 1
                    if FLOWS[name].deterministic:
                        problems.append(f"the recovery's point {j} was never reached (the recovery is not "
                                        "deterministic)")
                if problems:
                    failures.append(
                        f"crash at point {k} ({points[k - 1]}), then at the recovery's point {j} "
                        f"({recovery[j - 1] if j <= len(recovery) else '?'}) of {name} [{variant}] on {backend}: "
                        + "; ".join(problems)
                        + f"\n    reproduce: EXPLORER_ONLY={name}:{k}/{j} python -m pytest -p no:cacheprovider "
                          f"tests/explorer/test_double_crash.py -k '{name}-{variant} and {backend}'")
    explored[(f"double:{variant}", name, backend)] = (pairs, len(failures))
    print(f"explorer double crash [{variant}]: {name} on {backend}: {first_n} first points of {len(points)}, "
          f"{pairs} second points in their recoveries{' (all)' if FULL else f' (seed {SEED})'}"
          f"{f', {unreached} of them not reached (the threads interleaved otherwise)' if unreached else ''}, "
          f"{len(failures)} violations")
    assert not failures, "\n".join(failures)
