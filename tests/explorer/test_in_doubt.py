"""Every crash point of every flow, under each rule that settles an effect left in doubt.

test_sweep.py explores the flows whose effect steps declare ``resend=True``. Here the same flows
follow the two other rules of docs/sagas.md ("In-doubt effects"):

- ``check``: each effect step has a ``check`` hook that looks its bookings up in the booking
  service's ledger (``GET /ledger``, by the keys ``ctx.http`` sends). Given the reference run, when
  the process dies at crash point k (every k) and a fresh process takes the run over, then no effect
  is ever failed as in doubt, and the run ends exactly as the reference did (same bookings, same
  compensations in the same order, same status and state), keeping invariants 1-5;
- ``default`` (neither ``check`` nor ``resend``): then an effect step whose intent (``StepStarted``)
  was durable when the process died, and whose key had not been journaled as issued (``KeyIssued``,
  which ``ctx.http`` writes before its first request leaves), is failed with ``InDoubtError``: the
  run fails (compensating its other effects, ``failed`` or ``compensated``, its error naming the
  step) or takes the step's failure route. Exactly those: a crash before the intent was durable, or
  once the key was issued, must end as the reference did (the effect re-sent with the same key). The
  step in doubt never reached the service, nothing is booked twice, every compensable effect the
  run completed is cancelled once, newest first (explorer_oracle.doubt_problems).

Size and time (per backend; SQLite and Postgres alike): ``check`` 232 crash points over five flows
(``agent`` has no check variant), ``default`` 262 over six, 14 of which leave an effect in doubt.
See the README ("Crash points explored") for the time measured.

Replay one point: ``EXPLORER_ONLY=trip:14 python -m pytest -p no:cacheprovider
tests/explorer/test_in_doubt.py -k 'default and trip and sqlite'``.
"""

from __future__ import annotations

import functools

import pytest
from explorer_calls import outgoing_calls_instrumented
from explorer_flows import FLOWS
from explorer_harness import check_reference, explore, judge
from explorer_oracle import doubtful, rule_points
from explorer_process import Plan
from explorer_select import FULL, SEED, only, sample

#: crash points explored per flow, variant and backend besides those where the rule decides (all under
#: EXPLORER_FULL=1): elsewhere no effect is in flight when the process dies, so its successor never
#: consults the rule, and test_sweep.py explores every one of those points with ``resend=True``
OTHERS = 2

CASES = [(name, variant) for name in sorted(FLOWS) for variant in FLOWS[name].variants if variant != "resend"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "variant"), CASES, ids=[f"{n}-{v}" for n, v in CASES])
def test_a_crash_at_every_point_settles_each_effect_in_doubt_by_its_steps_rule(
        name, variant, db_url, chat_url, explored, request):
    backend = request.node.callspec.params["db_url"]
    flow = functools.partial(FLOWS[name], variant=variant)
    with outgoing_calls_instrumented():
        # Given the uninterrupted run of the flow in this variant
        reference = explore(flow, db_url, f"{name}-{variant}-reference", Plan(), chat_url=chat_url)
        check_reference(reference, FLOWS[name].status)
        points = reference.points
        # The points where a death leaves an effect's intent open (the rule decides), every other one
        # on this backend and the others on the other backend, and a seeded sample of the remaining
        # points (every point under EXPLORER_FULL=1)
        decided = rule_points(points)
        others = [k for k in range(1, len(points) + 1) if k not in decided]
        mine = decided if FULL else [k for i, k in enumerate(decided) if (i + (backend == "postgres")) % 2 == 0]
        ks = sorted(mine + sample(others, OTHERS, "in-doubt", name, variant, backend))
        chosen = only(name)
        if chosen is not None:
            ks = sorted(chosen[0])
        failures, in_doubt = [], 0
        for k in ks:
            # When the process dies at point k and a fresh one takes the run over
            outcome = explore(flow, db_url, f"{name}-{variant}-{k}", Plan(at=k), chat_url=chat_url)
            in_doubt += bool(doubtful(outcome.deaths[0])) if outcome.deaths else 0
            # Then the effect is settled by the step's rule, and invariants 1-5 hold
            problems = judge(outcome, reference, FLOWS[name], variant)
            if outcome.processes[0].dead is None:
                problems.append(f"point {k} was never reached (the flow is not deterministic)")
            if problems:
                failures.append(f"crash at point {k} ({points[k - 1]}) of {name} [{variant}] on {backend}: "
                                + "; ".join(problems)
                                + f"\n    reproduce: EXPLORER_ONLY={name}:{k} python -m pytest -p no:cacheprovider "
                                  f"tests/explorer/test_in_doubt.py -k '{variant} and {name} and {backend}'")
    explored[(f"in-doubt:{variant}", name, backend)] = (len(ks), len(failures))
    seed = "" if FULL else f"; seed {SEED}"
    print(f"explorer in-doubt [{variant}]: {name} on {backend}: {len(ks)} of {len(points)} crash points explored "
          f"({len(mine)} of the {len(decided)} where the rule decides{seed}), {in_doubt} of them left an effect "
          f"with its key not issued, {len(failures)} violations")
    assert not failures, "\n".join(failures)
    if variant == "default" and chosen is None:
        assert in_doubt > 0, "no crash point left an effect in doubt: the flow no longer has an effect step"
