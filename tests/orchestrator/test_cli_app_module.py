"""An app named by module (``--app mypkg.agents``, ``AGENTSAGA_APP``, ``agentsaga worker
mypkg.agents``) is found in the working directory, as ``python -m`` would find it.

Run with the installed ``agentsaga`` console script, from a project directory holding the package
and without PYTHONPATH: ``python -m orchestrator.cli`` puts the working directory on ``sys.path``
by itself, the console script does not, and that difference is what these tests are about. Which
directory is searched is always the person's choice (where they run the command), never one a run
names (invariant 11).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import assert_one_line_error  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402

HANG = 120.0

AGENTS = '''
import os, signal
from pathlib import Path

from workflows import Workflow

PROJECT = Path(__file__).resolve().parent.parent
hello = Workflow("hello")


@hello.step
def greet(ctx, state):
    return {"greeting": "hello " + state.get("who", "world"), "by": PROJECT.name}


@hello.step
def finish(ctx, state):
    if state.get("die") and not (PROJECT / "died").exists():  # the first process dies here
        (PROJECT / "died").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"done": True, "finished_by": PROJECT.name}
'''


def console_script() -> str:
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would name the app or the path for us."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSAGA_DB", "AGENTSAGA_APP", "PYTHONPATH")}
    return {**env, **extra}


def agentsaga(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], cwd=cwd, capture_output=True, text=True, env=clean_env(**env),
                          timeout=HANG)


def make_project(where: Path) -> Path:
    """A directory holding the package ``mypkg`` whose ``mypkg.agents`` defines workflow 'hello'."""
    (where / "mypkg").mkdir(parents=True)
    (where / "mypkg" / "__init__.py").write_text("", encoding="utf-8")
    (where / "mypkg" / "agents.py").write_text(AGENTS, encoding="utf-8")
    return where


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def test_run_and_resume_with_app_module_in_the_working_directory(project, sqlite_url):
    # Given a run started with `agentsaga run hello --app mypkg.agents`, killed in its second step
    killed = agentsaga("run", "hello", "--app", "mypkg.agents", "--input", '{"die": true}', "--run-id", "h1",
                       "--db", sqlite_url, cwd=project)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # When it is resumed with `agentsaga resume h1 --app mypkg.agents` from the same directory
    done = agentsaga("resume", "h1", "--app", "mypkg.agents", "--db", sqlite_url, "--json", cwd=project)
    # Then the package is found there and the run completes
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"]["done"] is True


def test_agentsaga_app_names_a_module_in_the_working_directory(project, sqlite_url):
    # Given AGENTSAGA_APP=mypkg.agents and no --app
    # When a run of its workflow is started by name, killed, and resumed
    killed = agentsaga("run", "hello", "--input", '{"die": true}', "--run-id", "h2", "--db", sqlite_url, cwd=project,
                       AGENTSAGA_APP="mypkg.agents")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    done = agentsaga("resume", "h2", "--db", sqlite_url, "--json", cwd=project, AGENTSAGA_APP="mypkg.agents")
    # Then both found the package in the working directory
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"


def test_worker_drives_an_app_module_in_the_working_directory(project, sqlite_url, tmp_path):
    # Given a run enqueued with `agentsaga enqueue hello --app mypkg.agents`
    queued = agentsaga("enqueue", "hello", "--app", "mypkg.agents", "--input", '{"who": "ann"}', "--run-id", "w1",
                       "--db", sqlite_url, cwd=project)
    assert queued.returncode == 0, queued.stderr
    # When `agentsaga worker mypkg.agents` runs in the project directory
    log = tmp_path / "worker.log"
    with log.open("w") as err:
        worker = subprocess.Popen([console_script(), "worker", "mypkg.agents", "--poll", "0.2", "--db", sqlite_url],
                                  cwd=project, stdout=subprocess.DEVNULL, stderr=err, env=clean_env())
    try:
        with Orchestrator(sqlite_url) as orc:
            status = wait_for_status(orc, "w1", worker)
            state = orc.result("w1").state
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=HANG)
    # Then it imported the package from there, drove the run to the end, and stopped cleanly
    assert status == "completed", log.read_text()[-3000:]
    assert state["greeting"] == "hello ann"
    assert code == 0, log.read_text()[-3000:]


def wait_for_status(orc: Orchestrator, run_id: str, worker: subprocess.Popen) -> str:
    end = time.monotonic() + HANG
    while time.monotonic() < end and worker.poll() is None:
        status = orc.get_run(run_id).status
        if status not in ("pending", "running"):
            return status
        time.sleep(0.1)
    return orc.get_run(run_id).status


def test_the_directory_the_command_runs_in_decides_not_the_run(project, sqlite_url, tmp_path):
    # Given a run started from one project, killed midway (its row and journal name no directory)
    killed = agentsaga("run", "hello", "--app", "mypkg.agents", "--input", '{"die": true}', "--run-id", "h3",
                       "--db", sqlite_url, cwd=project)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # When it is resumed from a directory without the package
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    missing = agentsaga("resume", "h3", "--app", "mypkg.agents", "--db", sqlite_url, cwd=elsewhere)
    # Then it is a one-line error naming the module and the directory it was looked for in; the run
    # is left as it was
    assert_one_line_error(missing, "cannot import app 'mypkg.agents'", "No module named 'mypkg'",
                          f"looked in {str(elsewhere)!r}, the working directory", "(app named by the command line)")
    with Orchestrator(sqlite_url) as orc:
        assert orc.get_run("h3").status == "running"
    # And from another copy of the project, that copy's code drives it
    other = make_project(tmp_path / "copy")
    (other / "died").touch()
    done = agentsaga("resume", "h3", "--app", "mypkg.agents", "--db", sqlite_url, "--json", cwd=other)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"]["finished_by"] == "copy"


def test_a_worker_whose_app_module_is_missing_says_where_it_looked(tmp_path, sqlite_url):
    done = agentsaga("worker", "nopkg.flows", "--db", sqlite_url, cwd=tmp_path)
    assert_one_line_error(done, "cannot import app 'nopkg.flows'", "No module named 'nopkg'", str(tmp_path))


def test_a_missing_import_inside_the_app_names_that_module(project, sqlite_url):
    # Given an app module that imports a module nobody installed
    (project / "mypkg" / "broken.py").write_text("import no_such_dependency\n", encoding="utf-8")
    # When it is named with --app
    done = agentsaga("run", "hello", "--app", "mypkg.broken", "--db", sqlite_url, cwd=project)
    # Then the error names the missing dependency, not the app, as not found
    assert_one_line_error(done, "cannot import app 'mypkg.broken'", "No module named 'no_such_dependency'")
    assert "looked in" not in done.stderr
