"""Optional integrations, each in a module of its own that imports its library only when used:
``orchestrator.contrib.otel`` (OpenTelemetry spans per run and step) and
``orchestrator.contrib.pydantic_ai`` (pydantic-ai agents whose model requests and tool calls are
durable calls of the step that runs them)."""

__all__: list[str] = []
