"""The canonical programs' crash tests kill a program at every outgoing call on SQLite and, on
Postgres, at the sample of calls the test module names in ``PG_SAMPLE``. The other Postgres points
are deselected at collection, not skipped, so that a skip in a CI run always means something is
missing."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    unsampled: list[pytest.Item] = []
    for item in items:
        sample = getattr(getattr(item, "module", None), "PG_SAMPLE", None)
        params = getattr(getattr(item, "callspec", None), "params", {})
        k = params.get("k")
        if sample is not None and params.get("db_url") == "postgres" and k is not None and k not in sample:
            unsampled.append(item)
        else:
            kept.append(item)
    if unsampled:
        config.hook.pytest_deselected(items=unsampled)
        items[:] = kept
