"""The agentsaga console script, run as a real subprocess on SQLite and Postgres."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
FLOW = "tests/orchestrator/crashflow.py:wf"
APP = "tests/orchestrator/crashflow.py"
CHILD = ROOT / "tests/orchestrator/crashflow.py"


def agentsaga_exe() -> str:
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    return found


def cli(*args: str, ledger: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, CRASHFLOW_LEDGER=str(ledger))
    full_env.pop("AGENTSAGA_DB", None)
    full_env.update(env or {})
    return subprocess.run([agentsaga_exe(), *args], cwd=ROOT, capture_output=True, text=True, env=full_env,
                          timeout=120)


@pytest.fixture
def ledger(tmp_path):
    return tmp_path / "ledger"


def test_run_then_runs_lists_it(db_url, ledger):
    # Given a workflow run from the command line
    done = cli("run", FLOW, "--input", '{"round": 0}', "--run-id", "cli-1", "--db", db_url, "--json", ledger=ledger)
    # Then it prints the result as JSON and exits 0
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed" and result["state"]["round"] == 3
    # And `runs` lists it, as a table and as JSON lines
    table = cli("runs", "--db", db_url, ledger=ledger)
    assert table.returncode == 0 and "cli-1" in table.stdout and "completed" in table.stdout
    assert table.stdout.splitlines()[0].split()[:4] == ["RUN", "WORKFLOW", "VER", "STATUS"]
    lines = cli("runs", "--db", db_url, "--json", "--status", "completed", ledger=ledger).stdout.splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == ["cli-1"]
    assert cli("runs", "--db", db_url, "--status", "failed", ledger=ledger).stdout.strip() == "no runs"


def test_resume_by_id_after_sigkill_with_the_app_named(db_url, ledger):
    # Given a run killed with SIGKILL between two steps
    killed = subprocess.run([sys.executable, str(CHILD), db_url, "cli-2", str(ledger), "after:merge:1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    # When `agentsaga resume RUN` is run with the app that defines its workflow
    done = cli("resume", "cli-2", "--app", APP, "--db", db_url, ledger=ledger)
    # Then it completes, and the summary says so
    assert done.returncode == 0, done.stderr
    assert "status completed" in done.stdout


def test_recover_finds_never_driven_runs(db_url, ledger):
    from orchestrator import Orchestrator
    from orchestrator.engine.loader import load_target

    wf = load_target(str(ROOT / FLOW))
    with Orchestrator(db_url, workflows=[wf]) as orc:
        run_id = orc.start(wf, {"round": 0})
    done = cli("recover", "--app", APP, "--db", db_url, ledger=ledger)
    assert done.returncode == 0, done.stderr
    assert run_id in done.stdout and "completed" in done.stdout
    assert cli("recover", "--app", APP, "--db", db_url, ledger=ledger).stdout.strip() == "no interrupted runs to recover"


def test_unknown_run_is_a_one_line_error(db_url, ledger):
    from orchestrator import Orchestrator

    Orchestrator(db_url).close()  # the database exists (a missing one is its own error, naming the file)
    done = cli("resume", "nope", "--db", db_url, ledger=ledger)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "nope" in done.stderr and "Traceback" not in done.stderr
    debug = cli("resume", "nope", "--db", db_url, "--debug", ledger=ledger)
    assert "Traceback" in debug.stderr


@pytest.mark.parametrize("args, message", [
    (["run", FLOW, "--input", "{not json"], "--input is not valid JSON"),
    (["run", "no_such_module:wf", "--input", "{}"], "cannot import workflow target 'no_such_module:wf'"),
    (["runs", "--since", "yesterday"], "invalid time 'yesterday'"),
])
def test_bad_input_is_a_clear_error(sqlite_url, ledger, args, message):
    done = cli(*args, "--db", sqlite_url, ledger=ledger)
    assert done.returncode in (1, 2)
    assert message in done.stderr and "Traceback" not in done.stderr


def test_malformed_database_url_fails_before_any_work(tmp_path, ledger):
    done = cli("runs", "--db", "mysql://u:hunter2@host/db", ledger=ledger)
    assert done.returncode == 1
    assert "mysql" in done.stderr and "hunter2" not in done.stderr


def test_default_database_is_agentsaga_db_env(tmp_path, ledger):
    url = f"sqlite:///{tmp_path}/from-env.db"
    done = cli("run", FLOW, "--input", '{"round": 0}', ledger=ledger, env={"AGENTSAGA_DB": url})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "from-env.db").exists()


@pytest.mark.parametrize("before_verb", [True, False])
def test_db_is_honoured_before_and_after_the_verb(tmp_path, ledger, before_verb):
    # Given a run written with --db before (or after) the verb, from a directory of its own
    url = f"sqlite:///{tmp_path}/chosen.db"
    place = (lambda *a: ["--db", url, *a]) if before_verb else (lambda *a: [*a, "--db", url])
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([agentsaga_exe(), *place("run", str(ROOT / FLOW), "--input", '{"round": 0}',
                                                    "--run-id", "db-1")],
                          cwd=work, capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "AGENTSAGA_DB"},
                               "CRASHFLOW_LEDGER": str(ledger)})
    # Then the run is in the chosen database and no ./agentsaga.db was written
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "chosen.db").exists() and not (work / "agentsaga.db").exists()
    listed = subprocess.run([agentsaga_exe(), *place("runs", "--json")], cwd=work, capture_output=True, text=True,
                            timeout=120)
    assert [json.loads(line)["run_id"] for line in listed.stdout.splitlines()] == ["db-1"]
