"""The names the database stores as they are: run ids, signal names, queue names, dedup keys.

Each is a non-empty string of at most 200 characters without control characters (NUL, newline,
tab, ...) or lone surrogates. Postgres cannot store a NUL in text and no database stores a lone
surrogate as UTF-8, so without this check the same name worked on SQLite and failed on Postgres
with a driver's error, and a newline in a run id broke every listing that shows it.
"""

from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["name_problem", "shown", "MAX_NAME"]

#: characters a stored name may hold
MAX_NAME = 200


def name_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a stored name (a phrase to follow "must be ..."), or None when it can."""
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        return f"a non-empty string of at most {MAX_NAME} characters"
    if not value.isprintable():  # fast for the usual name; isprintable() is False for more than controls
        for char in value:
            if unicodedata.category(char) in ("Cc", "Cs"):
                return (f"a string without control characters or lone surrogates (it holds {char!a} at "
                        f"position {value.index(char)})")
    return None


def shown(value: Any) -> str:
    """``value``'s repr for an error message, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
