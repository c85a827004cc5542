"""When a live process holds a run's lease, the command line's hint works as printed.

The engine's message (``LeaseHeldError``) names the library's ``orc.resume(ID)`` and a bare
``agentsaga resume ID``, which from a shell would find no app and, with ``--db``, the wrong
database. The command line says the same (who drives the run, until when) with commands built by
``follow_up``: this invocation's ``--app`` (or the workflow file ``run`` was given) and its ``--db``.
An explicit ``resume`` takes the lease over at once, fencing a live owner out (DESIGN.md "Life of
a run", step 5), so the hint is met where a run id another process holds is driven without taking
it over: ``agentsaga run ... --run-id ID``. Real console script, on SQLite and Postgres.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target

pytestmark = pytest.mark.slow

FLOWS = '''\
from workflows import END, Workflow

held = Workflow("held")


@held.step(start=True)
def only(ctx, state):
    return {"ok": True}


held.edge("only", END)
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    return tmp_path


def agentsaga(project: Path, *args: str) -> subprocess.CompletedProcess:
    """The console script, run in the project directory as a person would run it."""
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSAGA_")}
    return subprocess.run([found, *args], cwd=project, capture_output=True, text=True, env=env, timeout=120)


def held_by_a_live_process(project: Path, db_url: str, run_id: str) -> str:
    """A pending run of flows.py's workflow, leased for 300 s by this (live) test process; its owner."""
    owner = f"{socket.gethostname()}:{os.getpid()}:holder"
    wf = load_target(f"{project / 'flows.py'}:held")
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.start(wf, {}, run_id=run_id)
        orc.store.leases.acquire(run_id, owner=owner, ttl=300, now=orc.engine.config.clock())
    return owner


def hint(text: str, after: str, until: str) -> list[str]:
    """The command printed between ``after`` and ``until``, split as a shell would split it."""
    command = text.split(after, 1)[1].split(until, 1)[0]
    words = shlex.split(command)
    assert words[0] == "agentsaga", text
    return words[1:]


@pytest.mark.parametrize("how", [["held", "--app", "flows.py"], ["flows.py:held"]], ids=["app", "file"])
def test_a_run_held_by_a_live_process_prints_hints_with_the_app_and_db_that_work_as_printed(project, db_url, how):
    # Given a run whose lease a live process holds
    owner = held_by_a_live_process(project, db_url, "h1")
    # When the program is run again with the same run id, naming its app (or its workflow file) and --db
    again = agentsaga(project, "run", *how, "--run-id", "h1", "--db", db_url)
    # Then it is refused in one line (exit 1) that names the owner and until when
    assert again.returncode == 1, again.stdout + again.stderr
    [line] = again.stderr.splitlines()
    assert line.startswith(f"agentsaga: error: run 'h1' is being driven by '{owner}' until ") and " UTC (in " in line
    # And its hints name the same app and database, not the library call
    app = how[2] if len(how) == 3 else how[0]
    resume = hint(line, "take the run over now with: ", " (otherwise")
    assert resume == ["resume", "h1", "--app", app, "--db", db_url]
    assert hint(line, "a worker, or ", ", continues it") == ["recover", "--app", app, "--db", db_url]
    assert "orc.resume" not in line
    # And the resume command, run exactly as printed, takes the run over and drives it to its end
    taken = agentsaga(project, *resume)
    assert taken.returncode == 0, taken.stderr
    assert "run h1" in taken.stdout and "status completed" in taken.stdout
