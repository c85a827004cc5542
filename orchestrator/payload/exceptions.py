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
    try:
        message = str(exc)
    except Exception as broken:  # noqa: BLE001 (the failure is recorded; its own __str__ must not lose it)
        message = f"<the message could not be built: str() of this {name} raised {type(broken).__name__}>"
    record: dict[str, Any] = {"type": name, "message": _storable(message)}
    if with_traceback and exc.__traceback__ is not None:
        try:
            text = "".join(traceback.format_exception(exc))
        except Exception:  # noqa: BLE001 (as above: a traceback is a help, the failure is what counts)
            text = "".join(traceback.format_tb(exc.__traceback__)) + f"{name}: {message}\n"
        text = _storable(text)
        record["traceback"] = text if len(text) <= TRACEBACK_LIMIT else "...\n" + text[-TRACEBACK_LIMIT:]
    return record


def _storable(text: str) -> str:
    """``text`` with any lone surrogate written as its escape: an error message is a record of what
    went wrong, and one the journal could not store (UTF-8 cannot hold a lone surrogate) would turn
    the failure into a second one."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
