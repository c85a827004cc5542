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
    from orchestrator.cli.commands import main as run

    return run(args)


def __getattr__(name: str) -> object:
    if name == "build_parser":
        from orchestrator.cli.commands import build_parser

        return build_parser
    raise AttributeError(f"module 'orchestrator.cli' has no attribute {name!r}")
