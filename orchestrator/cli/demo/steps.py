"""What the demo prints about a run, read from its journal alone: the step table and model calls."""

from __future__ import annotations

from typing import Any

from orchestrator.cli.term import table

__all__ = ["llm_calls", "step_table"]


def llm_calls(history: list[dict[str, Any]]) -> int:
    """How many model calls the journal holds (each one paid for once)."""
    return sum(1 for e in history if e["kind"] == "CallCompleted" and e["data"].get("kind") == "llm")


def step_table(history: list[dict[str, Any]]) -> str:
    """One row per step execution, with its model calls, tokens and tool calls, and the crash."""
    rows: list[list[Any]] = []
    calls: dict[str, list[dict[str, Any]]] = {}
    for event in history:
        kind, data = event["kind"], event["data"]
        if kind == "CallCompleted":
            calls.setdefault(data["step"], []).append(data)
        elif kind == "Resumed":
            rows.append(["-- resumed --", "", "", "", "", "", f"by {data.get('owner', '?')}"])
        elif kind == "WaitStarted":
            rows.append([data["step"], "waiting", "", "", "", "", f"for signal {data.get('name')!r}"])
        elif kind in ("StepCompleted", "StepFailed"):
            made = calls.pop(data["step"], [])
            llm = [c for c in made if c["kind"] == "llm"]
            tokens = sum(((c.get("response") or {}).get("usage") or {}).get("total_tokens") or 0 for c in llm)
            tools = sum(1 for c in made if c["kind"] == "tool")
            outcome = "completed" if kind == "StepCompleted" else ("failed" if data.get("final") else "retrying")
            note = (data.get("error") or {}).get("message", "") if kind == "StepFailed" else \
                ("; ".join(t.get("msg", "") for t in data.get("trace") or []) or "")
            rows.append([data["step"], outcome, f"{data.get('ms') or 0:.0f}", len(llm), tokens or "", tools or "",
                         note])
    return table(["STEP", "OUTCOME", "MS", "MODEL CALLS", "TOKENS", "TOOL CALLS", "NOTE"], rows)
