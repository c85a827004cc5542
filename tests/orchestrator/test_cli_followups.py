"""What the command line tells a person to do next works as printed, and what it says a run ended
with is the run's current story.

Every hint that names a command (``send it with:``, ``drive it with:``, ``continue it with:``,
``restore one with:``, ``a worker continues it, or:``) is taken from the real console script's
output and run exactly as printed, in the same directory: it names the ``--app`` the first command
was given (or the workflow file ``run`` was given) and its ``--db``. A run that compensated after a
retried compensation ends with the failure that started its saga; a run rolled back past a
failure and then completed shows no cause, only the failure as history.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from compensations import CompensationPolicy, Compensations
from orchestrator import Orchestrator
from orchestrator.engine.loader import load_target
from workflows import Retry

FLOWS = '''\
import os
from pathlib import Path

from workflows import Workflow

FLAGS = Path(os.environ["FOLLOWUP_FLAGS"])

approval = Workflow("approval")


@approval.step
def ask(ctx, state):
    return {"approved": ctx.wait_for("approval")}


@approval.step
def done(ctx, state):
    return {"final": "yes" if state["approved"] is None or state["approved"] else "no"}


trip = Workflow("trip")


def cancel(ctx, effect):
    if (FLAGS / "cancel-down").exists():
        raise RuntimeError("cancel service down")
    with open(FLAGS / "cancelled", "a") as ledger:
        ledger.write(effect.result["booking"] + "\\n")


@trip.step(compensate=cancel)
def book(ctx, state):
    return {"booking": "b1"}


@trip.step
def pay(ctx, state):
    if not (FLAGS / "card-ok").exists():
        raise ValueError("declined")
    return {"paid": True}


nap = Workflow("nap")


@nap.step
def rest(ctx, state):
    ctx.sleep(3600)
    return {"rested": True}
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding the app file ``flows.py`` and its flag directory, as a person's project."""
    (tmp_path / "flags").mkdir()
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    return tmp_path


