"""An exception as a journal record: its type, message and (bounded) traceback, as JSON.

The record is redacted with the rest of its event before it is written (invariant 9), so a secret
in an exception message or a traceback line is scrubbed like any other field.

Both are bounded. A message (say, a response body pasted into an exception) is journaled in every
``StepFailed`` of the step, in ``RunFailed``, in the run row's error and in snapshots: past
``MESSAGE_LIMIT`` characters its start and its end are kept and the middle is replaced by a marker
saying how many characters were cut of how many. In the traceback each exception's message (a
chained one's too) is cut the same way at ``TRACEBACK_MESSAGE_LIMIT``, so the frames stay, and past
``TRACEBACK_LIMIT`` its end (where it was raised) is kept.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

__all__ = ["error_record", "bounded", "MESSAGE_LIMIT", "TRACEBACK_LIMIT"]

#: characters of an exception's message kept (half from its start, half from its end)
MESSAGE_LIMIT = 8000
#: characters of a traceback kept (the end: where it was raised)
TRACEBACK_LIMIT = 8000
#: characters of each exception's message kept inside the traceback (the record has the message too)
TRACEBACK_MESSAGE_LIMIT = 2000

#: what replaces the middle of a text that was too long
CUT = "…[{cut:,} of {total:,} characters cut]…"


#: a run of characters a key or token is made of: a cut never splits one (up to ``_WORD`` long), so
#: redaction, which knows a key by its whole form, still sees every key that is kept whole or not at all
_TOKEN_END = re.compile(r"[A-Za-z0-9._~+/=-]+$")
_TOKEN_START = re.compile(r"[A-Za-z0-9._~+/=-]+")
_WORD = 512


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` if it has at most ``limit`` characters; else about its first and last ``limit // 2``
    characters around a marker saying how many were cut of how many. A word (a key, a token) the
    cut would split is cut whole."""
    if len(text) <= limit:
        return text
    head = limit // 2
    start = len(text) - (limit - head)
    if _TOKEN_START.match(text, head):  # the kept start ends inside a word: end before it
        inside = _TOKEN_END.search(text, max(head - _WORD, 0), head)
        if inside is not None and inside.start() > max(head - _WORD, 0):  # else a "word" longer than any key
            head = inside.start()
    if start > 0 and _TOKEN_END.search(text, start - 1, start):  # the kept end starts inside a word
        inside = _TOKEN_START.match(text, start, start + _WORD)
        if inside is not None and inside.end() < min(start + _WORD, len(text)):
            start = inside.end()
    return text[:head] + CUT.format(cut=start - head, total=len(text)) + text[start:]


def error_record(exc: BaseException, *, with_traceback: bool = True) -> dict[str, Any]:
    """``{"type", "message", "traceback"?}`` for ``exc``; builtins are named without their module."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    try:
        message = str(exc)
    except Exception as broken:  # noqa: BLE001 (the failure is recorded; its own __str__ must not lose it)
        message = f"<the message could not be built: str() of this {name} raised {type(broken).__name__}>"
    record: dict[str, Any] = {"type": name, "message": _storable(bounded(message))}
    if with_traceback and exc.__traceback__ is not None:
        try:
            text = "".join(_traceback_parts(exc))
        except Exception:  # noqa: BLE001 (as above: a traceback is a help, the failure is what counts)
            text = "".join(traceback.format_tb(exc.__traceback__)) + f"{name}: {bounded(message, TRACEBACK_MESSAGE_LIMIT)}\n"
        text = _storable(text)
        if len(text) > TRACEBACK_LIMIT:
            text = CUT.format(cut=len(text) - TRACEBACK_LIMIT, total=len(text)) + "\n" + text[-TRACEBACK_LIMIT:]
        record["traceback"] = text
    return record


def _traceback_parts(exc: BaseException) -> list[str]:
    """The lines of ``exc``'s traceback (its chain's too), each exception's message cut to
    ``TRACEBACK_MESSAGE_LIMIT``: frames are short, a message can be any length."""
    parts: list[str] = []
    for part in traceback.TracebackException.from_exception(exc).format():
        # Each part is a frame, a chain separator, or one exception's "Type: message" (and notes).
        parts.append(bounded(part, TRACEBACK_MESSAGE_LIMIT) if len(part) > TRACEBACK_MESSAGE_LIMIT else part)
    return parts


def _storable(text: str) -> str:
    """``text`` with any lone surrogate or NUL written as its escape: an error message is a record
    of what went wrong, and one the database could not store (UTF-8 cannot hold a lone surrogate,
    and a Postgres text column, the run's error, cannot hold a NUL) would turn the failure into a
    second one, leaving the run as it was."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
