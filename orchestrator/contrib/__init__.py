"""Optional integrations, each in a module of its own that imports its library only when used:
``orchestrator.contrib.otel`` (OpenTelemetry spans per run and step)."""

__all__: list[str] = []
