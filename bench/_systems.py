"""The engines and variants the benchmarks know, and how to build one inside a child process.

Importing this module imports no engine: each child imports only the one it measures, so one
library's import cost or global state never leaks into another's numbers.
"""

from __future__ import annotations

import importlib

# name -> (adapter module, backend, options for its System)
SYSTEMS: dict[str, tuple[str, str, dict]] = {
    "agentsaga-sqlite": ("_sys_agentsaga", "sqlite", {}),
    "dbos-sqlite": ("_sys_dbos", "sqlite", {"wal": False}),
    "dbos-sqlite-wal": ("_sys_dbos", "sqlite", {"wal": True}),
    "langgraph-sqlite-sync": ("_sys_langgraph", "sqlite", {"durability": "sync"}),
    "langgraph-sqlite-default": ("_sys_langgraph", "sqlite", {"durability": None}),
    "agentsaga-pg": ("_sys_agentsaga", "pg", {}),
    "dbos-pg": ("_sys_dbos", "pg", {}),
    "langgraph-pg-sync": ("_sys_langgraph", "pg", {"durability": "sync"}),
}

# The import each adapter needs: checked once by the parent so a peer that is not installed is
# reported as such instead of failing every child.
REQUIRES = {
    "_sys_agentsaga": "from orchestrator import Orchestrator; from workflows import Workflow",
    "_sys_dbos": "import dbos",
    "_sys_langgraph": "import langgraph.graph, langgraph.checkpoint.sqlite",
}
REQUIRES_PG = {"_sys_langgraph": "import langgraph.checkpoint.postgres"}


def backend_of(name: str) -> str:
    return SYSTEMS[name][1]


def make_system(name: str, target: dict, extra: dict | None = None):
    module, backend, options = SYSTEMS[name]
    mod = importlib.import_module(module)
    return mod.System(backend=backend, target=target, **options, **(extra or {}))
