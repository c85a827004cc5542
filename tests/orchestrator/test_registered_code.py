"""Invariant 11: the database never decides what code runs, and reading a run runs nothing.

A stored run names its workflow (name, version, fingerprint); the code that drives it is only what
the process registered or a person named. Reading verbs and the library's audit reads import no
code, take no lease and append nothing, on SQLite and Postgres.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import ROOT, agentsaga, assert_one_line_error, raw_sql  # noqa: E402

from orchestrator import Orchestrator, WorkflowNotFoundError  # noqa: E402
from store import open_store  # noqa: E402
from workflows import END, Workflow, reducers  # noqa: E402

APP = ROOT / "tests/orchestrator/markedapp.py"


def crash_a_run(db_url: str, run_id: str = "m1") -> None:
    """A run of markedapp killed in its third step; its one-second lease has expired on return."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSAGA_TEST_MARKER", "AGENTSAGA_DB")}
    killed = subprocess.run([sys.executable, str(APP), db_url, run_id], cwd=ROOT, capture_output=True, text=True,
                            env=env, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    time.sleep(1.1)


def point_the_row_at(db_url: str, run_id: str, target: str) -> None:
    """What an attacker with write access to the database (or an old agentsaga) leaves in the row."""
    raw_sql(db_url, "UPDATE agentsaga_runs SET target = ? WHERE run_id = ?", (target, run_id))


def everything_about(db_url: str, run_id: str) -> tuple:
    with open_store(db_url) as store:
        return (store.get_run(run_id), [(e.seq, e.kind, e.data) for e in store.events(run_id)],
                [(s.seq, s.sha256) for s in store.snapshots(run_id)])


# -- driving: only registered code ---------------------------------------------------------------
def test_a_run_whose_row_names_a_module_is_not_driven_by_importing_it(db_url, tmp_path, monkeypatch):
    # Given a crashed run whose row names an importable module (as older versions recorded it)
    crash_a_run(db_url)
    point_the_row_at(db_url, "m1", f"{APP}:wf")
    marker = tmp_path / "imported"
    monkeypatch.setenv("AGENTSAGA_TEST_MARKER", str(marker))
    before = everything_about(db_url, "m1")
    # When a process that registers no workflow is asked to resume it
    with Orchestrator(db_url) as orc, pytest.raises(WorkflowNotFoundError) as info:
        orc.resume("m1")
    # Then the error names the workflow, its version and how to register it
    message = str(info.value)
    assert "'marked'" in message and "version '7'" in message and "Orchestrator(workflows=[...])" in message
    assert "--app" in message and "AGENTSAGA_APP" in message and "agentsaga.toml" in message
    # And the module was never imported, and the run is as it was
    assert not marker.exists()
    assert everything_about(db_url, "m1")[1:] == before[1:]


def test_recover_leaves_runs_of_unregistered_workflows_untouched(db_url, tmp_path, monkeypatch):
    # Given the same crashed run, its lease expired
    crash_a_run(db_url)
    point_the_row_at(db_url, "m1", f"{APP}:wf")
    marker = tmp_path / "imported"
    monkeypatch.setenv("AGENTSAGA_TEST_MARKER", str(marker))
    # When recover runs in a process that registers another workflow
    other = Workflow("other")
    other.step(start=True, name="s")(lambda ctx, s: {})
    other.edge("s", END)
    with Orchestrator(db_url, workflows=[other]) as orc:
        [result] = orc.recover()
    # Then the run is reported as not driven, with the reason, and nothing was imported or appended
    assert result.run_id == "m1" and result.status == "running" and "not registered" in result.error
    assert not marker.exists()
    with open_store(db_url) as store:
        assert [e.kind for e in store.events("m1")][-1] == "StepCompleted"


def test_the_cli_resumes_with_the_app_it_is_told_and_says_how_otherwise(db_url, tmp_path):
    crash_a_run(db_url)
    point_the_row_at(db_url, "m1", f"{APP}:wf")
    marker = tmp_path / "imported"
    env = {"AGENTSAGA_TEST_MARKER": str(marker)}
    # When `agentsaga resume` is given only the run id
    done = agentsaga("resume", "m1", db=db_url, env=env)
    # Then it is a one-line error naming the workflow and how to register it, and nothing was imported
    assert_one_line_error(done, "'marked' version '7'", "not registered", "--app")
    assert not marker.exists()
    # When the app is named
    done = agentsaga("resume", "m1", "--app", str(APP), "--json", db=db_url, env=env)
    # Then the run completes (with the app's own reducer: best is the max, not the last)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)["state"]
    assert state["log"] == ["one", "two", "three"] and state["best"] == 9
    assert marker.exists()  # named by a person: imported, as asked


def test_a_new_run_records_no_path_and_its_reducer_kinds(sqlite_url):
    # Given a workflow with a built-in and an own reducer
    wf = Workflow("kinds", reducers={"log": reducers.append, "n": reducers.add, "best": max})
    wf.step(start=True, name="s")(lambda ctx, s: {"log": "a"})
    wf.edge("s", END)
    # When a run of it starts
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="k1")
        started = orc.history("k1")[0]["data"]
        row = orc.get_run("k1")
    # Then neither the row nor the journal names a module or a file
    assert row.target == "" and "target" not in started
    assert __name__ not in json.dumps(started) and ".py" not in json.dumps(started)
    # And the reducer kinds are recorded, so a reader without the code can fold the state
    assert started["reducers"] == [["best", "custom"], ["log", "append"], ["n", "add"]]


