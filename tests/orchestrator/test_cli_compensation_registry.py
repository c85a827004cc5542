"""The app the command line names supplies its ``Compensations`` registries, as docs/sagas.md shows
them (``undo = Compensations()``, ``@undo.compensates("book_flight")``).

A run started from Python with ``Orchestrator(url, workflows=[trip], compensations=undo)`` and then
driven by a verb (``signal --resume``, ``compensate``, ``cancel --compensate``, ``worker``) is
undone by the registries at the top level of the app's modules, combined when there are several;
one effect name registered with two different functions is an error that names it and changes
nothing. Run with the real console script in a project directory, on SQLite and Postgres; what is
checked is what a person sees: the exit code, the output, the journal (``agentsaga history --json``)
and the ledger file each compensation appends to.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator import Orchestrator

pytestmark = pytest.mark.slow

HANG = 120.0

APP = (Path(__file__).parent / "registry_app.py").read_text()

#: A second app module: a workflow of its own with two effects, one undone by this module's
#: registry and one by app.py's (the effect ``book_flight``).
HOTELS = '''\
from pathlib import Path

from compensations import Compensations
from workflows import Workflow

LEDGER = Path(__file__).resolve().parent / "ledger.txt"

hotel_undo = Compensations()
stay = Workflow("stay")


@stay.step(effect=True)
def book_flight(ctx, state):
    return {"flight": "F2"}


@stay.step(effect=True)
def book_hotel(ctx, state):
    return {"hotel": "H2"}


@hotel_undo.compensates("book_hotel")
def cancel_hotel(ctx, effect):
    with LEDGER.open("a") as ledger:
        ledger.write(f"cancel {effect.result['hotel']}\\n")


@stay.step
def pay(ctx, state):
    raise ValueError("card declined")
'''

#: A module that registers a second, different compensation for the effect ``book_flight``.
CLASH = '''\
from compensations import Compensations

other = Compensations()


@other.compensates("book_flight")
def refund_flight(ctx, effect):
    pass
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A person's project directory holding the app file ``app.py`` (workflow 'trip', registry ``undo``)."""
    where = tmp_path / "proj"
    where.mkdir()
    (where / "app.py").write_text(APP, encoding="utf-8")
    return where


def agentsaga(project: Path, *args: str) -> subprocess.CompletedProcess:
    """The console script, run in the project directory as a person would run it."""
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSAGA_") and k != "PYTHONPATH"}
    return subprocess.run([found, *args], cwd=project, capture_output=True, text=True, env=env, timeout=HANG)


def import_app(path: Path) -> ModuleType:
    """The app file imported the way a person's start script would (``from app import trip, undo``)."""
    spec = importlib.util.spec_from_file_location(f"registry_app_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start_waiting(project: Path, db_url: str, run_id: str) -> None:
    """Given: a run of 'trip' started from Python with the registry, as docs/sagas.md shows; it
    booked the flight and waits for approval."""
    app = import_app(project / "app.py")
    with Orchestrator(db_url, workflows=[app.trip], compensations=app.undo) as orc:
        assert orc.run(app.trip, {}, run_id=run_id).status == "waiting"


def history(project: Path, db_url: str, run_id: str) -> list[dict]:
    done = agentsaga(project, "history", run_id, "--json", "--db", db_url)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def kinds(events: list[dict], *wanted: str) -> list[str]:
    return [e["kind"] for e in events if e["kind"] in wanted]


def ledger(project: Path) -> str:
    path = project / "ledger.txt"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def test_signal_resume_with_the_app_undoes_the_effect_with_the_apps_registry(project, db_url):
    # Given a run started in Python with the registry, waiting for approval after booking a flight
    start_waiting(project, db_url, "t1")
    # When the approval is refused and the run driven here with --app app.py
    done = agentsaga(project, "signal", "t1", "approval", "--data", '{"ok": false}', "--resume",
                     "--app", "app.py", "--db", db_url, "--json")
    # Then the payment fails and the registry's compensation cancels the flight: the run is compensated
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["error"], out["failed_step"]) == ("compensated", "ValueError: not approved", "pay")
    assert ledger(project) == "cancel F1\n"
    # And the journal shows one compensation of the booking, and a saga that completed
    events = history(project, db_url, "t1")
    assert kinds(events, "CompensationStarted", "CompensationCompleted", "SagaFailed", "SagaCompleted") == [
        "CompensationStarted", "CompensationCompleted", "SagaCompleted"]
    assert [e["data"]["step"] for e in events if e["kind"] == "CompensationCompleted"] == ["book_flight"]
    assert [e["data"]["outcome"] for e in events if e["kind"] == "SagaCompleted"] == ["compensated"]


