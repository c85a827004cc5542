"""Names a package exports without importing them until first use (PEP 562).

``import orchestrator`` and ``agentsaga --help`` must not load the engine, SQLAlchemy and pydantic,
and ``python -m orchestrator.testing.booking_service`` must not find its own module imported by
the package first. A package lists what it exports lazily and where each name lives:

    __getattr__, __dir__ = lazy_exports(__name__, {"Orchestrator": "orchestrator._orchestrator"}, globals())

The first access imports the module and keeps the value in the package's namespace, so later
accesses are plain attribute reads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, table: dict[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` for ``package``'s lazily imported names."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
