"""Human-readable differences between two graph descriptions (``Workflow.describe()``).

``old`` is the description a run recorded when it started; ``new`` the registered workflow's. No
differences means the same graph, even when the fingerprints differ: an older agentsaga may have
described the same graph in another way, and a run it journaled must resume under this one. The
one such way so far: a ``compensate=`` function was recorded as ``module.qualname``, where the
module was whatever the app had been loaded as (``__main__`` under ``python agent.py``, a name
made from the file's absolute path under ``--app agent.py``). Today a function of the
workflow's own module is recorded by its qualname, one of another module as ``module:qualname``
(``workflows/_step.py``); ``_as_current`` reads the old form as the new one where it names the
same function.
"""

from __future__ import annotations

from typing import Any

__all__ = ["graph_differences"]

_LISTED = ("steps", "edges", "routes", "joins")


def graph_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed from ``old`` to ``new``, one phrase per change; empty when it is the same graph."""
    old = _as_current(old, new)
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
    # Anything else a description holds (its name, a part added later) is compared too: an empty
    # answer must mean the same graph, never a difference nobody put into words.
    for key in sorted((old.keys() | new.keys()) - set(_LISTED)):
        if old.get(key) != new.get(key):
            diffs.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    return diffs


def _as_current(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with each step's compensation name in today's form where it names the same function
    as ``new`` does (a copy; ``old`` is left alone)."""
    now = {s["name"]: s.get("compensate") for s in new.get("steps", []) if isinstance(s, dict)}
    steps = []
    for step in old.get("steps", []):
        recorded, current = step.get("compensate"), now.get(step.get("name"))
        if isinstance(recorded, str) and isinstance(current, str) and _older_name_of(recorded, current):
            step = {**step, "compensate": current}
        steps.append(step)
    return {**old, "steps": steps} if "steps" in old else old


def _older_name_of(recorded: str, current: str) -> bool:
    """Whether ``recorded`` is how an older agentsaga named the function ``current`` names:
    ``module.qualname``. For a function of the workflow's own module (``current`` is its qualname)
    any module is accepted, since that module's name was an accident of loading; for one of
    another module (``module:qualname``) only that module."""
    if recorded == current or ":" in recorded:
        return False  # the same, or written in today's form: compared as it is
    module, colon, qualname = current.partition(":")
    if colon:
        return recorded == f"{module}.{qualname}"
    return recorded.endswith("." + current)


def _key(item: Any) -> str:
    if isinstance(item, list) and len(item) >= 2 and all(isinstance(x, str) for x in item[:2]):
        if len(item) == 2:
            return f"{item[0]} -> {item[1]}"
        return f"{item[0]} -> {item[1]} {item[2:]}" if item[2:] != [None] else f"{item[0]} -> {item[1]}"
    return str(item)
