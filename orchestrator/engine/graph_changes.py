"""Human-readable differences between two graph descriptions (``Workflow.describe()``)."""

from __future__ import annotations

from typing import Any

__all__ = ["graph_differences"]


def graph_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    diffs: list[str] = []
    old_steps = {s["name"]: s for s in old.get("steps", [])}
    new_steps = {s["name"]: s for s in new.get("steps", [])}
    for name in sorted(old_steps.keys() - new_steps.keys()):
        diffs.append(f"step {name!r} removed")
    for name in sorted(new_steps.keys() - old_steps.keys()):
        diffs.append(f"step {name!r} added")
    for name in sorted(old_steps.keys() & new_steps.keys()):
        if old_steps[name] != new_steps[name]:
            diffs.append(f"step {name!r} changed: {old_steps[name]} -> {new_steps[name]}")
    for label, key in (("edge", "edges"), ("router", "routes"), ("join", "joins")):
        before = {_key(x) for x in old.get(key, [])}
        after = {_key(x) for x in new.get(key, [])}
        for item in sorted(before - after):
            diffs.append(f"{label} {item} removed")
        for item in sorted(after - before):
            diffs.append(f"{label} {item} added")
    return diffs


def _key(item: Any) -> str:
    if isinstance(item, list) and len(item) >= 2 and all(isinstance(x, str) for x in item[:2]):
        if len(item) == 2:
            return f"{item[0]} -> {item[1]}"
        return f"{item[0]} -> {item[1]} {item[2:]}" if item[2:] != [None] else f"{item[0]} -> {item[1]}"
    return str(item)
