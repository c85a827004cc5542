"""``agentsaga stats``: how the cluster is doing, from the database alone.

- runs by status (``dead`` included);
- per queue: runs ready to claim, in flight (leased), parked (waiting for a timer or a signal) and
  *stale* (leased, but the lease expired: a worker died or stalled, recovery will take them);
- recoveries: runs that were ever taken over from a lost worker, and takeovers in total; failed
  recoveries recorded, runs moved to ``dead`` and retried by hand;
- step latency percentiles (p50, p90, p99, max, in ms) from the ``ms`` of ``StepCompleted`` events
  of the newest ``runs`` runs, overall and for the slowest steps;
- checkpoints per workflow: snapshots held by trigger and their bytes, verification failures,
  recoveries with their success rate and the events each replayed (``checkpoint_stats``).

Everything is read through index-backed store queries; latency looks only at recent runs so the
command costs the same on a database of a thousand runs or of millions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.engine.events import ACTIVE_STATUSES
from store import Store

__all__ = ["Stats", "collect_stats", "percentile"]

_TOP_STEPS = 10


def percentile(ordered: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100) of sorted values, by linear interpolation; None when empty."""
    if not ordered:
        return None
    rank = (len(ordered) - 1) * p / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def _latency(values: list[float]) -> dict[str, Any]:
    values.sort()
    return {"count": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": values[-1] if values else None}


@dataclass
class Stats:
    at: float
    by_status: dict[str, int]
    queues: list[dict[str, Any]]
    recovered_runs: int
    recoveries: int
    failures: dict[str, int]
    latency_runs: int
    steps: dict[str, Any]
    by_step: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per workflow: snapshots held by trigger (count, bytes), verification failures, recoveries of
    #: the newest runs, their success rate and the events each replayed (see ``checkpoint_stats``)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def collect_stats(store: Store, *, now: float, runs: int = 500) -> Stats:
    """Gather the numbers (see the module doc); ``runs``: how many recent runs latency looks at."""
    depths = [{"queue": q, "ready": ready, "in_flight": busy, "parked": parked, "stale": stale}
              for q, ready, busy, parked, stale in store.stats.queue_depths(now=now, statuses=ACTIVE_STATUSES)]
    recovered, takeovers = store.stats.recovery_totals()
    every: list[float] = []
    per_step: dict[str, list[float]] = {}
    for text in store.stats.recent_event_data("StepCompleted", runs=runs):
        data = json.loads(text)
        ms = data.get("ms")
        if isinstance(ms, (int, float)):
            every.append(float(ms))
            per_step.setdefault(str(data.get("step")), []).append(float(ms))
    by_step = {name: _latency(v) for name, v in per_step.items()}
    slowest = sorted(by_step.items(), key=lambda kv: -(kv[1]["p90"] or 0.0))[:_TOP_STEPS]
    return Stats(at=now, by_status=dict(sorted(store.count_by_status().items())), queues=depths,
                 recovered_runs=recovered, recoveries=takeovers, failures=store.stats.failure_counts(),
                 latency_runs=runs, steps=_latency(every), by_step=dict(slowest),
                 checkpoints=checkpoint_stats(store, runs=runs))


def checkpoint_stats(store: Store, *, runs: int) -> dict[str, dict[str, Any]]:
    """Checkpoint telemetry per workflow, from the database alone:

    - ``snapshots``: the snapshots held now (after pruning), by trigger: ``{"count", "bytes"}``;
    - ``verification_failures``: snapshots marked ``failed`` or ``quarantined``;
    - ``recoveries``: ``Resumed`` events of the newest ``runs`` runs (every takeover of a run);
      ``failed_recoveries``: recoveries recorded as failed (error or dead), over all runs;
      ``recovery_success_rate``: the share of recoveries that did not fail (None without any);
    - ``replayed``: events folded after the snapshot per recovery: mean and max (the recovery cost
      the snapshot policy buys).
    """
    out: dict[str, dict[str, Any]] = {}

    def entry(workflow: str) -> dict[str, Any]:
        return out.setdefault(workflow or "-", {"snapshots": {}, "snapshot_bytes": 0, "verification_failures": 0,
                                                "recoveries": 0, "failed_recoveries": 0,
                                                "recovery_success_rate": None, "replayed": {"mean": None, "max": None}})

    for workflow, trigger, validity, count, size in store.stats.snapshot_totals():
        e = entry(workflow)
        kind = trigger.split(":", 1)[0]  # gate:STEP counts as gate
        held = e["snapshots"].setdefault(kind, {"count": 0, "bytes": 0})
        held["count"] += count
        held["bytes"] += size
        e["snapshot_bytes"] += size
        if validity in ("failed", "quarantined"):
            e["verification_failures"] += count
    replayed: dict[str, list[int]] = {}
    for workflow, text in store.stats.recent_event_data_by_workflow("Resumed", runs=runs):
        data = json.loads(text)
        entry(workflow)["recoveries"] += 1
        if isinstance(data.get("replayed"), int):
            replayed.setdefault(workflow or "-", []).append(data["replayed"])
    for workflow, failed in store.stats.failed_recoveries_by_workflow().items():
        entry(workflow)["failed_recoveries"] = failed
    for workflow, e in out.items():
        if e["recoveries"]:
            e["recovery_success_rate"] = round(max(0, e["recoveries"] - e["failed_recoveries"]) / e["recoveries"], 4)
        values = replayed.get(workflow)
        if values:
            e["replayed"] = {"mean": round(sum(values) / len(values), 2), "max": max(values)}
    return dict(sorted(out.items()))
