"""A run's graph identity does not depend on how or from where its app was loaded.

README: a run started by ``python agent.py`` is continued with ``agentsaga resume r1 --app
agent.py``. The file's functions are in ``__main__`` the first time and in a module named after
the file's absolute path the second (and after the project moved, another one), so nothing in the
fingerprint may carry that module name: a ``compensate=`` function of the app is recorded by its
qualified name. A different compensation is still a change, and a run journaled by an older
agentsaga (which recorded ``module.qualname``) still resumes. Real processes, SQLite and Postgres.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import raw_sql  # noqa: E402

from orchestrator import GraphChangedError, Orchestrator  # noqa: E402
from orchestrator.engine.graph_changes import graph_differences  # noqa: E402
from orchestrator.engine.loader import load_app  # noqa: E402
from workflows import END, Workflow  # noqa: E402

TRIP = '''
import os, signal, sys
from pathlib import Path

from orchestrator import Orchestrator
from workflows import Workflow

HERE = Path(__file__).resolve().parent
trip = Workflow("trip")


def note(what):
    with open(HERE / "ledger", "a") as fh:
        fh.write(what + "\\n")


def cancel(ctx, effect):
    note("cancel")


@trip.step(compensate=cancel)
def book(ctx, state):
    note("book")
    return {"booking": "b1"}


@trip.step
def pay(ctx, state):
    if not (HERE / "died").exists():  # the first process dies here, after book completed
        (HERE / "died").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    note("pay")
    return {"paid": True}


if __name__ == "__main__":
    Orchestrator(sys.argv[1], workflows=[trip]).run(trip, {}, run_id="t1")
'''


def agentsaga(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The installed console script, run from ``cwd`` as a user would."""
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSAGA_DB", "AGENTSAGA_APP", "PYTHONPATH")}
    return subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "trip.py").write_text(TRIP, encoding="utf-8")
    return tmp_path / "proj"


def ledger(project: Path) -> list[str]:
    return (project / "ledger").read_text().split()


