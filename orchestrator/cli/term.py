"""Terminal output: aligned tables and escaping of control characters.

Run data (LLM output especially) can hold ANSI escapes or other control characters that would
rewrite the operator's terminal; everything printed from the journal goes through ``safe``.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["safe", "table", "when", "clip", "json_line"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_C1 = re.compile(r"[\x7f-\x9f]")


def safe(text: object) -> str:
    """``text`` with control characters shown as ``\\xNN`` escapes (newlines and tabs kept)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def json_line(value: Any) -> str:
    """One line of JSON for ``--json`` output. ``json`` escapes C0 controls (ESC included) inside
    strings but passes DEL and C1 controls through, and some terminals act on C1 (0x9b is a CSI):
    those are escaped too. The result is still valid JSON: they can only occur inside strings."""
    text = json.dumps(value, ensure_ascii=False)
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def clip(text: str, width: int) -> str:
    text = safe(text).replace("\n", " ")
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, max_width: int = 100) -> str:
    """Columns aligned; the widest column is clipped so a line fits in ``max_width``."""
    cells = [[clip(str(c), 200) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    total = sum(widths) + 2 * (len(widths) - 1)
    while total > max_width:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= 8:
            break
        widths[widest] -= total - max_width if widths[widest] - (total - max_width) >= 8 else widths[widest] - 8
        total = sum(widths) + 2 * (len(widths) - 1)
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in cells:
        lines.append("  ".join(clip(c, w).ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)
