"""Which crash points a sweep of test_in_doubt.py and test_double_crash.py explores.

The default suite explores a deterministic, seeded subset; ``EXPLORER_FULL=1`` explores everything
(the nightly run). ``EXPLORER_SEED`` changes the subset (default 20261122, as the SIGKILL sample);
``EXPLORER_ONLY`` replays chosen points: ``trip:14,15`` (first crash points) or, for the double
crash, ``trip:14/3,14/5`` (first point / the recovery's point).
"""

from __future__ import annotations

import os
import random

SEED = int(os.environ.get("EXPLORER_SEED", "20261122"))
FULL = os.environ.get("EXPLORER_FULL", "") not in ("", "0")


def rng(*parts: object) -> random.Random:
    return random.Random(":".join(str(p) for p in (SEED, *parts)))


def sample(population: list[int], n: int, *parts: object) -> list[int]:
    """``n`` of ``population`` (all of it when it is no larger, or under ``EXPLORER_FULL``), sorted."""
    if FULL or len(population) <= n:
        return list(population)
    return sorted(rng(*parts).sample(population, n))


def only(flow: str) -> tuple[set[int], set[tuple[int, int]]] | None:
    """``EXPLORER_ONLY=flow:k,k/j...``: the first points and (first, second) pairs to replay for ``flow``
    (None: no restriction; two empty sets: another flow's points were asked for)."""
    spec = os.environ.get("EXPLORER_ONLY")
    if not spec:
        return None
    name, _, rest = spec.partition(":")
    if name != flow:
        return set(), set()
    firsts: set[int] = set()
    pairs: set[tuple[int, int]] = set()
    for item in rest.split(","):
        k, slash, j = item.partition("/")
        if slash:
            pairs.add((int(k), int(j)))
        else:
            firsts.add(int(k))
    return firsts, pairs
