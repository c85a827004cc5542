"""Errors that send people the right way, and failures that cannot be missed (issue 12, points 5 and 7).

The console script runs as a real subprocess; library calls run on SQLite and Postgres.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from audit_helpers import AUDITFLOW, CRASHFLOW, agentsaga, assert_one_line_error, load

from orchestrator import Orchestrator, RunFailedError
from workflows import Workflow

DECLINED = json.dumps({"decline": True, "reason": "by the bank"})


# -- point 5: a failed run is impossible to miss -------------------------------------------------------
def test_raise_for_status_names_the_run_the_failed_step_and_its_error(orc_factory):
    # Given a run whose last step fails for good, so its booking is compensated
    wf = load(AUDITFLOW)
    orc = orc_factory(wf)
    res = orc.run(wf, {"decline": True, "reason": "by the bank"}, run_id="r-failed")
    assert res.status == "compensated" and res.failed_step == "confirm"
    # When raise_for_status is called
    with pytest.raises(RunFailedError) as caught:
        res.raise_for_status()
    # Then the error names the run, its status, the step and the step's error, also as attributes
    err = caught.value
    assert str(err) == ("run 'r-failed' ended compensated at step 'confirm': PermissionError: card declined "
                        "by the bank")
    assert (err.run_id, err.status, err.step) == ("r-failed", "compensated", "confirm")
    assert err.error == "PermissionError: card declined by the bank"
    # And reading the run later tells the same step
    assert orc.result("r-failed").failed_step == "confirm"
    assert orc.resume("r-failed").failed_step == "confirm"


def test_raise_for_status_returns_the_result_so_it_chains(orc_factory):
    # Given a run that completes
    wf = load(AUDITFLOW)
    orc = orc_factory(wf)
    # Then raise_for_status returns the result itself, and no step is named as failed
    state = orc.run(wf, {}, run_id="r-ok").raise_for_status().state
    assert state["confirmed"] is True
    assert orc.result("r-ok").failed_step is None


def test_a_failed_run_without_effects_names_its_step(orc_factory):
    # Given a workflow whose only step raises (no effect, so the run ends failed, not compensated)
    wf = Workflow("fails-plainly", version="1")

    @wf.step()
    def fetch(ctx, state):
        raise ValueError("the page is gone")

    orc = orc_factory(wf)
    res = orc.run(wf, {}, run_id="r-plain")
    # Then the failure names the step and the error
    assert (res.status, res.failed_step, res.error) == ("failed", "fetch", "ValueError: the page is gone")
    with pytest.raises(RunFailedError, match=r"^run 'r-plain' ended failed at step 'fetch': ValueError: the page"):
        res.raise_for_status()


def test_run_prints_a_failed_run_on_stderr_and_exits_1(db_url):
    # When a run whose last step fails is run from the command line, as text and as JSON
    text = agentsaga("run", AUDITFLOW, "--input", DECLINED, "--run-id", "c1", db=db_url)
    as_json = agentsaga("run", AUDITFLOW, "--input", DECLINED, "--run-id", "c2", "--json", db=db_url)
    # Then each exits 1 with the run, the step and the error on stderr
    for done, run_id in ((text, "c1"), (as_json, "c2")):
        assert done.returncode == 1, done.stderr
        assert (f"agentsaga: run '{run_id}' ended compensated at step 'confirm': PermissionError: card declined by "
                "the bank") in done.stderr.splitlines()
    # And the JSON on stdout names the failed step too
    assert json.loads(as_json.stdout)["failed_step"] == "confirm"
    # And `resume` of the finished run says the same, with the same exit code
    again = agentsaga("resume", "c1", db=db_url)
    assert again.returncode == 1
    assert "ended compensated at step 'confirm'" in again.stderr


def test_a_completed_run_exits_0_with_nothing_on_stderr(sqlite_url, tmp_path):
    done = agentsaga("run", CRASHFLOW, "--input", '{"round": 0}', db=sqlite_url, ledger=tmp_path / "ledger")
    assert done.returncode == 0 and done.stderr == ""


# -- point 7: bad input is a usage error naming the thing at fault ---------------------------------------
@pytest.mark.parametrize("value, why", [("30", "needs a unit"), ("3.5", "needs a unit"), ("soon", "is not a duration"),
                                        ("30x", "is not a duration")])
def test_gc_older_than_requires_a_unit(sqlite_url, value, why):
    # Given a database with a finished run
    agentsaga("run", AUDITFLOW, "--input", "{}", db=sqlite_url)
    # When gc is given a bare number (or no duration at all)
    done = agentsaga("gc", "--older-than", value, "--dry-run", db=sqlite_url)
    # Then it is a usage error naming the option and the units, and nothing is listed for deletion
    assert done.returncode == 2
    assert_one_line_error(done, f"--older-than {value!r} {why}", "30d, 12h, 90m, 45s")
    assert done.stdout == ""


@pytest.mark.parametrize("unit", ["45s", "90m", "12h", "30d", "2w"])
def test_gc_older_than_accepts_each_unit(sqlite_url, unit):
    agentsaga("run", AUDITFLOW, "--input", "{}", db=sqlite_url)
    done = agentsaga("gc", "--older-than", unit, "--dry-run", db=sqlite_url)
    assert done.returncode == 0, done.stderr


def test_runs_with_an_unknown_status_lists_the_valid_ones(sqlite_url):
    agentsaga("run", AUDITFLOW, "--input", "{}", db=sqlite_url)
    done = agentsaga("runs", "--status", "completed,bogus", db=sqlite_url)
    assert done.returncode == 2
    assert_one_line_error(done, "--status 'bogus' is not a run status",
                          "pending, running, compensating, waiting, cancelled, compensated, compensation_failed, "
                          "completed, failed, dead")
    assert done.stdout == ""


@pytest.mark.parametrize("verb", ["run", "enqueue"])
@pytest.mark.parametrize("value, kind", [("[1, 2]", "array"), ('"hello"', "string"), ("3", "number"),
                                         ("null", "null")])
def test_a_non_object_input_is_a_usage_error_like_bad_json(sqlite_url, verb, value, kind):
    # When a run is started with JSON that is not an object
    done = agentsaga(verb, AUDITFLOW, "--input", value, "--run-id", "x1", db=sqlite_url)
    # Then it exits 2, like bad JSON, naming the option and what it got, and starts nothing
    assert done.returncode == 2
    assert_one_line_error(done, "--input must be a JSON object", f"got a JSON {kind}")
    bad_json = agentsaga(verb, AUDITFLOW, "--input", "{oops", db=sqlite_url)
    assert bad_json.returncode == 2
    with Orchestrator(sqlite_url) as orc:
        assert orc.list_runs() == []


def test_a_non_object_input_file_is_a_usage_error(sqlite_url, tmp_path):
    path = tmp_path / "input.json"
    path.write_text("[1]")
    done = agentsaga("run", AUDITFLOW, "--input-file", str(path), db=sqlite_url)
    assert done.returncode == 2
    assert_one_line_error(done, f"--input-file {str(path)!r} must be a JSON object")


def test_an_unknown_run_names_the_database_searched(db_url):
    # Given a database with one run
    agentsaga("run", AUDITFLOW, "--input", "{}", "--run-id", "known", db=db_url)
    # When an unknown run is shown, resumed or signalled
    for args in (["show", "nope"], ["history", "nope"], ["resume", "nope"], ["signal", "nope", "go"]):
        done = agentsaga(*args, db=db_url)
        # Then the one-line error names the run and the database (its password, if any, masked)
        assert done.returncode == 1, args
        shown = db_url if db_url.startswith("sqlite") else db_url.split("?", 1)[0]
        assert_one_line_error(done, "no run 'nope' in ", shown.split("@")[-1])


@pytest.mark.parametrize("args", [["show", "r1"], ["history", "r1"], ["verify", "r1"], ["runs"], ["stats"],
                                  ["report", "r1", "--html", "out.html"], ["gc", "--older-than", "30d"],
                                  ["resume", "r1"], ["signal", "r1", "go"], ["cancel", "r1"], ["retry", "r1"],
                                  ["compensate", "r1"], ["rollback", "r1", "--to", "1"]])
def test_verbs_on_an_existing_run_never_create_a_database(tmp_path, args):
    # Given a working directory without a database and no AGENTSAGA_DB
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "AGENTSAGA_DB"}
    exe = Path(sys.executable).parent / "agentsaga"
    # When a verb that reads a run, or works on one that must exist, is run there
    done = subprocess.run([str(exe), *args], cwd=work, capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    # Then it fails naming the database file it looked for, and creates none
    assert done.returncode == 1, done.stdout
    assert_one_line_error(done, "no database at 'agentsaga.db'", str(work))
    assert list(work.iterdir()) == []


def test_recover_prints_each_failed_run_on_stderr_and_exits_1(sqlite_url):
    # Given two runs started but never driven: one that will complete, one whose last step fails
    wf = load(AUDITFLOW)
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        orc.start(wf, {}, run_id="rec-ok")
        orc.start(wf, {"decline": True, "reason": "by the bank"}, run_id="rec-bad")
    # When they are recovered from the command line
    done = agentsaga("recover", "--app", AUDITFLOW.split(":")[0], db=sqlite_url)
    # Then both are listed, the failure is named on stderr with its step, and the exit is 1
    assert done.returncode == 1, done.stderr
    assert "rec-ok" in done.stdout and "rec-bad" in done.stdout
    assert done.stderr.splitlines() == ["agentsaga: run 'rec-bad' ended compensated at step 'confirm': "
                                        "PermissionError: card declined by the bank"]


@pytest.mark.parametrize("value, needle", [
    ('{"a": NaN}', "NaN is not a JSON value"),
    ('{"a": -Infinity}', "-Infinity is not a JSON value"),
    ('{"x": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
])
def test_input_json_has_no_nan_and_no_bottomless_nesting(sqlite_url, value, needle):
    # When a run is started with an input Python's json would read but JSON (or the journal) cannot hold
    done = agentsaga("run", AUDITFLOW, "--input", value, "--run-id", "x1", db=sqlite_url)
    # Then it is a usage error like any bad JSON, and nothing is started
    assert done.returncode == 2
    assert_one_line_error(done, "--input is not valid JSON" if "nested" not in needle else "--input", needle)
    with Orchestrator(sqlite_url) as orc:
        assert orc.list_runs() == []


@pytest.mark.parametrize("value, key", [('{"n": 1, "n": 2}', "'n'"), ('{"a": {"b": 1, "c": 2, "b": 3}}', "'b'")],
                         ids=["top level", "nested"])
def test_a_key_given_twice_in_json_is_a_usage_error_not_a_silent_choice(sqlite_url, value, key):
    # When a run is started, or a signal sent, with JSON giving a key twice (json would keep the last)
    done = agentsaga("run", AUDITFLOW, "--input", value, "--run-id", "x1", db=sqlite_url)
    # Then it is a usage error naming the key, and nothing is started or sent
    assert done.returncode == 2
    assert_one_line_error(done, "--input gives the key", key, "twice")
    sent = agentsaga("signal", "x1", "go", "--data", value, db=sqlite_url)
    assert sent.returncode == 2
    assert_one_line_error(sent, "--data gives the key", key, "twice")
    with Orchestrator(sqlite_url) as orc:
        assert orc.list_runs() == []


def test_an_argument_that_is_not_utf8_is_a_usage_error(sqlite_url):
    # Given a database with a run, and a run id given as bytes that are not UTF-8 (as a shell passes them)
    assert agentsaga("run", AUDITFLOW, "--input", "{}", "--run-id", "ok", db=sqlite_url).returncode == 0
    # When a verb looks it up
    done = agentsaga("show", "bad\udcff", db=sqlite_url)
    # Then one line says so, exit 2
    assert done.returncode == 2
    assert_one_line_error(done, "an argument is not valid UTF-8 text", "'\\udcff'")


def test_an_app_that_exits_on_import_is_named(sqlite_url, tmp_path):
    # Given an app file that runs a program (and exits) when imported
    app = tmp_path / "script.py"
    app.write_text("import sys\nsys.exit(3)\n")
    # When a driving verb imports it
    done = agentsaga("recover", "--app", str(app), db=sqlite_url)
    # Then it is an error naming the file and the exit, not a silent exit 3
    assert done.returncode == 1
    assert_one_line_error(done, "importing it called sys.exit(3)", "__main__")