def test_compensate_with_the_app_finishes_a_run_driven_without_the_registry(project, db_url):
    # Given a run started with the registry, then driven to its failure by a process without it
    start_waiting(project, db_url, "t2")
    app = import_app(project / "app.py")
    with Orchestrator(db_url, workflows=[app.trip]) as orc:  # no compensations=
        failed = orc.signal("t2", "approval", {"ok": False}, resume=True)
    assert failed is not None and failed.status == "compensation_failed"
    assert ledger(project) == ""
    # Then its journal says the flight was NOT undone, and how to give the process the registry
    [saga_failed] = [e for e in history(project, db_url, "t2") if e["kind"] == "SagaFailed"]
    message = saga_failed["data"]["error"]["message"]
    assert "'book_flight'" in message and "NOT undone" in message
    assert "Compensations registry" in message and "compensations=" in message and "--app" in message
    # When `agentsaga compensate` retries with the app named
    done = agentsaga(project, "compensate", "t2", "--app", "app.py", "--db", db_url, "--json")
    # Then the registry's compensation cancels the flight once and the run ends compensated
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "compensated"
    assert ledger(project) == "cancel F1\n"
    events = history(project, db_url, "t2")
    assert kinds(events, "SagaFailed", "SagaRetried", "CompensationCompleted", "SagaCompleted") == [
        "SagaFailed", "SagaRetried", "CompensationCompleted", "SagaCompleted"]
    # And a second `compensate` has nothing left to do and undoes nothing twice
    again = agentsaga(project, "compensate", "t2", "--app", "app.py", "--db", db_url)
    assert again.returncode == 1 and "only a compensation_failed run" in again.stderr
    assert ledger(project) == "cancel F1\n"


def test_cancel_compensate_with_the_app_undoes_the_effect_with_the_apps_registry(project, db_url):
    # Given a run started in Python with the registry, waiting after booking a flight
    start_waiting(project, db_url, "t3")
    # When it is cancelled from the command line with --compensate and the app named
    done = agentsaga(project, "cancel", "t3", "--compensate", "--app", "app.py", "--db", db_url, "--json")
    # Then the flight is cancelled once and the run is cancelled
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "cancelled"
    assert ledger(project) == "cancel F1\n"
    events = history(project, db_url, "t3")
    assert [e["data"]["outcome"] for e in events if e["kind"] == "SagaCompleted"] == ["cancelled"]


#: The app of ``app.py`` whose compensation of the flight fails for good.
REFUSING = APP.replace('@undo.compensates("book_flight")',
                       '@undo.compensates("book_flight", policy=CompensationPolicy(permanent=(ValueError,)))').replace(
    '        ledger.write(f"cancel {effect.result[\'flight\']}\\n")\n',
    '        ledger.write(f"refused {effect.result[\'flight\']}\\n")\n    raise ValueError("the airline refuses")\n').replace(
    "from compensations import Compensations", "from compensations import CompensationPolicy, Compensations")


def test_cancel_compensate_whose_compensation_fails_exits_1_naming_it(project, db_url):
    # Given a run waiting after booking a flight, whose compensation the airline refuses
    (project / "app.py").write_text(REFUSING, encoding="utf-8")
    assert 'raise ValueError("the airline refuses")' in REFUSING and "permanent=(ValueError,)" in REFUSING
    start_waiting(project, db_url, "t3f")
    # When it is cancelled from the command line with --compensate
    done = agentsaga(project, "cancel", "t3f", "--compensate", "--app", "app.py", "--db", db_url)
    # Then the compensation was tried once and failed: the run is compensation_failed, and the
    # command says so and exits 1, as `compensate` does
    assert ledger(project) == "refused F1\n"
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "compensation_failed" in done.stderr and "the airline refuses" in done.stderr, done.stderr
    assert kinds(history(project, db_url, "t3f"), "CompensationFailed", "SagaCompleted") == ["CompensationFailed"]


