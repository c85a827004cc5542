"""``agentsaga demo`` end to end, as a user runs it: a real subprocess, a temporary database."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import resource
import sys
from pathlib import Path

import pytest

from orchestrator import Orchestrator

pytestmark = pytest.mark.slow

HANG = 300.0  # seconds: bounds a hang of a whole demo, never a measure of speed


def agentsaga() -> str:
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    return found


def cpu_of_children() -> float:
    """CPU seconds used so far by this process's finished children (and their waited-for children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def offline_env() -> dict[str, str]:
    """The demo's own scripted model, whatever the developer's shell has configured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def test_the_demo_crashes_resumes_approves_and_writes_the_report(tmp_path):
    db, report = f"sqlite:///{tmp_path / 'demo.db'}", tmp_path / "report.html"
    # When a user runs the demo
    before = cpu_of_children()
    done = subprocess.run([agentsaga(), "demo", "--db", db, "--report", str(report)], cwd=tmp_path,
                          env=offline_env(), capture_output=True, text=True, timeout=HANG)
    used = cpu_of_children() - before
    out = done.stdout
    # Then it succeeded, doing well under 20 seconds of work. CPU seconds, not wall time: on a
    # loaded machine the same demo takes longer to run but no more work, and it waits on nothing
    # but its own processes (the wall-clock number is a benchmark's to report, not a test's)
    assert done.returncode == 0, out + done.stderr
    assert used < 20, used
    # And the child process died of a real SIGKILL, and the resumed run did not pay twice
    assert "child died of SIGKILL" in out
    served, journaled = map(int, re.search(r"model requests served: (\d+); model calls journaled: (\d+)", out).groups())
    assert served == journaled == 5
    # And the approval was granted, the venue booked, the run completed
    assert "status: waiting" in out and "the demo approves it" in out
    assert "booking service: book hotel-1" in out
    run_id = re.search(r"agentsaga demo: run (\S+)", out).group(1)
    assert f"Run {run_id}: completed" in out
    # And the step table shows every step, and the report was written
    for step in ("plan", "research", "approve", "book", "answer", "-- resumed --"):
        assert step in out
    assert report.exists() and run_id in report.read_text(encoding="utf-8")
    # And the database holds the run as a user would inspect it afterwards
    with Orchestrator(db) as orc:
        assert orc.get_run(run_id).status == "completed"
        kinds = [e["kind"] for e in orc.history(run_id)]
    assert kinds.count("Resumed") == 2 and "SignalReceived" in kinds


def read_until_the_signal_command(demo: subprocess.Popen) -> tuple[list[str], str]:
    """The demo's output up to the ``agentsaga signal ...`` line it asks the user to run, and that line."""
    lines = []
    for line in demo.stdout:
        lines.append(line)
        if "agentsaga signal" in line:
            return lines, line.strip()
    raise AssertionError("the demo printed no `agentsaga signal` command:\n" + "".join(lines))


def test_manual_approval_prints_a_command_that_works_as_shown_with_the_default_database(tmp_path):
    # Given no --db and no AGENTSAGA_DB: the demo uses agentsaga.db in its working directory
    here, elsewhere = tmp_path / "demo", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    env = {k: v for k, v in offline_env().items() if k != "AGENTSAGA_DB"}
    demo = subprocess.Popen([agentsaga(), "demo", "--manual-approval"], cwd=here, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines, command = read_until_the_signal_command(demo)
        # When the user pastes the printed command into another terminal, in another directory
        argv = shlex.split(command)
        assert argv[0] == "agentsaga" and "--db" in argv, command
        sent = subprocess.run([agentsaga(), *argv[1:]], cwd=elsewhere, env=env, capture_output=True, text=True,
                              timeout=30)
        assert sent.returncode == 0, sent.stderr
        rest, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    # Then the signal reached the demo's own database, and the run went on to book and complete
    assert demo.returncode == 0, "".join(lines) + rest + err
    assert "approval received" in rest and "booking service: book hotel-1" in rest
    assert argv[argv.index("--db") + 1] == f"sqlite:///{here / 'agentsaga.db'}"
    assert not (elsewhere / "agentsaga.db").exists()
    # And the commands it suggests next name that database too
    assert f"agentsaga runs --db sqlite:///{here / 'agentsaga.db'}" in rest
    assert (here / "agentsaga-demo.html").exists()


def test_manual_approval_waits_for_the_signal_sent_from_another_process(tmp_path):
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    # Given the demo started with --manual-approval
    demo = subprocess.Popen([agentsaga(), "demo", "--db", db, "--manual-approval", "--report",
                             str(tmp_path / "r.html")], cwd=tmp_path, env=offline_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # When it prints the command to approve, and the user runs it in another process
        lines, command = read_until_the_signal_command(demo)
        assert command.startswith("agentsaga signal demo-"), "".join(lines)
        run_id = command.split()[2]
        sent = subprocess.run([agentsaga(), "signal", run_id, "approval", "--data",
                               '{"approved": false, "reason": "too expensive"}', "--db", db],
                              env=offline_env(), capture_output=True, text=True, timeout=HANG)
        assert sent.returncode == 0, sent.stderr
        rest, err = demo.communicate(timeout=HANG)
    finally:
        if demo.poll() is None:
            demo.kill()
    # Then the demo continued with the decision it received: nothing was booked
    assert demo.returncode == 0, "".join(lines) + rest + err
    assert "approval received" in rest and "booking service: nothing" in rest
    with Orchestrator(db) as orc:
        state = orc.result(run_id).state
    assert state["approval"] == {"approved": False, "reason": "too expensive"} and "booking" not in state


def test_an_in_memory_database_is_refused_before_anything_starts(capsys):
    # Given a database the demo's child process could never share
    from orchestrator.cli import main

    # When the demo is asked to use it
    code = main(["demo", "--db", "sqlite://"])
    # Then it is a usage error that says why
    assert code == 2
    assert "in-memory SQLite" in capsys.readouterr().err