def agentsaga(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The console script, run in the project directory as a person would run it."""
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSAGA_")}
    full.update(FOLLOWUP_FLAGS=str(project / "flags"), **(env or {}))
    return subprocess.run([found, *args], cwd=project, capture_output=True, text=True, env=full, timeout=120)


def hint(text: str, after: str, until: str | None = None) -> list[str]:
    """The command printed after ``after`` (up to ``until``), split as a shell would split it."""
    line = next(line for line in text.splitlines() if after in line)
    command = line.split(after, 1)[1]
    if until is not None:
        command = command.split(until, 1)[0]
    words = shlex.split(command)
    assert words[0] == "agentsaga", line
    return words[1:]


def test_the_waiting_hint_of_run_names_the_signal_and_the_workflow_file_and_works_as_printed(project, db_url):
    # Given a run started from a workflow file, which waits for approval (exit 4)
    started = agentsaga(project, "run", "flows.py:approval", "--run-id", "w1", "--db", db_url)
    assert started.returncode == 4, started.stderr
    # When the command its hint prints is run exactly as printed
    command = hint(started.stderr, "send it with: ", " (add --data")
    assert command[:4] == ["signal", "w1", "approval", "--resume"]
    assert ["--app", "flows.py:approval"] == command[4:6] and ["--db", db_url] == command[6:8]
    sent = agentsaga(project, *command)
    # Then the run went on to its end
    assert sent.returncode == 0, sent.stderr
    assert "status completed" in sent.stdout


def test_hints_repeat_the_app_flag_and_a_timer_wait_says_what_continues_it(project, db_url):
    # Given a run of the app named with --app that waits for a timer
    started = agentsaga(project, "run", "nap", "--app", "flows.py", "--run-id", "n1", "--db", db_url)
    # Then its hint names the command that continues it once due, with the app and the database
    assert started.returncode == 4, started.stderr
    command = hint(started.stderr, "when it is due, or: ")
    assert command == ["recover", "--app", "flows.py", "--db", db_url]
    # And running it now is harmless: nothing is due yet
    early = agentsaga(project, *command)
    assert early.returncode == 0 and "no interrupted runs to recover" in early.stdout, early.stderr


def test_signal_without_resume_prints_a_recover_command_that_continues_the_run(project, db_url):
    # Given a waiting run, and a signal delivered without --resume by a person who named the app
    assert agentsaga(project, "run", "flows.py:approval", "--run-id", "w2", "--db", db_url).returncode == 4
    sent = agentsaga(project, "signal", "w2", "approval", "--data", "true", "--app", "flows.py", "--db", db_url)
    assert sent.returncode == 0, sent.stderr
    # When the command the output names is run as printed
    command = hint(sent.stdout, "a worker continues it, or: ", " (or send")
    assert command == ["recover", "--app", "flows.py", "--db", db_url]
    recovered = agentsaga(project, *command)
    # Then it continued the run to its end
    assert recovered.returncode == 0, recovered.stderr
    assert "w2" in recovered.stdout and "completed" in recovered.stdout
    # And with no app named anywhere, the recover command says that one is needed
    assert agentsaga(project, "run", "flows.py:approval", "--run-id", "w3", "--db", db_url).returncode == 4
    bare = agentsaga(project, "signal", "w3", "approval", "--db", db_url)
    assert hint(bare.stdout, "a worker continues it, or: ", " (or send")[:3] == ["recover", "--app", "MODULE"]


def test_fork_prints_a_resume_command_that_drives_the_fork(project, db_url):
    # Given a run that failed at pay (its booking compensated), then the card fixed
    failed = agentsaga(project, "run", "flows.py:trip", "--run-id", "t1", "--db", db_url)
    assert failed.returncode == 1, failed.stderr
    (project / "flags" / "card-ok").touch()
    # When it is forked with the app named, at book: the run's start (pay's state holds the booking
    # the saga cancelled, so a fork at pay is refused: test_fork_undone_effects.py)
    forked = agentsaga(project, "fork", "t1", "--from", "book", "--run-id", "t1-fork", "--app", "flows.py",
                       "--db", db_url)
    assert forked.returncode == 0, forked.stderr
    # Then the command it prints drives the fork as printed
    command = hint(forked.stdout, "drive it with: ")
    assert command == ["resume", "t1-fork", "--app", "flows.py", "--db", db_url]
    done = agentsaga(project, *command)
    assert done.returncode == 0, done.stderr
    assert "status completed" in done.stdout


def test_archive_and_restore_print_commands_that_work_as_printed(project, sqlite_url, tmp_path):
    # Given a finished run, archived, with the app named by AGENTSAGA_APP
    app = {"AGENTSAGA_APP": "flows.py"}
    assert agentsaga(project, "run", "approval", "--run-id", "a1", "--db", sqlite_url, env=app).returncode == 4
    assert agentsaga(project, "signal", "a1", "approval", "--resume", "--db", sqlite_url, env=app).returncode == 0
    (tmp_path / "archive").mkdir()
    archived = agentsaga(project, "archive", "--older-than", "0s", "--to", str(tmp_path / "archive"),
                         "--db", sqlite_url, env=app)
    assert archived.returncode == 0, archived.stderr
    # When the restore command it prints is run as printed (the app is found again through the environment)
    command = hint(archived.stdout, "restore one with: ")
    assert command[0] == "restore" and command[2:] == ["--db", sqlite_url]
    restored = agentsaga(project, *command, env=app)
    # Then the run is back
    assert restored.returncode == 0, restored.stderr
    assert "restored run a1" in restored.stdout
    # And a savepoint of a waiting run, restored into another database, prints a resume command that works
    assert agentsaga(project, "run", "approval", "--run-id", "a2", "--db", sqlite_url, env=app).returncode == 4
    saved = agentsaga(project, "savepoint", "a2", "--name", "before", "--out", str(tmp_path / "a2.json.gz"),
                      "--db", sqlite_url)
    assert saved.returncode == 0, saved.stderr
    other = f"sqlite:///{tmp_path / 'other.db'}"
    moved = agentsaga(project, "restore", str(tmp_path / "a2.json.gz"), "--app", "flows.py", "--db", other)
    assert moved.returncode == 0, moved.stderr
    command = hint(moved.stdout, "continue it with: ")
    assert command == ["resume", "a2", "--app", "flows.py", "--db", other]
    resumed = agentsaga(project, *command)
    assert resumed.returncode == 4 and "status waiting" in resumed.stdout, resumed.stderr


def test_a_retried_compensation_ends_the_run_with_the_failure_that_started_its_saga(project, db_url, monkeypatch):
    # Given a run whose payment was declined and whose booking's cancellation kept failing (two quick
    # attempts, in this process)
    (project / "flags" / "cancel-down").touch()
    monkeypatch.setenv("FOLLOWUP_FLAGS", str(project / "flags"))
    wf = load_target(f"{project / 'flows.py'}:trip")
    fast = Compensations(policy=CompensationPolicy(retry=Retry(attempts=2, initial=0, jitter=0)))
    with Orchestrator(db_url, workflows=[wf], compensations=fast) as orc:
        first = orc.run(wf, {}, run_id="c1")
    assert first.status == "compensation_failed"
    assert first.error == "RuntimeError: compensating 'book': cancel service down"
    # When the cancel service is back and `agentsaga compensate` retries
    (project / "flags" / "cancel-down").unlink()
    done = agentsaga(project, "compensate", "c1", "--app", "flows.py", "--db", db_url, "--json")
    # Then the run ends compensated with the payment's failure, on stderr, in the JSON and in the run row
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "agentsaga: run 'c1' ended compensated at step 'pay': ValueError: declined"
    out = json.loads(done.stdout)
    assert (out["status"], out["error"], out["failed_step"]) == ("compensated", "ValueError: declined", "pay")
    listed = [json.loads(line) for line in agentsaga(project, "runs", "--json", "--db", db_url).stdout.splitlines()]
    assert [r["error"] for r in listed if r["run_id"] == "c1"] == ["ValueError: declined"]
    assert (project / "flags" / "cancelled").read_text() == "b1\n"
    # And `show` names the payment as the cause, not the compensation that has since succeeded
    shown = agentsaga(project, "show", "c1", "--db", db_url).stdout
    assert "cause: step 'pay' failed and had no failure route" in shown and "ValueError: declined" in shown
    assert "cause: compensating" not in shown


def test_a_run_rolled_back_past_its_failure_and_completed_shows_the_failure_as_history_only(project, db_url):
    # Given a run that failed at pay and compensated its booking
    assert agentsaga(project, "run", "flows.py:trip", "--run-id", "r1", "--db", db_url).returncode == 1
    # When the card is fixed and the run is rolled back to book and completes
    (project / "flags" / "card-ok").touch()
    rolled = agentsaga(project, "rollback", "r1", "--to", "book", "--app", "flows.py", "--db", db_url)
    assert rolled.returncode == 0 and rolled.stderr == "", rolled.stderr
    # Then `show` gives no cause and no error; the declined payment is told as what came before the rollback
    shown = agentsaga(project, "show", "r1", "--db", db_url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["run", "r1", "completed"]
    assert not any(line.startswith(("cause:", "error:")) for line in lines), shown.stdout
    earlier = [line for line in lines if line.startswith("before the rollback at seq ")]
    assert len(earlier) == 1 and "step 'pay' failed" in earlier[0] and "ValueError: declined" in earlier[0]
    summary = json.loads(agentsaga(project, "show", "r1", "--json", "--db", db_url).stdout)
    assert summary["failure"] is None and summary["error"] is None
    assert [f["step"] for f in summary["earlier_failures"]] == ["pay"]
