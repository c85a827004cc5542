"""The ``agentsaga`` command line.

The entry point answers ``agentsaga --version`` and ``agentsaga --help`` without importing the
engine (SQLAlchemy, SQLModel, pydantic): they are the commands a person types first, and a
second of start-up for them is a second of waiting. ``--help`` prints the text the real parser
formats (``orchestrator/cli/_help.txt``, checked against it by tests/orchestrator/test_cli_startup.py);
every other command line goes to ``orchestrator.cli.commands``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.cli.commands import build_parser

__all__ = ["main", "build_parser"]

HELP_FILE = "_help.txt"


def version() -> str:
    """The installed package's version (the working tree's pyproject.toml when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("agentsaga")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def help_text() -> str:
    """``agentsaga --help`` as the parser formats it (80 columns), kept beside this module."""
    from pathlib import Path

    return (Path(__file__).with_name(HELP_FILE)).read_text(encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):
        print(f"agentsaga {version()}")
        return 0
    if args in (["--help"], ["-h"]):
        sys.stdout.write(help_text())
        return 0
    if verb_of(args) == "worker":
        return _worker(args, entry=argv is None)
    from orchestrator.cli.commands import main as run

    return run(args)


def verb_of(args: Sequence[str]) -> str | None:
    """The verb of a command line, read before the parser is built (``--db URL`` may precede it)."""
    words = iter(args)
    for word in words:
        if word == "--db":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _worker(args: list[str], *, entry: bool) -> int:
    """``agentsaga worker``: a SIGTERM or SIGINT before the worker is ready (while the engine, the
    app or the database are being opened) ends start-up in order, exit 0 (``cli/stopping.py``).
    ``entry``: this is the process's command (the console script, ``python -m``), which ends when
    the worker has stopped, so the handlers stay to the end; called in-process (``main([...])``),
    the caller's handlers are put back."""
    from orchestrator.cli.stopping import StopRequested, catch_while_starting, restore

    previous = catch_while_starting()
    try:
        from orchestrator.cli.commands import main as run

        return run(args)
    except StopRequested as stop:
        print(f"agentsaga: worker stopped by {stop.name} while starting, before it claimed any run",
              file=sys.stderr)
        return 0
    finally:
        if not entry:
            restore(previous)


def __getattr__(name: str) -> object:
    if name == "build_parser":
        from orchestrator.cli.commands import build_parser

        return build_parser
    raise AttributeError(f"module 'orchestrator.cli' has no attribute {name!r}")