# -- real processes: start one way, resume another ---------------------------------------------------
def test_a_run_started_by_python_file_resumes_with_app_file(project, db_url):
    # Given a run of a workflow with a compensate= step, started by `python trip.py`, killed midway
    killed = subprocess.run([sys.executable, "trip.py", db_url], cwd=project, capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert ledger(project) == ["book"]
    # When it is resumed with `agentsaga resume t1 --app trip.py`
    done = agentsaga("resume", "t1", "--app", "trip.py", "--db", db_url, "--json", cwd=project)
    # Then it is not refused as a changed graph: it completes, its effect not run again
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    assert ledger(project) == ["book", "pay"]


def test_a_run_resumes_after_its_project_directory_moved(project, db_url):
    # Given a run started with `agentsaga run --app trip.py`, killed midway
    killed = agentsaga("run", "trip", "--app", "trip.py", "--run-id", "t1", "--db", db_url, cwd=project)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # When the project directory is moved and the run resumed from its new place
    moved = project.rename(project.with_name("moved"))
    done = agentsaga("resume", "t1", "--app", "trip.py", "--db", db_url, "--json", cwd=moved)
    # Then it completes there
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    assert ledger(moved) == ["book", "pay"]


# -- the identity itself -------------------------------------------------------------------------------
def test_one_file_loaded_as_main_and_as_an_app_file_has_one_fingerprint(project):
    # Given the same file (without its `if __name__ == "__main__"` part) run as a script, its module
    # __main__, and loaded as an app file
    (project / "flows.py").write_text(TRIP.split("if __name__")[0], encoding="utf-8")
    as_script = runpy.run_path(str(project / "flows.py"), run_name="__main__")["trip"]
    [as_app] = load_app(str(project / "flows.py"))
    assert as_script.steps["book"].compensate.__module__ != as_app.steps["book"].compensate.__module__
    # Then their graphs are the same, the compensation named without the module
    assert as_script.fingerprint == as_app.fingerprint
    assert as_app.describe()["steps"][0] == {"name": "book", "effect": True, "compensate": "cancel"}


def saga(compensate) -> Workflow:
    wf = Workflow("saga")
    wf.step(name="book", compensate=compensate)(lambda ctx, s: {"booked": True})
    wf.step(name="pay")(lambda ctx, s: {"paid": True})
    wf.sequence("book", "pay", END)
    return wf


def elsewhere(module: str):
    """A compensation that lives in ``module``, as one imported from there would."""
    def cancel(ctx, effect):
        return None
    cancel.__module__ = module
    cancel.__qualname__ = "cancel"
    return cancel


def test_a_compensation_of_another_module_keeps_its_module_and_another_one_is_a_change():
    # Given two workflows whose step is undone by `cancel` of two different modules
    flights, hotels = saga(elsewhere("flights")), saga(elsewhere("hotels"))
    # Then each names its compensation with its module, and they are different graphs
    assert flights.describe()["steps"][0]["compensate"] == "flights:cancel"
    assert flights.fingerprint != hotels.fingerprint
    assert graph_differences(flights.describe(), hotels.describe()) == [
        "step 'book' changed: {'name': 'book', 'effect': True, 'compensate': 'flights:cancel'} -> "
        "{'name': 'book', 'effect': True, 'compensate': 'hotels:cancel'}"]


def test_a_step_from_a_library_undone_by_a_function_of_the_workflows_module():
    # Given a step whose function comes from another module (a library), undone by a compensation
    # defined next to the workflow (this module)
    def cancel(ctx, effect):
        return None
    library_step = elsewhere("lib.steps")
    wf = Workflow("lib")
    wf.step(name="book", compensate=cancel)(library_step)
    # Then the compensation is named without the module the workflow happened to be loaded as
    assert wf.describe()["steps"][0]["compensate"] == "test_a_step_from_a_library_undone_by_a_function_of_the_" \
        "workflows_module.<locals>.cancel"


def old_description(wf: Workflow, compensate: str) -> dict:
    """``wf.describe()`` as an older agentsaga recorded it: the compensation as ``module.qualname``."""
    graph = wf.describe()
    graph["steps"] = [{**s, "compensate": compensate} if s["name"] == "book" else s for s in graph["steps"]]
    return graph


@pytest.mark.parametrize("recorded", [
    "__main__.cancel",
    "agentsaga_target__home_ann_proj_trip_py.cancel",
    "mypkg.agents.cancel",
])
def test_an_older_record_of_the_apps_own_compensation_is_no_difference(recorded):
    wf = saga(elsewhere(__name__))  # a compensation of the workflow's own module (this one)
    assert graph_differences(old_description(wf, recorded), wf.describe()) == []


@pytest.mark.parametrize("recorded, now, same", [
    ("flights.cancel", "flights", True),      # the same function of another module
    ("hotels.cancel", "flights", False),      # another module's function of that name
    ("__main__.refund", __name__, False),     # another function
    ("hotels:cancel", "flights", False),      # today's form is compared as it is
])
def test_an_older_record_names_the_same_compensation_only_when_it_does(recorded, now, same):
    wf = saga(elsewhere(now))
    assert (graph_differences(old_description(wf, recorded), wf.describe()) == []) is same


def test_a_run_journaled_with_an_older_description_still_resumes(orc_factory, db_url):
    # Given a run interrupted after its effect, journaled by an older agentsaga: its RunStarted
    # graph names the compensation '__main__.cancel' and its row has that graph's fingerprint
    wf = interruptible(stop=True)
    orc = orc_factory(wf)
    with pytest.raises(KeyboardInterrupt):
        orc.run(wf, {}, run_id="old")
    graph = old_description(wf, "__main__.cancel")
    record_as_older_agentsaga(db_url, "old", graph)
    assert orc.get_run("old").fingerprint != wf.fingerprint
    # When the same workflow resumes it
    result = orc_factory(interruptible(stop=False)).resume("old")
    # Then it is not refused: it completes
    assert result.status == "completed" and result.state["paid"] is True


def test_a_run_journaled_with_another_compensation_is_still_refused(orc_factory, db_url):
    # Given the same kind of older run, whose compensation was another function
    wf = interruptible(stop=True)
    orc = orc_factory(wf)
    with pytest.raises(KeyboardInterrupt):
        orc.run(wf, {}, run_id="other")
    record_as_older_agentsaga(db_url, "other", old_description(wf, "__main__.refund"))
    # When it is resumed, then the change is named
    with pytest.raises(GraphChangedError, match=r"step 'book' changed: .*'__main__\.refund'.*'cancel'"):
        orc_factory(interruptible(stop=False)).resume("other")


def cancel(ctx, effect):
    return None


def interruptible(*, stop: bool) -> Workflow:
    """book (an effect undone by `cancel`, of this module), then pay, which stops the process
    (KeyboardInterrupt) when ``stop``."""
    wf = Workflow("trip")

    @wf.step(compensate=cancel)
    def book(ctx, state):
        return {"booked": True}

    @wf.step
    def pay(ctx, state):
        if stop:
            raise KeyboardInterrupt
        return {"paid": True}

    return wf


def record_as_older_agentsaga(db_url: str, run_id: str, graph: dict) -> None:
    """Rewrite a run's RunStarted graph and the row's fingerprint to what an older agentsaga wrote."""
    [(pk, data)] = raw_sql(db_url, "SELECT r.pk, e.data FROM agentsaga_runs r JOIN agentsaga_events e "
                                   "ON e.run_pk = r.pk AND e.seq = 1 WHERE r.run_id = ?", (run_id,))
    started = {**json.loads(data), "graph": graph}
    fingerprint = hashlib.sha256(json.dumps(graph, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    started["fingerprint"] = fingerprint
    raw_sql(db_url, "UPDATE agentsaga_events SET data = ? WHERE run_pk = ? AND seq = 1", (json.dumps(started), pk))
    raw_sql(db_url, "UPDATE agentsaga_runs SET fingerprint = ? WHERE pk = ?", (fingerprint, pk))
