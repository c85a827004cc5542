"""Archive: finished runs older than a duration move out of the database into savepoint files that
``restore`` brings back; unfinished runs are never touched; a SIGKILL mid-archive loses nothing.
SQLite and Postgres."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import agentsaga

from orchestrator import Orchestrator
from store import RunNotFoundError, open_store
from workflows import END, Workflow, reducers

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
DAY = 86400.0


def counter(stop_at: int | None = None) -> Workflow:
    wf = Workflow("archived", reducers={"seen": reducers.append})

    @wf.step(start=True)
    def tick(ctx, state):
        if state["n"] == stop_at:
            raise KeyboardInterrupt
        return {"n": state["n"] + 1, "seen": state["n"]}

    wf.route("tick", lambda s: "tick" if s["n"] < 4 else END)
    return wf


#: the workflow the CLI and the child load with --app
archived = counter()


def exists(url: str, run_id: str) -> bool:
    with open_store(url) as store:
        try:
            store.get_run(run_id)
        except RunNotFoundError:
            return False
    return True


def test_archive_moves_old_finished_runs_to_files_and_restore_brings_one_back(orc_factory, fake_time, tmp_path,
                                                                            db_url):
    # Given two runs finished 31 days ago, an unfinished run as old, and a run finished today
    orc = orc_factory(counter())
    orc.run(orc.workflows.get("archived"), {"n": 0}, run_id="old1")
    orc.run(orc.workflows.get("archived"), {"n": 0}, run_id="old2")
    crashing = counter(stop_at=2)
    with pytest.raises(KeyboardInterrupt):
        orc_factory(crashing).run(crashing, {"n": 0}, run_id="stuck")
    fake_time.advance(31 * DAY)
    orc.run(orc.workflows.get("archived"), {"n": 0}, run_id="new")
    history = orc.history("old1")
    # When runs finished more than 30 days ago are archived
    report = orc.archive(older_than=30 * DAY, to=tmp_path)
    # Then the two old finished runs are in files and no longer in the database
    assert sorted(r["run_id"] for r in report["archived"]) == ["old1", "old2"]
    assert sorted(p.name for p in tmp_path.glob("*.savepoint.json.gz")) == ["old1.savepoint.json.gz",
                                                                           "old2.savepoint.json.gz"]
    assert not exists(db_url, "old1") and not exists(db_url, "old2")
    # And the unfinished run and the recent one are untouched
    assert orc.get_run("stuck").status == "running" and orc.get_run("new").status == "completed"
    # And a file restores the run whole, finished, into any database
    with Orchestrator(f"sqlite:///{tmp_path}/back.db", workflows=[counter()]) as back:
        back.restore(tmp_path / "old1.savepoint.json.gz")
        assert back.result("old1").state == {"n": 4, "seen": [0, 1, 2, 3]}
        assert back.history("old1")[: len(history)] == history and back.get_run("old1").status == "completed"
    # And archiving again finds nothing more to move
    assert orc.archive(older_than=30 * DAY, to=tmp_path)["archived"] == []


def test_archive_refuses_a_missing_directory_and_a_bad_age(orc_factory, tmp_path):
    from orchestrator import ConfigurationError

    orc = orc_factory(counter())
    with pytest.raises(ConfigurationError, match="is not a directory"):
        orc.archive(older_than=0, to=tmp_path / "nowhere")
    with pytest.raises(ConfigurationError, match="older_than must be a number of seconds >= 0"):
        orc.archive(older_than=-1, to=tmp_path)


ARCHIVE_CHILD = '''
import os, signal, sys
sys.path.insert(0, {here!r})
from orchestrator import Orchestrator
orc = Orchestrator(sys.argv[1])
dialect = orc.store._d   # the crash point is inside the store's transaction
real = dialect.execute
def execute(conn, sql, params):
    done = real(conn, sql, params)
    if "DELETE FROM agentsaga_events" in sql:   # the run row is deleted, its journal going: not committed
        os.kill(os.getpid(), signal.SIGKILL)
    return done
dialect.execute = execute
orc.archive(older_than=0, to=sys.argv[2])
'''


def test_sigkill_inside_an_archive_loses_no_run_and_archiving_again_finishes(db_url, tmp_path):
    # Given two finished runs
    with Orchestrator(db_url, workflows=[counter()]) as orc:
        for run_id in ("a1", "a2"):
            orc.run(orc.workflows.get("archived"), {"n": 0}, run_id=run_id)
        before = orc.history("a1")
    out = tmp_path / "archive"
    out.mkdir()
    # When a process archiving them is killed inside the first run's delete
    child = tmp_path / "archive_child.py"
    child.write_text(ARCHIVE_CHILD.format(here=str(HERE)), encoding="utf-8")
    killed = subprocess.run([sys.executable, str(child), db_url, str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Then both runs are still whole in the database; the first is also in its (complete) file
    with Orchestrator(db_url, workflows=[counter()]) as orc:
        assert orc.history("a1") == before and exists(db_url, "a2")
        files = sorted(p.name for p in out.iterdir())
        assert files == ["a1.savepoint.json.gz"]
        # And archiving again finishes the job
        report = orc.archive(older_than=0, to=out)
    assert sorted(r["run_id"] for r in report["archived"]) == ["a1", "a2"]
    assert not exists(db_url, "a1") and not exists(db_url, "a2")
    with Orchestrator(f"sqlite:///{tmp_path}/back.db", workflows=[counter()]) as back:
        for name in ("a1", "a2"):
            back.restore(out / f"{name}.savepoint.json.gz")
        assert back.history("a1")[: len(before)] == before


def test_the_cli_archives_and_restores(sqlite_url, tmp_path):
    with Orchestrator(sqlite_url, workflows=[counter()]) as orc:
        orc.run(orc.workflows.get("archived"), {"n": 0}, run_id="c1")
    out = tmp_path / "cold"
    out.mkdir()
    done = agentsaga("archive", "--older-than", "0s", "--to", str(out), db=sqlite_url)
    assert done.returncode == 0, done.stderr
    assert "archived run c1 (archived, completed)" in done.stdout and "1 run(s) archived" in done.stdout
    assert not exists(sqlite_url, "c1")
    back = agentsaga("restore", str(out / "c1.savepoint.json.gz"), "--app", f"{Path(__file__).resolve()}:archived",
                     db=sqlite_url)
    assert back.returncode == 0, back.stderr
    assert exists(sqlite_url, "c1")


# -- retention per workflow ---------------------------------------------------------------------------
def test_retention_drops_snapshots_of_finished_runs_past_their_workflows_ttl(orc_factory, fake_time):
    from workflows import Snapshots

    # Given a workflow whose finished runs keep snapshots for a week, and one without a ttl
    short = Workflow("short", reducers={"seen": reducers.append}, snapshots=Snapshots(every=2, finished_ttl=7 * DAY))
    plain = Workflow("plain", snapshots=Snapshots(every=2))
    for wf in (short, plain):
        def tick(ctx, state):
            return {"n": state["n"] + 1}
        wf.step(name="tick", start=True)(tick)
        wf.route("tick", lambda s: "tick" if s["n"] < 4 else END)
    crashing = Workflow("short", reducers={"seen": reducers.append}, snapshots=Snapshots(every=2, finished_ttl=0))

    @crashing.step(name="tick", start=True)
    def stop(ctx, state):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        orc_factory(crashing).run(crashing, {"n": 0}, run_id="open")
    orc = orc_factory(short, plain)
    orc.run(short, {"n": 0}, run_id="s1")
    orc.run(plain, {"n": 0}, run_id="p1")
    orc.snapshot("open")
    history = orc.history("s1")
    # When six days pass, nothing is due; after eight, the short-lived run's snapshots go
    fake_time.advance(6 * DAY)
    assert orc.retention() == []
    fake_time.advance(2 * DAY)
    seqs = sorted(s.seq for s in orc.snapshots("s1"))
    assert orc.retention(dry_run=True) == [{"run_id": "s1", "workflow": "short", "status": "completed", "seqs": seqs}]
    assert orc.snapshots("s1") != []
    assert [d["run_id"] for d in orc.retention()] == ["s1"]
    # Then that run has no snapshots left but the same journal and state; the others are untouched
    assert orc.snapshots("s1") == [] and orc.history("s1") == history and orc.result("s1").state["n"] == 4
    assert orc.snapshots("p1") != [] and orc.snapshots("open") != []
