"""Fixtures for the store's contract suite."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

# The suite runs with --import-mode=importlib, which leaves sys.path alone; the plain helper
# functions in store_helpers.py (not fixtures: tests call them with arguments) need their
# directory importable. The module name is unique to this directory.
sys.path.insert(0, str(Path(__file__).parent))

from store_helpers import raw_connect  # noqa: E402


@pytest.fixture
def raw_sql(db_url: str) -> Callable[..., list[Sequence[Any]]]:
    """raw_sql(sql, params=()) runs one statement (`?` placeholders) outside the store."""

    def run(sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        conn = raw_connect(db_url)
        try:
            if not db_url.startswith("sqlite"):
                sql = sql.replace("?", "%s")
            cur = conn.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    return run