# -- reading: no code, no lease, no append -----------------------------------------------------------
READ_VERBS = [
    ["runs"], ["runs", "--json"], ["show", "m1"], ["show", "m1", "--json"], ["history", "m1"],
    ["history", "m1", "--json", "--full"], ["verify", "m1"], ["report", "m1", "--html", "{tmp}/r.html"],
    ["stats"], ["gc", "--keep-snapshots", "1", "--older-than", "0s", "--dry-run"],
]


def test_every_read_verb_leaves_a_crashed_run_and_its_app_alone(db_url, tmp_path):
    # Given a crashed run with an expired lease, whose app is configured everywhere a verb could
    # look: AGENTSAGA_APP, an agentsaga.toml in the working directory, and the row's old target
    crash_a_run(db_url)
    point_the_row_at(db_url, "m1", f"{APP}:wf")
    (tmp_path / "agentsaga.toml").write_text(f'app = "{APP}"\n', encoding="utf-8")
    marker = tmp_path / "imported"
    env = {"AGENTSAGA_TEST_MARKER": str(marker), "AGENTSAGA_APP": str(APP)}
    before = everything_about(db_url, "m1")
    assert before[0].status == "running" and before[0].lease_expires_at < time.time()
    said: dict[str, str] = {}
    for verb in READ_VERBS:
        argv = [a.replace("{tmp}", str(tmp_path)) for a in verb]
        # When each reading verb runs there
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv, "--db", db_url], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
        # Then it works, imports nothing, appends nothing and leaves the lease as it was
        assert done.returncode == 0, (verb, done.stderr)
        assert not marker.exists(), verb
        assert everything_about(db_url, "m1") == before, verb
        said[" ".join(verb)] = done.stdout
    # And `show` says how it read the state without the code
    show = said["show m1"]
    assert "state from snapshot at seq 2 + 1 events" in show
    assert "folded without reducers: fields merged by replacement: best" in show


def test_the_librarys_reads_leave_a_crashed_run_alone_and_say_how_they_read_it(db_url, tmp_path, monkeypatch):
    # Given the crashed run, and a process that does not register its workflow
    crash_a_run(db_url)
    point_the_row_at(db_url, "m1", f"{APP}:wf")
    marker = tmp_path / "imported"
    monkeypatch.setenv("AGENTSAGA_TEST_MARKER", str(marker))
    monkeypatch.setenv("AGENTSAGA_APP", str(APP))
    before = everything_about(db_url, "m1")
    # When every read of orc.audit (and orc.result) is made
    with Orchestrator(db_url) as orc:
        orc.list_runs()
        orc.history("m1")
        summary = orc.summary("m1", keep_states=True)
        report = orc.verify("m1")
        orc.report_html("m1")
        orc.stats()
        orc.gc(keep_snapshots=0, older_than=0, dry_run=True)
        result = orc.result("m1")
    # Then nothing was imported, appended or leased
    assert not marker.exists()
    assert everything_about(db_url, "m1") == before
    # And the state is read from the snapshot, the built-in reducer applied, and the note says
    # which field was merged by replacement
    assert result.state["log"] == ["one", "two"]
    assert result.note == ("state from snapshot at seq 2 + 1 events; folded without reducers: "
                           "fields merged by replacement: best")
    assert summary.state == result.state and summary.state_source == result.note
    assert report.ok and any("best" in n for n in report.notes)


def test_result_of_an_unregistered_run_is_the_snapshot_not_a_wrong_fold(sqlite_url):
    # Given a finished run whose own reducer keeps the best score (the last update is lower)
    def keep_best(current, update):
        return update if current is reducers.MISSING else max(current, update)

    wf = Workflow("scores", reducers={"best": keep_best, "log": reducers.append})
    wf.step(start=True, name="a")(lambda ctx, s: {"best": 9, "log": "a"})
    wf.step(name="b")(lambda ctx, s: {"best": 2, "log": "b"})
    wf.edge("a", "b")
    wf.edge("b", END)
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        driven = orc.run(wf, {}, run_id="s1")
    # When a process without the workflow asks for its result
    with Orchestrator(sqlite_url) as orc:
        read = orc.result("s1")
    # Then it is the state the run ended with (from its final snapshot), not a replacement fold
    assert driven.state == {"best": 9, "log": ["a", "b"]}
    assert read.state == driven.state and read.workflow == "scores"
    assert read.note.startswith("state from snapshot at seq")


def test_resume_of_a_finished_run_without_its_code_shows_the_stored_state(sqlite_url):
    # Given a finished run whose list field is built by an append reducer
    wf = Workflow("notes", reducers={"notes": reducers.append})
    wf.step(start=True, name="a")(lambda ctx, s: {"notes": "found something on sagas"})
    wf.edge("a", END)
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        orc.run(wf, {}, run_id="r1")
    # When `agentsaga resume` is run on it without the app
    done = agentsaga("resume", "r1", db=sqlite_url)
    # Then it names the workflow, shows the list the run ended with, and says how it read it
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run r1  workflow notes  status completed")
    assert lines[1] == 'state: {"notes":["found something on sagas"]}'
    assert lines[2].startswith("note: state from snapshot at seq 3 + 0 events")
