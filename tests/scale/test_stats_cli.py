"""`agentsaga enqueue` and `agentsaga stats`, and OpenTelemetry spans (when the extra is installed)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from orchestrator import Orchestrator
from orchestrator.engine import ACTIVE_STATUSES
from orchestrator.engine.loader import load_target
from orchestrator.audit.stats import percentile
from orchestrator.scale import Worker
from orchestrator.cli import main

from .conftest import HANG, target, wait_for


def test_percentiles_interpolate():
    assert percentile([], 50) is None
    assert percentile([4.0], 99) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([0.0, 10.0], 90) == 9.0


def test_enqueue_verb_is_exactly_once_per_dedup_key(db_url, capsys):
    argv = ["enqueue", target("ten"), "--db", db_url, "--queue", "batch", "--dedup-key", "job-7", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == first["run_id"]
    assert first["status"] == "pending" and first["queue"] == "batch" and first["dedup_key"] == "job-7"
    assert main(["enqueue", target("ten"), "--db", db_url, "--queue", "bad queue"]) == 2
    assert "queue name" in capsys.readouterr().err


def test_stats_show_statuses_queues_recoveries_and_step_latency(db_url, thread_worker, capsys):
    ten = load_target(target("ten"))
    with Orchestrator(db_url, workflows=[ten]) as orc:
        for _ in range(5):
            orc.enqueue(ten, {}, queue="batch")
        waiting = [orc.enqueue(ten, {}, queue="later") for _ in range(2)]
        tw = thread_worker(Worker(db_url, [ten], queues=["batch"], concurrency=2))
        wait_for(lambda: orc.store.count_by_status().get("completed") == 5, timeout=HANG, what="5 runs")
        tw.stop()
        # Given a run whose worker died holding its lease (it is stale until recovered)
        now = orc.engine.config.clock()
        [(stale, _)] = orc.store.queues.claim(owner="gone", ttl=0.001, now=now - 1, statuses=ACTIVE_STATUSES,
                                            queues=["later"], limit=1)
        assert stale in waiting
        stats = orc.stats()
    assert stats.by_status == {"completed": 5, "pending": 2}
    assert stats.queues == [{"queue": "later", "ready": 2, "in_flight": 0, "parked": 0, "stale": 1}]
    assert stats.steps["count"] == 50 and stats.steps["p50"] <= stats.steps["p99"] <= stats.steps["max"]
    assert set(stats.by_step) == {f"s{i}" for i in range(10)}
    # And the verb prints the same, as a table or as JSON
    assert main(["stats", "--db", db_url]) == 0
    text = capsys.readouterr().out
    assert "RUNS BY STATUS" in text and "later" in text and "STEP LATENCY" in text and "p99" in text
    assert main(["stats", "--db", db_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["by_status"] == {"completed": 5, "pending": 2}


_OTEL = importlib.util.find_spec("opentelemetry") is not None and importlib.util.find_spec("opentelemetry.sdk")


@pytest.mark.skipif(not _OTEL, reason="OpenTelemetry is not installed: pip install 'agentsaga[otel]'")
def test_spans_per_run_and_step(sqlite_url, thread_worker):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from orchestrator.contrib.otel import Tracing
    from workflows import END, Workflow

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    wf = Workflow("traced")

    @wf.step(start=True)
    def fetch(ctx, state):
        return {"x": 1}

    @wf.step()
    def explode(ctx, state):
        raise ValueError("no luck")

    wf.edge("fetch", "explode")
    wf.edge("explode", END)
    with Orchestrator(sqlite_url, workflows=[wf], observers=[Tracing(provider)]) as orc:
        result = orc.run(wf, {}, run_id="t1")
    assert result.status == "failed"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"agentsaga.run traced", "agentsaga.step fetch", "agentsaga.step explode"}
    run, fetch_span, explode_span = spans["agentsaga.run traced"], spans["agentsaga.step fetch"], spans["agentsaga.step explode"]
    assert run.attributes["agentsaga.run_id"] == "t1" and run.attributes["agentsaga.status"] == "failed"
    for step in (fetch_span, explode_span):
        assert step.parent.span_id == run.context.span_id and step.context.trace_id == run.context.trace_id
        assert run.start_time <= step.start_time <= step.end_time <= run.end_time
    assert fetch_span.attributes["agentsaga.step"] == "fetch" and fetch_span.status.is_ok
    assert not explode_span.status.is_ok and "no luck" in explode_span.status.description


@pytest.mark.skipif(not _OTEL, reason="OpenTelemetry is not installed: pip install 'agentsaga[otel]'")
def test_a_worker_traces_each_run_it_drives(sqlite_url, thread_worker):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ten = load_target(target("ten"))
    with Orchestrator(sqlite_url, workflows=[ten]) as orc:
        run_id = orc.enqueue(ten, {})
        tw = thread_worker(Worker(sqlite_url, [ten], concurrency=1, tracing=provider))
        wait_for(lambda: orc.get_run(run_id).status == "completed", timeout=HANG, what="the run")
        tw.stop()
    spans = exporter.get_finished_spans()
    [run] = [s for s in spans if s.name == "agentsaga.run ten"]
    steps = [s for s in spans if s.name.startswith("agentsaga.step ")]
    assert run.attributes["agentsaga.lease_token"] == 1 and run.attributes["agentsaga.status"] == "completed"
    assert len(steps) == 10 and all(s.parent.span_id == run.context.span_id for s in steps)
