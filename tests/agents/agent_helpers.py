"""Helpers shared by the agent tests (imported by name: tests/agents is put on sys.path)."""

from __future__ import annotations

from typing import Any

from orchestrator import Orchestrator

API_KEY = "sk-test-0123456789abcdefghijklmnop"  # shaped like a real key: the journal must never hold it


def calls(orc: Orchestrator, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The run's journaled durable calls (CallCompleted data), optionally of one kind."""
    return [e["data"] for e in orc.history(run_id)
            if e["kind"] == "CallCompleted" and (kind is None or e["data"]["kind"] == kind)]


def raw_journal(orc: Orchestrator, run_id: str) -> str:
    """Every event's stored JSON text, as the database holds it."""
    return "\n".join(e.data for e in orc.store.events(run_id))