def test_registries_of_two_app_modules_are_combined(project, db_url):
    # Given an app of two modules, each with a registry: app.py undoes book_flight, hotels.py book_hotel
    (project / "hotels.py").write_text(HOTELS, encoding="utf-8")
    # When a run of hotels.py's workflow books a flight and a hotel, then fails at payment
    done = agentsaga(project, "run", "stay", "--app", "app.py", "--app", "hotels.py", "--run-id", "t4",
                     "--db", db_url, "--json")
    # Then both effects are undone, newest first, each by its own module's registry
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["status"] == "compensated"
    assert ledger(project) == "cancel H2\ncancel F2\n"
    events = history(project, db_url, "t4")
    assert [e["data"]["step"] for e in events if e["kind"] == "CompensationCompleted"] == ["book_hotel", "book_flight"]


def test_run_given_a_workflow_as_code_uses_the_registry_of_its_module(project, db_url):
    # When `agentsaga run app.py:trip` books the flight and waits for approval
    waiting = agentsaga(project, "run", "app.py:trip", "--run-id", "t8", "--db", db_url)
    assert waiting.returncode == 4, waiting.stderr
    # Then the journal records the booking as compensable: app.py's registry undoes it
    [booked] = [e for e in history(project, db_url, "t8")
                if e["kind"] == "StepCompleted" and e["data"]["step"] == "book_flight"]
    assert booked["data"]["compensable"] is True
    # And when the approval is refused, it is undone
    done = agentsaga(project, "signal", "t8", "approval", "--data", '{"ok": false}', "--resume",
                     "--app", "app.py", "--db", db_url, "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["status"] == "compensated", done.stderr
    assert ledger(project) == "cancel F1\n"


def test_a_worker_given_the_app_undoes_effects_with_its_registry(project, db_url, tmp_path):
    # Given a run started in Python with the registry, refused while it waited (no process drives it)
    start_waiting(project, db_url, "t5")
    app = import_app(project / "app.py")
    with Orchestrator(db_url, workflows=[app.trip], compensations=app.undo) as orc:
        orc.signal("t5", "approval", {"ok": False})
    # When `agentsaga worker app.py` runs in the project directory
    log = tmp_path / "worker.log"
    exe = Path(sys.executable).parent / "agentsaga"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSAGA_") and k != "PYTHONPATH"}
    with log.open("w") as err:
        worker = subprocess.Popen([str(exe), "worker", "app.py", "--poll", "0.2", "--db", db_url], cwd=project,
                                  stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        with Orchestrator(db_url) as orc:
            end = time.monotonic() + HANG
            while time.monotonic() < end and worker.poll() is None and \
                    orc.get_run("t5").status in ("waiting", "running", "compensating"):
                time.sleep(0.1)
            status = orc.get_run("t5").status
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=HANG)
    # Then the worker drove the run to its failure and the app's registry cancelled the flight once
    assert status == "compensated", log.read_text()[-3000:]
    assert ledger(project) == "cancel F1\n"
    assert code == 0, log.read_text()[-3000:]


def test_two_registries_with_different_compensations_for_one_effect_are_a_clear_error(project, sqlite_url):
    # Given an app whose second module registers another compensation for the effect book_flight
    (project / "clash.py").write_text(CLASH, encoding="utf-8")
    # When a run of the app is started
    done = agentsaga(project, "run", "trip", "--app", "app.py", "--app", "clash.py", "--run-id", "t6",
                     "--db", sqlite_url)
    # Then it is one line on stderr naming the effect and both definitions, and exit 1
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("agentsaga: error: two compensations for 'book_flight': ")
    assert "'cancel_flight'" in line and "app.py:" in line
    assert "'refund_flight'" in line and "clash.py:" in line
    assert "app named by the command line" in line
    # And nothing ran: not even the database was created
    assert not (project / "ledger.txt").exists()
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()


def test_a_registry_imported_into_a_second_app_module_is_the_same_registry(project, db_url):
    # Given a second app module that imports app.py's registry and adds a compensation to it
    (project / "more.py").write_text("from app import undo\n\n\n@undo.compensates('book_car')\n"
                                     "def cancel_car(ctx, effect):\n    pass\n", encoding="utf-8")
    start_waiting(project, db_url, "t7")
    # When the run is refused and driven with both modules named
    done = agentsaga(project, "signal", "t7", "approval", "--data", '{"ok": false}', "--resume",
                     "--app", "app.py", "--app", "more.py", "--db", db_url, "--json")
    # Then that one registry (found twice) is no conflict, and it undoes the flight
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["status"] == "compensated"
    assert ledger(project) == "cancel F1\n"
