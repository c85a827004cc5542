"""What every CLI verb module shares: its two error kinds, argument parsing and opening the engine.

Kept apart from ``cli.py`` so the verb modules (``cli.py`` for running, ``_cli_audit.py`` for
reading) can both import it without importing each other.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator._orchestrator import Orchestrator
from orchestrator.cli.progress import Progress

__all__ = ["UsageError", "CommandError", "parse_time", "parse_json", "parse_duration", "open_orchestrator",
           "add_progress_flag"]


class UsageError(Exception):
    """Bad command-line input (exit 2)."""


class CommandError(Exception):
    """The operation could not be done, for a reason outside the engine (exit 1), e.g. a file."""


def parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"invalid time {text!r}: use ISO 8601, e.g. 2026-11-22 or 2026-11-22T10:00:00") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.timestamp()


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str | None, what: str) -> float | None:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d``, ``2w`` -> seconds."""
    if text is None:
        return None
    found = _DURATION.match(text)
    if not found:
        raise UsageError(f"{what} {text!r} is not a duration: use a number with s, m, h, d or w (e.g. 30d)")
    return float(found.group(1)) * _UNIT[found.group(2)]


def open_orchestrator(args: argparse.Namespace, workflows: Sequence[Any] = ()) -> Orchestrator:
    """The Orchestrator a verb works with; progress lines on when asked or when stderr is a terminal."""
    progress = getattr(args, "progress", False) or (hasattr(args, "progress") and sys.stderr.isatty())
    return Orchestrator(args.db, workflows=workflows, observers=[Progress(sys.stderr)] if progress else ())


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action="store_true",
                        help="print a line per finished step to stderr (the default when stderr is a terminal)")
