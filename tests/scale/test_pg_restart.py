"""Postgres stopped and started while workers drive runs: the workers reconnect with backoff (the
store's retry boundary, the LISTEN connection re-established) and every run still finishes once.

Needs a local cluster managed by ``pg_ctlcluster`` (Debian's postgresql-common), as on the CI
machine; elsewhere it is skipped with the reason. The server is started again in a ``finally``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target

from .conftest import journal_problems, target, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.restarts_postgres]


def _cluster() -> tuple[str, str] | None:
    url = os.environ.get("AGENTSAGA_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        return None
    if "127.0.0.1:5432" not in url and "localhost:5432" not in url:
        return None
    versions = sorted(os.listdir("/etc/postgresql"))
    return (versions[-1], "main") if versions else None


def _ctl(action: str) -> None:
    version, name = _cluster()  # type: ignore[misc]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action], check=True,
                   capture_output=True, timeout=60)


def _ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"], timeout=10).returncode == 0


@pytest.mark.skipif(_cluster() is None, reason="needs a local Postgres cluster managed by pg_ctlcluster")
def test_runs_finish_when_postgres_restarts_mid_run(pg_url, workers):
    lingering = load_target(target("lingering"))
    with Orchestrator(pg_url, workflows=[lingering]) as orc:
        ids = [orc.enqueue(lingering, {"pause": 0.2}) for _ in range(24)]
    procs = workers(pg_url)
    for _ in range(2):
        procs.start(target("lingering"), args=("--concurrency", "3", "--lease-ttl", "5", "--poll", "0.5"))
    with Orchestrator(pg_url, workflows=[lingering]) as orc:
        wait_for(lambda: orc.store.count_by_status().get("completed", 0) >= 3, timeout=30, what="the first runs")
    # When the server goes away for two seconds while runs are in flight
    try:
        _ctl("stop")
        time.sleep(2)
    finally:
        _ctl("start")
        wait_for(_ready, timeout=60, what="Postgres to accept connections again")
    # Then every run still finishes, each completed step once, with no interleaved writers
    with Orchestrator(pg_url, workflows=[lingering]) as orc:
        wait_for(lambda: orc.store.count_by_status() == {"completed": 24}, timeout=90,
                 what=f"all runs to finish\n{procs.logs()}")
        for run_id in ids:
            history = orc.history(run_id)
            assert journal_problems(history) == []
            assert [e["data"]["step"] for e in history if e["kind"] == "StepCompleted"] == ["first", "second"]
    # And both workers lived through it
    assert all(p.poll() is None for p, _ in procs.procs), procs.logs()
