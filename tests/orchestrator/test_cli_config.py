"""The command line's global options and project config: where the database is, which code is the app.

Run as a user would: the console script in a subprocess, from a project directory of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.cli.commands import build_parser

FLOW = '''
from workflows import END, Workflow, reducers

greet = Workflow("greet", reducers={"log": reducers.append})


@greet.step(start=True)
def hello(ctx, state):
    return {"log": "hello " + state.get("who", "world")}


greet.edge("hello", END)
'''


def agentsaga(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("AGENTSAGA_DB", "AGENTSAGA_APP")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=full, timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project: agents/flows.py holds the app, and a sub-directory to work from."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "agents" / "flows.py").write_text(FLOW, encoding="utf-8")
    (tmp_path / "work" / "deep").mkdir(parents=True)
    return tmp_path


# -- --db before or after the verb -------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--db", "sqlite:///x.db", "runs"],
    ["runs", "--db", "sqlite:///x.db"],
    ["--debug", "--db", "sqlite:///x.db", "show", "r1"],
    ["show", "r1", "--db", "sqlite:///x.db", "--debug"],
])
def test_global_options_count_before_and_after_the_verb(argv):
    args = build_parser().parse_args(argv)
    assert args.db == "sqlite:///x.db"
    assert args.debug is ("--debug" in argv)


def test_db_before_the_verb_is_the_database_used(project, db_url):
    # Given a run written to the database at db_url, from a directory without agentsaga.db
    work = project / "work"
    done = agentsaga("--db", db_url, "run", "greet", "--app", "../agents/flows.py", "--run-id", "g1", cwd=work)
    assert done.returncode == 0, done.stderr
    # When the runs are listed with --db before the verb
    listed = agentsaga("--db", db_url, "runs", "--json", cwd=work)
    # Then they are the runs of that database, and no ./agentsaga.db appeared anywhere
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["run_id"] for line in listed.stdout.splitlines()] == ["g1"]
    assert not (work / "agentsaga.db").exists()


def test_a_reading_verb_on_a_missing_sqlite_file_says_so_and_creates_nothing(tmp_path):
    done = agentsaga("runs", cwd=tmp_path)
    assert done.returncode == 1
    assert "no database at 'agentsaga.db'" in done.stderr and "--db" in done.stderr
    assert not (tmp_path / "agentsaga.db").exists()


# -- the app: config file, environment, command line ------------------------------------------------
def test_agentsaga_toml_found_from_a_subdirectory_resolves_modules_next_to_it(project, sqlite_url):
    # Given agentsaga.toml at the project root naming the app by module
    (project / "agentsaga.toml").write_text('app = "agents.flows"\n', encoding="utf-8")
    # When a run of its workflow is started, and resumed, from two levels down, by name only
    done = agentsaga("run", "greet", "--input", '{"who": "ann"}', "--run-id", "g1", "--db", sqlite_url, "--json",
                     cwd=project / "work" / "deep")
    # Then the workflow is the app's
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"]["log"] == ["hello ann"]
    resumed = agentsaga("resume", "g1", "--db", sqlite_url, cwd=project / "work" / "deep")
    assert resumed.returncode == 0 and "status completed" in resumed.stdout, resumed.stderr


def test_pyproject_tool_table_and_relative_file_paths(project, sqlite_url):
    # Given pyproject.toml with [tool.agentsaga] naming the app as a file relative to it
    (project / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.agentsaga]\napp = ["agents/flows.py"]\n',
                                            encoding="utf-8")
    # When a run is started by workflow name and resumed, from a sub-directory
    started = agentsaga("run", "greet", "--run-id", "g2", "--db", sqlite_url, cwd=project / "work")
    resumed = agentsaga("resume", "g2", "--db", sqlite_url, cwd=project / "work" / "deep")
    # Then the app is found through pyproject.toml, its path resolved next to it
    assert started.returncode == 0, started.stderr
    assert resumed.returncode == 0 and "status completed" in resumed.stdout, resumed.stderr


def test_the_command_line_beats_the_environment_which_beats_the_config(project, sqlite_url, tmp_path):
    (project / "agentsaga.toml").write_text('app = "no_such_module_in_config"\n', encoding="utf-8")
    # The config alone: its module is tried (and its error names where it came from)
    done = agentsaga("run", "greet", "--db", sqlite_url, cwd=project)
    assert done.returncode == 1 and "no_such_module_in_config" in done.stderr and "agentsaga.toml" in done.stderr
    # AGENTSAGA_APP wins over the config
    env_app = {"AGENTSAGA_APP": "agents.flows", "PYTHONPATH": str(project)}
    done = agentsaga("run", "greet", "--run-id", "g3", "--db", sqlite_url, cwd=project, env=env_app)
    assert done.returncode == 0, done.stderr
    # --app wins over both
    done = agentsaga("run", "greet", "--run-id", "g4", "--db", sqlite_url, "--app", "agents/flows.py", cwd=project,
                     env={"AGENTSAGA_APP": "no_such_module_in_env"})
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("text, needle", [
    ('app = 3\n', "app must be a string or a list of non-empty strings"),
    ('ap = "agents.flows"\n', "unknown key(s) 'ap'"),
    ('[redact]\nfield = ["ssn"]\n', "unknown key(s) 'field' in redact"),
    ('[redact]\npatterns = ["(unclosed"]\n', "not a valid regex"),
    ('app = "agents.flows\n', "not valid TOML"),
])
def test_a_bad_config_is_a_one_line_error_naming_the_file(project, sqlite_url, text, needle):
    (project / "agentsaga.toml").write_text(text, encoding="utf-8")
    done = agentsaga("signal", "r1", "go", "--db", sqlite_url, cwd=project / "work")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert needle in line and "agentsaga.toml" in line and "Traceback" not in line


def test_run_by_name_without_an_app_says_how_to_name_it(project, sqlite_url):
    done = agentsaga("run", "greet", "--db", sqlite_url, cwd=project)
    assert done.returncode == 2
    assert "no workflow named 'greet'" in done.stderr and "module:attr" in done.stderr


def test_a_worker_without_any_app_refuses_to_start(project, sqlite_url):
    done = agentsaga("worker", "--db", sqlite_url, cwd=project)
    assert done.returncode == 2
    assert "a worker needs the workflows it may drive" in done.stderr


def test_config_redaction_applies_to_what_the_cli_writes(project, sqlite_url):
    # Given a project that declares its own secret field and pattern
    (project / "agentsaga.toml").write_text('app = "agents.flows"\n[redact]\nfields = ["ssn"]\n'
                                            'patterns = ["ACME-[0-9]{6}"]\n', encoding="utf-8")
    # When a run starts with them in its input, and a signal carries them
    done = agentsaga("run", "greet", "--input", '{"who": "ACME-123456", "ssn": "078-05-1120"}', "--run-id", "g5",
                     "--db", sqlite_url, cwd=project)
    assert done.returncode == 0, done.stderr
    # Then neither reached the database file
    raw = b"".join(p.read_bytes() for p in Path(sqlite_url[len("sqlite:///"):]).parent.glob("agentsaga.db*"))
    assert b"ACME-123456" not in raw and b"078-05-1120" not in raw


def test_recover_without_any_app_takes_no_lease(project, sqlite_url):
    # Given a pending run nobody drives
    from orchestrator.engine.loader import load_app

    [greet] = load_app(str(project / "agents" / "flows.py"))
    with Orchestrator(sqlite_url, workflows=[greet]) as orc:
        orc.start(greet, {}, run_id="p1")
        before = orc.get_run("p1")
    # When recover runs with no app named anywhere
    done = agentsaga("recover", "--db", sqlite_url, cwd=project)
    # Then it says what it needs, and the run's lease and counters are as they were
    assert done.returncode == 2 and "recover needs the workflows it may drive" in done.stderr
    with Orchestrator(sqlite_url) as orc:
        assert orc.get_run("p1") == before


@pytest.mark.parametrize("spec, parts", [
    ("a:b", ("a", "b")), ("pkg.mod:wf", ("pkg.mod", "wf")), ("flows.py", ("flows.py", None)),
    ("C:\\work\\flows.py", ("C:\\work\\flows.py", None)), ("C:\\work\\flows.py:wf", ("C:\\work\\flows.py", "wf")),
    ("research", ("research", None)),
])
def test_app_and_target_specs(spec, parts):
    from orchestrator.engine.loader import split_spec

    assert split_spec(spec) == parts
