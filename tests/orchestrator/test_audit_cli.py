"""The audit verbs through the real console script (subprocess), on SQLite and Postgres."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import (  # noqa: E402
    AUDITFLOW,
    CRASHFLOW,
    agentsaga,
    assert_one_line_error,
    load,
    raw_sql,
    tamper_snapshot,
)
from auditflow import HOSTILE  # noqa: E402

CRASHAPP = CRASHFLOW.rpartition(":")[0]

from orchestrator import Orchestrator  # noqa: E402

pytestmark = pytest.mark.slow
DAY = 86400.0


@pytest.fixture
def ledger(tmp_path):
    return tmp_path / "ledger"


def run_crashflow(db_url: str, ledger: Path, run_id: str = "c1") -> None:
    done = agentsaga("run", CRASHFLOW, "--input", '{"round": 0}', "--run-id", run_id, db=db_url, ledger=ledger)
    assert done.returncode == 0, done.stderr


def no_terminal_escapes(text: str) -> bool:
    return not any(c in text for c in "\x1b\x9b\x07\r")


def test_show_and_history_tell_a_saga_run_without_letting_escapes_through(db_url):
    # Given a run whose search fails twice, whose output holds HTML and terminal escapes, and
    # whose last step fails so the booking is compensated
    payload = json.dumps({"flaky": 2, "decline": True, "payload": HOSTILE, "reason": HOSTILE})
    ran = agentsaga("run", AUDITFLOW, "--input", payload, "--run-id", "a1", db=db_url)
    assert ran.returncode == 1 and "status compensated" in ran.stdout, ran.stderr
    # When it is shown
    show = agentsaga("show", "a1", db=db_url)
    assert show.returncode == 0, show.stderr
    out = show.stdout
    # Then the summary names its status, the cause, each step with attempts and outcome
    assert out.startswith("run a1  compensated\n")
    assert "cause: step 'confirm' failed and had no failure route" in out and "PermissionError" in out
    rows = {line.split()[3]: line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"], ["3"],
                                                                                                  ["4"])}
    assert rows["search"][4:6] == ["completed", "3"] and rows["confirm"][4] == "failed"
    # And its effect with the compensation, and its snapshots
    assert "EFFECTS AND COMPENSATIONS" in out and "compensated" in out.split("EFFECTS AND COMPENSATIONS")[1]
    assert "SNAPSHOTS" in out and "verifies" in out
    # And nothing from the journal reached the terminal as a control character (the error shows it)
    assert no_terminal_escapes(out) and "\\x1b[2J\\x1b[31mRED" in out
    # And its tables fit in 100 columns
    for line in out.splitlines():
        if line[:1].isdigit() or line.startswith(("#", "SEQ")):
            assert len(line) <= 100, line
    # When its history is read, as text and as JSON lines
    text = agentsaga("history", "a1", db=db_url)
    lines = agentsaga("history", "a1", "--json", db=db_url)
    assert text.returncode == lines.returncode == 0
    # Then every event is there, in order, with the step outputs and traces
    events = [json.loads(line) for line in lines.stdout.splitlines()]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(events) + 1))
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "RunStarted" and kinds.count("StepFailed") == 3
    assert {"SagaStarted", "CompensationStarted", "CompensationCompleted", "SagaCompleted"} <= set(kinds)
    search = next(e for e in events if e["kind"] == "StepCompleted" and e["data"]["step"] == "search")
    assert search["data"]["update"]["notes"] == HOSTILE  # JSON keeps the data exact...
    assert no_terminal_escapes(lines.stdout) and no_terminal_escapes(text.stdout)  # ...and the terminal safe
    assert "\\x1b[2J" in text.stdout and "the model answered" in text.stdout
    for seq in seqs:
        assert any(line.split()[:1] == [str(seq)] for line in text.stdout.splitlines()), seq
    # And --json of show is data too
    summary = json.loads(agentsaga("show", "a1", "--json", db=db_url).stdout)
    assert summary["failure"]["step"] == "confirm" and len(summary["executions"]) == 4
    assert summary["effects"][0]["status"] == "compensated"


def test_verify_exits_3_naming_the_tampered_snapshot(db_url, ledger):
    # Given a completed run: its journal and final snapshot agree
    run_crashflow(db_url, ledger)
    ok = agentsaga("verify", "c1", db=db_url, ledger=ledger)
    assert ok.returncode == 0 and "run c1: OK" in ok.stdout, ok.stdout + ok.stderr
    # When its snapshot is changed in the database (hash left as it was)
    tamper_snapshot(db_url, "c1", 15, lambda s: s["state"].update(total=999), rehash=False)
    bad = agentsaga("verify", "c1", db=db_url, ledger=ledger)
    # Then verify fails with exit 3, naming the seq, the hash, and what differs
    assert bad.returncode == 3, bad.stdout + bad.stderr
    assert "snapshot seq 15: sha256 mismatch" in bad.stdout
    assert "state.total: snapshot has 999, the journal folds to 33" in bad.stdout
    # When it is rewritten with a matching hash, so that only the journal can tell
    tamper_snapshot(db_url, "c1", 15, lambda s: s["state"].update(total=33, round=9), rehash=True)
    rehashed = agentsaga("verify", "c1", "--json", db=db_url, ledger=ledger)
    # Then verify still fails, and says exactly where
    assert rehashed.returncode == 3
    report = json.loads(rehashed.stdout)
    assert report["ok"] is False
    [problem] = report["problems"]
    assert (problem["subject"], problem["seq"]) == ("snapshot", 15)
    assert problem["differences"] == ["state.round: snapshot has 9, the journal folds to 3"]


def test_fork_from_a_step_then_resume(db_url, ledger):
    # Given a completed run
    run_crashflow(db_url, ledger)
    # When it is forked at merge
    forked = agentsaga("fork", "c1", "--from", "merge", "--run-id", "c1-fork", "--json", "--app", CRASHAPP, db=db_url,
                       ledger=ledger)
    assert forked.returncode == 0, forked.stderr
    out = json.loads(forked.stdout)
    # Then a pending run exists whose first state is the parent's before its last merge
    assert out["run_id"] == "c1-fork" and out["status"] == "pending" and out["parent"]["step"] == "merge"
    first = json.loads(agentsaga("history", "c1-fork", "--json", db=db_url).stdout.splitlines()[0])
    assert first["data"]["input"] == {
        "round": 2, "total": 33,
        "log": ["begin0", "left", "right", "merge11", "begin1", "left", "right", "merge22", "begin2", "left", "right"]}
    runs = [json.loads(line) for line in agentsaga("runs", "--json", db=db_url).stdout.splitlines()]
    assert {r["run_id"]: r["parent_run_id"] for r in runs} == {"c1-fork": "c1", "c1": None}
    # And resume drives it to the same end as its parent
    done = agentsaga("resume", "c1-fork", "--json", "--app", CRASHAPP, db=db_url, ledger=ledger)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"]["total"] == 33 and json.loads(done.stdout)["state"]["round"] == 3


def test_report_is_written_or_refused_in_one_line(db_url, ledger, tmp_path):
    run_crashflow(db_url, ledger)
    target = tmp_path / "out" / "c1.html"
    target.parent.mkdir()
    # When a report is asked for
    done = agentsaga("report", "c1", "--html", str(target), db=db_url, ledger=ledger)
    # Then it is one HTML file
    assert done.returncode == 0, done.stderr
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in target.parent.iterdir()] == ["c1.html"]  # no temp file left behind
    # And a path that cannot be written is a one-line error, leaving nothing behind
    for bad in (tmp_path / "missing-dir" / "r.html", tmp_path / "out"):
        refused = agentsaga("report", "c1", "--html", str(bad), db=db_url, ledger=ledger)
        assert_one_line_error(refused, "cannot write the report to", str(bad))
    assert [p.name for p in target.parent.iterdir()] == ["c1.html"]


def test_gc_dry_run_then_for_real_never_touching_unfinished_runs(db_url, ledger, monkeypatch):
    # Given two runs that ended 40 days ago and one pending since then, and a recent run
    monkeypatch.setenv("CRASHFLOW_LEDGER", str(ledger))
    wf = load(CRASHFLOW)
    ago = time.time() - 40 * DAY
    # (chains of 2 incremental snapshots, so that keeping the newest leaves older chains to drop)
    with Orchestrator(db_url, workflows=[wf], clock=lambda: ago, snapshot_every=2, keep_snapshots=9,
                      incremental_snapshots=2) as orc:
        orc.run(wf, {"round": 0}, run_id="old-1")
        orc.run(wf, {"round": 0}, run_id="old-2")
        orc.start(wf, {"round": 0}, run_id="old-pending")
    with Orchestrator(db_url, workflows=[wf], snapshot_every=2, keep_snapshots=9, incremental_snapshots=2) as orc:
        orc.run(wf, {"round": 0}, run_id="recent")
    snapshots = "SELECT COUNT(*) FROM agentsaga_snapshots"
    (before,) = raw_sql(db_url, snapshots)[0]
    # When gc is asked for a dry run
    dry = agentsaga("gc", "--older-than", "30d", "--keep-snapshots", "1", "--dry-run", db=db_url, ledger=ledger)
    # Then it lists what it would do and does nothing
    assert dry.returncode == 0, dry.stderr
    assert "DRY RUN" in dry.stdout and "old-1" in dry.stdout and "old-2" in dry.stdout and "recent" in dry.stdout
    assert "old-pending" not in dry.stdout.split("gc would")[0]
    assert "gc would delete 2 run(s)" in dry.stdout and "1 unfinished run(s) untouched (1 pending)" in dry.stdout
    assert raw_sql(db_url, snapshots)[0][0] == before
    # When it runs for real
    real = agentsaga("gc", "--older-than", "30d", "--keep-snapshots", "1", "--json", db=db_url, ledger=ledger)
    assert real.returncode == 0, real.stderr
    report = json.loads(real.stdout)
    # Then the old finished runs are gone, the pending one stays, the recent one keeps its newest
    # snapshot and the chain it needs (incremental snapshots: back to its full snapshot), nothing older
    assert sorted(d["run_id"] for d in report["deleted"]) == ["old-1", "old-2"]
    left = [json.loads(line)["run_id"] for line in agentsaga("runs", "--json", db=db_url).stdout.splitlines()]
    assert sorted(left) == ["old-pending", "recent"]
    kept = raw_sql(db_url, "SELECT s.seq, s.kind FROM agentsaga_snapshots s JOIN agentsaga_runs r"
                           " ON r.pk = s.run_pk WHERE r.run_id = 'recent' ORDER BY s.seq")
    assert kept[-1][0] == 15 and kept[0][1] == "full" and {k for _, k in kept[1:]} <= {"incremental"}
    [recent] = report["pruned"]
    assert recent["kept"] == [seq for seq, _ in kept] and recent["deleted"]
    assert agentsaga("verify", "recent", db=db_url, ledger=ledger).returncode == 0


@pytest.mark.parametrize("args", [
    ["show", "nope"], ["history", "nope"], ["verify", "nope"], ["fork", "nope", "--from", "merge"],
    ["report", "nope", "--html", "x.html"],
])
def test_unknown_run_is_a_one_line_error(db_url, args):
    Orchestrator(db_url).close()  # an empty database (a reading verb never creates one)
    done = agentsaga(*args, db=db_url)
    assert done.returncode == 1
    assert_one_line_error(done, "no run 'nope'")
    assert "Traceback" in agentsaga(*args, "--debug", db=db_url).stderr


def test_unknown_fork_step_is_a_one_line_error(db_url, ledger):
    run_crashflow(db_url, ledger)
    done = agentsaga("fork", "c1", "--from", "no_such_step", "--app", CRASHAPP, db=db_url, ledger=ledger)
    assert done.returncode == 1
    assert_one_line_error(done, "never ran step 'no_such_step'")


@pytest.mark.parametrize("verb", [["runs"], ["show", "c1"], ["gc", "--keep-snapshots", "1"]])
def test_a_database_from_a_newer_agentsaga_is_a_one_line_error(db_url, ledger, verb):
    run_crashflow(db_url, ledger)
    raw_sql(db_url, "UPDATE agentsaga_meta SET value = '99' WHERE key = 'schema_version'")
    done = agentsaga(*verb, db=db_url, ledger=ledger)
    assert done.returncode == 1
    assert_one_line_error(done, "database schema version 99 is newer than this agentsaga supports")


def test_bad_gc_arguments_are_usage_errors(sqlite_url):
    assert agentsaga("gc", db=sqlite_url).returncode == 2
    done = agentsaga("gc", "--older-than", "a while", db=sqlite_url)
    assert done.returncode == 2 and "is not a duration" in done.stderr


def test_run_prints_a_progress_line_per_completed_step(sqlite_url, ledger):
    # When a run is driven with --progress
    done = agentsaga("run", CRASHFLOW, "--input", '{"round": 0}', "--progress", db=sqlite_url, ledger=ledger)
    # Then stderr has one line per completed step (13), and the final one says it completed
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len([line for line in lines if " StepCompleted " in line]) == 13
    assert " RunCompleted" in lines[-1]
    # And without it (stderr is not a terminal here) there is none
    quiet = agentsaga("run", CRASHFLOW, "--input", '{"round": 0}', db=sqlite_url, ledger=ledger)
    assert quiet.returncode == 0 and quiet.stderr == ""
