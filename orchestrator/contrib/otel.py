"""OpenTelemetry spans per run and per step: optional (``pip install 'agentsaga[otel]'``), off by default.

``Orchestrator(observers=[Tracing()])`` (``Worker(..., tracing=True)``, ``agentsaga worker --otel``) makes

- a span ``agentsaga.run <workflow>`` each time a process drives a run (from its ``RunStarted`` or
  ``Resumed`` until it ends, parks to wait, or the process lets it go), with the run id, workflow,
  lease owner and token, and the status it was left in;
- a child span ``agentsaga.step <step>`` per ``StepCompleted`` / ``StepFailed``, with the step, tick,
  attempt and, for failures, the error (span status ERROR).

Step spans are made from the journal's events as they are committed (an Orchestrator observer), timed
by the step's own measured ``ms``, so the engine carries no tracing code and a span says exactly
what the journal says. The tracer comes from the global provider unless one is passed: configure
the SDK and an exporter as usual. Nothing is imported from OpenTelemetry unless tracing is enabled.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConfigurationError

if TYPE_CHECKING:
    from orchestrator.engine.journal import ActiveRun
    from store import NewEvent

__all__ = ["Tracing", "CheckpointMetrics"]

_STARTS = frozenset({"RunStarted", "Resumed"})
# After these the process stops driving the run: it ended, or it parks until a signal or a timer.
_ENDS = {"RunCompleted": "completed", "RunFailed": "failed", "RunCancelled": "cancelled",
         "SagaCompleted": "compensated", "SagaFailed": "compensation_failed",
         "WaitStarted": "waiting", "TimerStarted": "waiting"}
_STEPS = frozenset({"StepCompleted", "StepFailed"})


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


class Tracing:
    def __init__(self, tracer_provider: Any = None, *, owner: str | None = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError:
            raise ConfigurationError("tracing needs OpenTelemetry: pip install 'agentsaga[otel]' "
                                     "(opentelemetry-api and opentelemetry-sdk)") from None
        self._trace = trace
        self.tracer = trace.get_tracer("agentsaga", tracer_provider=tracer_provider)
        self._runs: dict[str, tuple[Any, str]] = {}  # run_id -> (span, workflow)
        self._lock = threading.Lock()
        #: the lease owner named on run spans (the Orchestrator's ``owner``)
        self.owner = owner
        self._workflows: dict[str, str] = {}  # run_id -> workflow name, from the runs observed

    def __call__(self, run: ActiveRun, events: list[NewEvent]) -> None:
        """The observer hook (``Orchestrator(observers=[tracing])``): spans from committed events."""
        self._workflows[run.run_id] = run.workflow.name
        self.on_event(run.run_id, events)

    # -- run spans --------------------------------------------------------------------------------
    def start_run(self, run_id: str, workflow: str, at: float, *, token: int | None = None) -> None:
        with self._lock:
            if run_id in self._runs:
                return
            attrs: dict[str, Any] = {"agentsaga.run_id": run_id, "agentsaga.workflow": workflow}
            if self.owner:
                attrs["agentsaga.owner"] = self.owner
            if token is not None:
                attrs["agentsaga.lease_token"] = token
            span = self.tracer.start_span(f"agentsaga.run {workflow}", start_time=_ns(at), attributes=attrs)
            self._runs[run_id] = (span, workflow)

    def end_run(self, run_id: str, status: str, at: float | None = None, error: str | None = None) -> None:
        with self._lock:
            found = self._runs.pop(run_id, None)
        if found is None:
            return
        span = found[0]
        span.set_attribute("agentsaga.status", status)
        if error:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error[:500]))
        span.end(end_time=_ns(at) if at is not None else None)

    # -- from the journal ---------------------------------------------------------------------------
    def on_event(self, run_id: str, events: list[NewEvent]) -> None:
        for event in events:
            kind = event.kind
            if kind in _STARTS:
                data = json.loads(event.data)
                self.start_run(run_id, data.get("workflow") or self._workflow(run_id), event.at,
                               token=data.get("lease"))
            elif kind in _STEPS:
                self._step(run_id, kind, json.loads(event.data), event.at)
            elif kind in _ENDS:
                self.end_run(run_id, _ENDS[kind], event.at)

    def _workflow(self, run_id: str) -> str:
        found = self._runs.get(run_id)
        if found is not None:
            return found[1]
        return self._workflows.get(run_id, "?")

    def _step(self, run_id: str, kind: str, data: dict[str, Any], at: float) -> None:
        ms = float(data.get("ms") or 0.0)
        with self._lock:
            found = self._runs.get(run_id)
        if found is None:  # a run started by orc.run: its RunStarted was written before any commit
            self.start_run(run_id, self._workflow(run_id), at - ms / 1000.0)
            found = self._runs.get(run_id)
        trace = self._trace
        context = trace.set_span_in_context(found[0]) if found else None
        step = str(data.get("step"))
        attrs = {"agentsaga.run_id": run_id, "agentsaga.step": step, "agentsaga.tick": int(data.get("tick", 0)),
                 "agentsaga.attempt": int(data.get("attempt", 1))}
        span = self.tracer.start_span(f"agentsaga.step {step}", context=context, start_time=_ns(at - ms / 1000.0),
                                      attributes=attrs)
        if kind == "StepFailed":
            error = data.get("error") or {}
            span.set_attribute("agentsaga.final", bool(data.get("final")))
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{error.get('type')}: {error.get('message')}"[:500]))
        span.end(end_time=_ns(at))


class CheckpointMetrics:
    """OpenTelemetry metrics of checkpoints, made in the process that drives runs
    (``Orchestrator(observers=[CheckpointMetrics()])``), each with the ``workflow`` attribute:

    - ``agentsaga.snapshots`` (counter, attribute ``trigger``: periodic, timed, effect, gate, adaptive,
      final, on_demand ... with ``gate:STEP`` as ``gate``): snapshots written;
    - ``agentsaga.snapshot.size`` (histogram, bytes) and ``agentsaga.snapshot.write`` (histogram, ms:
      making the snapshot and the commit that carried it);
    - ``agentsaga.snapshot.rejected`` (counter): snapshots a recovery skipped;
    - ``agentsaga.recoveries`` (counter) and ``agentsaga.recovery.replayed`` (histogram): takeovers
      of a run, and the events each folded after its snapshot.

    The meter comes from the global provider unless one is passed.
    """

    def __init__(self, meter_provider: Any = None) -> None:
        try:
            from opentelemetry import metrics
        except ImportError:
            raise ConfigurationError("checkpoint metrics need OpenTelemetry: pip install 'agentsaga[otel]'") from None
        meter = metrics.get_meter("agentsaga", meter_provider=meter_provider)
        self.snapshots = meter.create_counter("agentsaga.snapshots", unit="1", description="snapshots written")
        self.size = meter.create_histogram("agentsaga.snapshot.size", unit="By", description="snapshot size")
        self.write = meter.create_histogram("agentsaga.snapshot.write", unit="ms",
                                            description="making a snapshot and the commit that carried it")
        self.rejected = meter.create_counter("agentsaga.snapshot.rejected", unit="1",
                                             description="snapshots a recovery skipped")
        self.recoveries = meter.create_counter("agentsaga.recoveries", unit="1", description="takeovers of a run")
        self.replayed = meter.create_histogram("agentsaga.recovery.replayed", unit="1",
                                               description="events folded after the snapshot per recovery")

    def __call__(self, run: ActiveRun, events: list[NewEvent]) -> None:
        """The observer hook: metrics from what the commit wrote."""
        workflow = {"workflow": run.workflow.name}
        snap = run.last_snapshot
        if snap is not None:
            self.snapshots.add(1, {**workflow, "trigger": snap["trigger"].split(":", 1)[0]})
            self.size.record(snap["bytes"] or 0, workflow)
            self.write.record(snap["write_ms"], workflow)
        for event in events:
            if event.kind == "Resumed":
                self.recoveries.add(1, workflow)
                replayed = json.loads(event.data).get("replayed")
                if isinstance(replayed, int):
                    self.replayed.record(replayed, workflow)
            elif event.kind == "SnapshotRejected":
                self.rejected.add(1, workflow)
