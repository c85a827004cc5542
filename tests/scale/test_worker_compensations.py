"""A ``Worker`` undoes effects with the compensations it is given: ``compensations=`` with a URL, and
the ``Compensations`` registries at the top level of the apps it is told to import."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from compensations import Compensations
from orchestrator import ConfigurationError, Orchestrator
from orchestrator.scale import Worker

from .conftest import HANG, wait_for

APP = (Path(__file__).parents[1] / "orchestrator" / "registry_app.py").read_text()


@pytest.fixture
def app_file(tmp_path: Path) -> Path:
    path = tmp_path / "app" / "tripapp.py"
    path.parent.mkdir()
    path.write_text(APP, encoding="utf-8")
    return path


def import_app(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"worker_registry_app_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused_run(app: ModuleType, db_url: str, run_id: str) -> None:
    """Given: a run started with the registry, waiting after its booking, then refused (nobody drives it)."""
    with Orchestrator(db_url, workflows=[app.trip], compensations=app.undo) as orc:
        assert orc.run(app.trip, {}, run_id=run_id).status == "waiting"
        orc.signal(run_id, "approval", {"ok": False})


def drive(worker: Worker, thread_worker, db_url: str, run_id: str) -> str:
    tw = thread_worker(worker)
    try:
        with Orchestrator(db_url) as orc:
            return str(wait_for(lambda: orc.get_run(run_id).status in ("compensated", "compensation_failed", "failed")
                                and orc.get_run(run_id).status, timeout=HANG, what=f"run {run_id} to end"))
    finally:
        tw.stop()  # the worker closes the Orchestrator it made


def test_a_worker_given_an_app_file_uses_the_registry_at_its_top_level(app_file, db_url, thread_worker):
    # Given a refused run, started in Python with the registry
    refused_run(import_app(app_file), db_url, "w1")
    # When a worker is given the app as a file to import (no compensations= of its own)
    worker = Worker(db_url, [str(app_file)], poll=0.1)
    status = drive(worker, thread_worker, db_url, "w1")
    # Then the registry found beside the workflow cancels the flight once
    assert status == "compensated"
    assert (app_file.parent / "ledger.txt").read_text() == "cancel F1\n"


def test_a_worker_given_compensations_uses_them(app_file, db_url, thread_worker):
    # Given a refused run, started in Python with the registry
    app = import_app(app_file)
    refused_run(app, db_url, "w2")
    # When a worker is given the workflow object and the registry
    worker = Worker(db_url, [app.trip], compensations=app.undo, poll=0.1)
    status = drive(worker, thread_worker, db_url, "w2")
    # Then the registry cancels the flight once
    assert status == "compensated"
    assert (app_file.parent / "ledger.txt").read_text() == "cancel F1\n"


def test_compensations_are_the_orchestrators_when_one_is_given(sqlite_url):
    with Orchestrator(sqlite_url) as orc:
        with pytest.raises(ConfigurationError, match=r"compensations are the Orchestrator's"):
            Worker(orc, compensations=Compensations())


def test_compensations_must_be_a_registry(sqlite_url):
    with pytest.raises(ConfigurationError, match="compensations must be a compensations.Compensations"):
        Worker(sqlite_url, compensations={"book_flight": print})  # type: ignore[arg-type]
