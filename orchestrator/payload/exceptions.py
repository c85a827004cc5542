"""An exception as a journal record: its type, message and (bounded) traceback, as JSON.

The record is redacted with the rest of its event before it is written (invariant 9), so a secret
in an exception message or a traceback line is scrubbed like any other field.
"""

from __future__ import annotations

import traceback
from typing import Any

__all__ = ["error_record"]

#: characters of a traceback kept (the end: where it was raised)
TRACEBACK_LIMIT = 8000


def error_record(exc: BaseException, *, with_traceback: bool = True) -> dict[str, Any]:
    """``{"type", "message", "traceback"?}`` for ``exc``; builtins are named without their module."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    record: dict[str, Any] = {"type": name, "message": str(exc)}
    if with_traceback and exc.__traceback__ is not None:
        text = "".join(traceback.format_exception(exc))
        record["traceback"] = text if len(text) <= TRACEBACK_LIMIT else "...\n" + text[-TRACEBACK_LIMIT:]
    return record
