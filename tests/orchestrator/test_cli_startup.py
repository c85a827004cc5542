"""Start-up: ``agentsaga --help`` / ``--version`` and ``import orchestrator`` do not load the engine's
heavy dependencies (SQLAlchemy, SQLModel, pydantic); checked in fresh interpreters, via sys.modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sqlalchemy", "sqlmodel", "pydantic")
HANG = 120.0  # seconds a fresh interpreter may take on a loaded machine


def fresh(code: str, watched: tuple[str, ...] = HEAVY, columns: int = 80) -> dict:
    """Run ``code`` in a new interpreter; its output, and which of the ``watched`` modules it loaded
    (``heavy``)."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    env = {**os.environ, "COLUMNS": str(columns)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=HANG, check=False)
    assert proc.returncode == 0, proc.stderr
    *out, heavy = proc.stdout.rstrip("\n").split("\n")
    return {"out": "\n".join(out), "heavy": json.loads(heavy)}


def test_help_is_the_parsers_help_and_loads_no_heavy_dependency():
    # When `agentsaga --help` runs through the console script's entry point
    res = fresh("from orchestrator.cli import main\nmain(['--help'])")
    # Then it loaded none of the heavy dependencies
    assert res["heavy"] == []
    # And printed exactly what the full parser formats (at 80 columns)
    env_columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        from orchestrator.cli.commands import build_parser

        expected = build_parser().format_help()
    finally:
        if env_columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = env_columns
    assert res["out"] + "\n" == expected, (
        "orchestrator/cli/_help.txt is stale: regenerate it with COLUMNS=80 python -c \"from orchestrator.cli.commands "
        "import build_parser; open('orchestrator/cli/_help.txt', 'w').write(build_parser().format_help())\"")


def test_version_prints_the_package_version_without_heavy_dependencies():
    # When `agentsaga --version` runs
    res = fresh("from orchestrator.cli import main\nmain(['--version'])")
    # Then it prints the installed version and loaded nothing heavy
    assert res["out"] == f"agentsaga {metadata.version('agentsaga')}"
    assert res["heavy"] == []


def test_version_after_global_options_goes_through_the_full_parser():
    # When --version comes after another option, the real parser answers it (argparse exits 0)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--db", "sqlite:///unused.db", "--version"],
                          capture_output=True, text=True, cwd=ROOT, timeout=HANG, check=False)
    # Then the answer is the same
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"agentsaga {metadata.version('agentsaga')}"


def test_import_orchestrator_is_light_and_its_names_load_on_use():
    # When orchestrator is imported
    light = fresh("import orchestrator, store\nprint(sorted(set(orchestrator.__all__) - set(dir(orchestrator))))")
    # Then nothing heavy was loaded, yet every exported name is listed
    assert light["heavy"] == [] and light["out"] == "[]"
    # And using the facade loads it
    used = fresh("import orchestrator\nprint(orchestrator.Orchestrator.__module__, orchestrator.RunResult.__name__)")
    assert used["out"] == "orchestrator._orchestrator RunResult"
    assert "sqlalchemy" in used["heavy"]


def test_an_unknown_name_is_still_an_attribute_error():
    res = fresh("import orchestrator, store\nfor m in (orchestrator, store):\n"
                "    try:\n        m.nope\n    except AttributeError as e:\n        print(e)")
    assert res["out"] == ("module 'orchestrator' has no attribute 'nope'\nmodule 'store' has no attribute 'nope'")


def test_the_entry_point_stays_a_function_after_the_commands_module_is_imported():
    # Given the module with the verbs imported first (as any test or tool that builds the parser does)
    res = fresh("import orchestrator.cli.commands\nfrom orchestrator.cli import main\nprint(callable(main))")
    # Then the package's main is still the entry function
    assert res["out"].strip() == "True"


#: what a read verb has no use for: the engine that drives runs, HTTP, HTML templates, the ORM
DRIVING = ("orchestrator.engine.core", "orchestrator.engine.driver", "orchestrator.engine.steps",
           "orchestrator.engine.groupcommit", "orchestrator.engine.journal", "orchestrator.scale.worker",
           "httpx", "jinja2", "sqlmodel", "pydantic")


def test_read_verbs_load_only_what_reading_uses(tmp_path):
    # Given a database holding one completed run
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    made = fresh(f"""
from orchestrator import Orchestrator
from workflows import END, Workflow
wf = Workflow("w")
@wf.step(start=True)
def a(ctx, state):
    return {{"ok": 1}}
wf.edge("a", END)
with Orchestrator({db!r}, workflows=[wf]) as orc:
    print(orc.run(wf, {{}}, run_id="r1").status)""", DRIVING)
    assert made["out"] == "completed"
    # Then driving it loaded the engine
    assert "orchestrator.engine.core" in made["heavy"]
    # When the read verbs list it, show its history, summarise and verify it, and count runs
    expected = {"runs": "r1", "history": "StepCompleted  a", "show": "run r1  completed", "verify": "run r1: OK",
                "stats": "completed  1"}
    for argv in (["runs"], ["history", "r1"], ["show", "r1"], ["verify", "r1"], ["stats"]):
        res = fresh(f"from orchestrator.cli import main\nmain(['--db', {db!r}, *{argv!r}])", DRIVING, columns=200)
        # Then each answered about the run without loading the engine, HTTP, templates or the ORM
        assert expected[argv[0]] in res["out"], (argv, res["out"])
        assert res["heavy"] == [], (argv, res["heavy"])


def test_the_worker_verb_is_recognised_before_the_parser_is_built():
    # Given command lines as a user types them (the worker's start-up signal handling hangs on this)
    from orchestrator.cli import verb_of

    # Then the verb is the first word that is not an option, skipping --db's URL
    assert verb_of(["worker", "flows.py"]) == "worker"
    assert verb_of(["--db", "sqlite:///w.db", "--debug", "worker", "flows.py"]) == "worker"
    assert verb_of(["--db=sqlite:///w.db", "worker"]) == "worker"
    assert verb_of(["--db", "worker", "run", "flows.py"]) == "run"  # a database file named "worker"
    assert verb_of(["run", "worker"]) == "run"  # a workflow named "worker"
    assert verb_of(["--debug"]) is None
