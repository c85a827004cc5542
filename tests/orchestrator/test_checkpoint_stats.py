"""Checkpoint telemetry in ``orc.stats()`` and ``agentsaga stats``: snapshots by trigger and bytes,
verification failures, recoveries, their success rate and events replayed, per workflow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import agentsaga, tamper_snapshot

from workflows import END, Snapshots, Workflow, reducers


def counter(name: str, *, stop_at: int | None = None, every: int = 3) -> Workflow:
    wf = Workflow(name, reducers={"seen": reducers.append}, snapshots=Snapshots(every=every, keep=10, incremental=None))

    @wf.step(start=True)
    def tick(ctx, state):
        if state["n"] == stop_at:
            raise KeyboardInterrupt
        return {"n": state["n"] + 1, "seen": state["n"]}

    wf.route("tick", lambda s: "tick" if s["n"] < 8 else END)
    return wf


def test_stats_report_checkpoints_per_workflow(orc_factory, db_url):
    # Given workflow "alpha": one run completed, one interrupted at 5 and recovered, one snapshot damaged
    orc = orc_factory(counter("alpha"), counter("beta", every=100))
    orc.run(orc.workflows.get("alpha"), {"n": 0}, run_id="a1")
    crashing = counter("alpha", stop_at=5)
    with pytest.raises(KeyboardInterrupt):
        orc_factory(crashing).run(crashing, {"n": 0}, run_id="a2")
    orc.resume("a2")
    oldest = min(s.seq for s in orc.snapshots("a1"))
    tamper_snapshot(db_url, "a1", oldest, lambda s: s["state"].update(n=-1), rehash=False)
    orc.verify("a1")
    # And workflow "beta": one run, snapshotted only at its end
    orc.run(orc.workflows.get("beta"), {"n": 0}, run_id="b1")
    # When stats are gathered
    stats = orc.stats()
    alpha, beta = stats.checkpoints["alpha"], stats.checkpoints["beta"]
    # Then the snapshots held are counted by trigger with their bytes, as the catalogs hold them
    catalog = orc.snapshots("a1") + orc.snapshots("a2")
    for trigger in ("periodic", "final"):
        held = [s for s in catalog if s.trigger == trigger]
        assert alpha["snapshots"][trigger] == {"count": len(held), "bytes": sum(s.size_bytes for s in held)}
    assert alpha["snapshot_bytes"] == sum(s.size_bytes for s in catalog)
    assert beta["snapshots"] == {"final": {"count": 1, "bytes": orc.snapshots("b1")[0].size_bytes}}
    # And the damaged snapshot is a verification failure
    assert (alpha["verification_failures"], beta["verification_failures"]) == (1, 0)
    # And the recovery is counted, successful, with the events it replayed
    [resumed] = [e["data"] for e in orc.history("a2") if e["kind"] == "Resumed"]
    assert alpha["recoveries"] == 1 and alpha["recovery_success_rate"] == 1.0
    assert alpha["replayed"] == {"mean": resumed["replayed"], "max": resumed["replayed"]}
    assert beta["recoveries"] == 0 and beta["recovery_success_rate"] is None
    # And the CLI prints a row per workflow
    done = agentsaga("stats", db=db_url)
    assert done.returncode == 0, done.stderr
    assert "CHECKPOINTS" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("alpha"))
    assert "final 2" in row and "100%" in row


def test_checkpoint_metrics_are_recorded_with_opentelemetry(orc_factory):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from orchestrator.contrib.otel import CheckpointMetrics

    # Given an in-memory metrics pipeline observing the orchestrators
    reader = InMemoryMetricReader()
    metrics = CheckpointMetrics(meter_provider=MeterProvider(metric_readers=[reader]))
    # When a run is interrupted, then recovered, snapshotting every 3 events
    crashing = counter("alpha", stop_at=5)
    with pytest.raises(KeyboardInterrupt):
        orc_factory(crashing, observers=[metrics]).run(crashing, {"n": 0}, run_id="m1")
    orc = orc_factory(counter("alpha"), observers=[metrics])
    orc.resume("m1")
    # Then the snapshots written are counted by trigger, sized and timed, and the recovery is counted
    points = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points[metric.name] = list(metric.data.data_points)
    by_trigger = {p.attributes["trigger"]: p.value for p in points["agentsaga.snapshots"]}
    held = orc.snapshots("m1")
    assert by_trigger["final"] == 1 and by_trigger["periodic"] == sum(1 for s in held if s.trigger == "periodic")
    [size] = points["agentsaga.snapshot.size"]
    assert size.count == len(held) and size.sum == sum(s.size_bytes for s in held)
    assert points["agentsaga.snapshot.write"][0].count == len(held)
    [recoveries] = points["agentsaga.recoveries"]
    assert recoveries.value == 1 and recoveries.attributes == {"workflow": "alpha"}
    [resumed] = [e["data"] for e in orc.history("m1") if e["kind"] == "Resumed"]
    assert points["agentsaga.recovery.replayed"][0].sum == resumed["replayed"]
