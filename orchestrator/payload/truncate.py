"""Bounding a JSON value for the journal: cut its longest strings until it fits, and say so.

A model's response is journaled whole when it is small (nearly always); past the bound the longest
strings are cut, each ending in a marker with its full length, so the structure (choices, message,
tool calls, usage) survives and the audit still reads it. Cutting whole keys or the raw text would
lose the finish reason and token counts, which are what an audit of a runaway response needs.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["bound_json", "json_size", "MARKER"]

MARKER = "…[truncated: {n} chars]"
_MAX_CUTS = 64  # strings cut at most; past that the value is made of many small strings (see below)


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (what it costs in the journal, before redaction)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _longest(value: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], str] | None:
    best: tuple[tuple[Any, ...], str] | None = None
    if isinstance(value, str):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found = _longest(child, path + (key,))
        if found is not None and (best is None or len(found[1]) > len(best[1])):
            best = found
    return best


def _set(value: Any, path: tuple[Any, ...], new: str) -> Any:
    if not path:
        return new
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = new
    return value


def bound_json(value: Any, limit: int) -> tuple[Any, bool]:
    """``(value, False)`` if it fits in ``limit`` bytes, else a cut copy and True.

    Strings are cut longest first, each keeping as much of its start as the bound allows. A value
    still too big after that (thousands of short strings, or long numbers) is replaced by a
    ``{"truncated_json": prefix}`` object: bounded, marked, and never silently dropped.
    """
    size = json_size(value)
    if size <= limit:
        return value, False
    out = json.loads(json.dumps(value))  # a deep copy the cuts may change
    for _ in range(_MAX_CUTS):
        found = _longest(out)
        if found is None:
            break
        path, text = found
        excess = size - limit
        marker = MARKER.format(n=len(text))
        keep = len(text) - excess - len(marker.encode("utf-8"))
        if keep < 0 and len(text) <= len(marker) * 2:
            break  # the longest string is already short: cutting strings cannot make it fit
        # Characters, not bytes, are kept: multi-byte text may need a second pass, which the loop gives.
        out = _set(out, path, text[: max(keep, 0)] + marker)
        size = json_size(out)
        if size <= limit:
            return out, True
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    marker = MARKER.format(n=len(text))
    return {"truncated_json": text[: max(limit - len(marker) - 32, 0)] + marker}, True
