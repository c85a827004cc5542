"""The reading verbs never create or change a schema (invariant 10), through the real console script.

`show`, `history`, `verify`, `report`, `snapshots`, `gc`, `savepoint` and `archive` open the store
with `create=False`: on a database that is not an agentsaga database (another application's, an
empty file, a new Postgres schema), or one that needs a migration, they fail with one line naming
the database, and the database is exactly what it was: same bytes and files on SQLite, same tables
on Postgres. Count and seq flags outside what a database can bind are usage errors (exit 2).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import assert_one_line_error, raw_sql  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from workflows import Workflow  # noqa: E402

pytestmark = pytest.mark.slow

NOT_AGENTSAGA = "holds no agentsaga tables: not an agentsaga database, or none was written yet"
CREATES = ("the first open that may write does: Orchestrator(url) or open_store(url) in Python, or a verb "
           "that drives runs: agentsaga run, enqueue, recover or worker")
TOP = str(2**63 - 1)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The installed console script, run in `cwd` without AGENTSAGA_DB or an app in the environment."""
    exe = Path(sys.executable).parent / "agentsaga"
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSAGA_DB", "AGENTSAGA_APP")}
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def reading_verbs(out: Path) -> list[list[str]]:
    """Every reading verb, each writing what it writes (a report, a savepoint, archives) under `out`."""
    return [
        ["show", "r1"], ["history", "r1"], ["verify", "r1"], ["verify", "r1", "--no-mark"],
        ["report", "r1", "--html", str(out / "r1.html")], ["snapshots", "r1"],
        ["snapshots", "r1", "--quarantine", "1", "--reason", "x"],
        ["gc", "--keep-snapshots", "0", "--dry-run"], ["gc", "--older-than", "1s"],
        ["savepoint", "r1", "--name", "n", "--out", str(out / "r1.sp")],
        ["archive", "--older-than", "1s", "--to", str(out / "archive")],
    ]


VERB_IDS = ["show", "history", "verify", "verify-no-mark", "report", "snapshots", "quarantine", "gc-dry-run", "gc",
            "savepoint", "archive"]


def _tables(url: str) -> list[str]:
    if url.startswith("sqlite"):
        return [r[0] for r in raw_sql(url, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return [r[0] for r in raw_sql(url, "SELECT table_name FROM information_schema.tables"
                                        " WHERE table_schema = current_schema() ORDER BY table_name")]


def footprint(url: str) -> object:
    """SQLite: the file's bytes and the names of the files beside it; Postgres: the schema's tables."""
    if url.startswith("sqlite"):
        path = Path(url.split("sqlite:///", 1)[1])
        return sorted(p.name for p in path.parent.iterdir()), hashlib.sha256(path.read_bytes()).hexdigest()
    return _tables(url)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    made = tmp_path / "out"
    made.mkdir()
    return made


@pytest.fixture
def foreign(db_url: str) -> str:
    """`db_url` holding one table of another application, and nothing of agentsaga's."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.split("sqlite:///", 1)[1])
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
        conn.commit()
        conn.close()
    else:
        raw_sql(db_url, "CREATE TABLE users (id INTEGER PRIMARY KEY)")
    return db_url


def _one_run(url: str) -> None:
    wf = Workflow("reading")

    @wf.step(start=True)
    def only(ctx, state):
        return {"done": True}

    with Orchestrator(url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="r1").status == "completed"


@pytest.mark.parametrize("verb", range(len(VERB_IDS)), ids=VERB_IDS)
def test_a_reading_verb_refuses_another_applications_database_and_changes_nothing(foreign, out, verb):
    # Given another application's database (one table, no agentsaga tables)
    args = reading_verbs(out)[verb]
    before = footprint(foreign)
    # When a reading verb is pointed at it
    done = cli(*args, "--db", foreign, cwd=out)
    # Then it fails with one line naming the database and what creates a schema, exit 1
    assert done.returncode == 1, done.stdout
    assert_one_line_error(done, f"{foreign} {NOT_AGENTSAGA}", CREATES)
    # And the database is exactly what it was, and the verb wrote no file of its own either
    assert footprint(foreign) == before
    assert _tables(foreign) == ["users"]
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("verb", range(len(VERB_IDS)), ids=VERB_IDS)
def test_a_reading_verb_leaves_an_empty_sqlite_file_empty(tmp_path, out, verb):
    # Given a 0-byte file
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    # When a reading verb is pointed at it
    done = cli(*reading_verbs(out)[verb], "--db", f"sqlite:///{empty}", cwd=out)
    # Then it is refused, and the file is still 0 bytes with nothing beside it
    assert done.returncode == 1
    assert_one_line_error(done, f"sqlite:///{empty} {NOT_AGENTSAGA}")
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "out"]
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("args", [["runs"], ["stats"]], ids=["runs", "stats"])
def test_runs_and_stats_refuse_another_applications_database_too(foreign, out, args):
    before = footprint(foreign)
    done = cli(*args, "--db", foreign, cwd=out)
    assert done.returncode == 1
    assert_one_line_error(done, f"{foreign} {NOT_AGENTSAGA}")
    assert footprint(foreign) == before


def test_a_database_that_needs_a_migration_is_refused_naming_what_migrates_it(db_url, out):
    # Given an agentsaga database whose version row says an older schema
    _one_run(db_url)
    raw_sql(db_url, "UPDATE agentsaga_meta SET value = '2' WHERE key = 'schema_version'")
    before = footprint(db_url)
    # When a reading verb reads it
    done = cli("show", "r1", "--db", db_url, cwd=out)
    # Then it is refused naming the database and the verbs that migrate it, and nothing was migrated
    assert done.returncode == 1
    assert_one_line_error(done, f"{db_url} has schema version 2 and this agentsaga reads version 3",
                          "agentsaga run, enqueue, resume, recover or worker")
    assert raw_sql(db_url, "SELECT value FROM agentsaga_meta WHERE key = 'schema_version'") == [("2",)]
    assert footprint(db_url) == before


def test_a_database_from_a_newer_agentsaga_is_named(db_url, out):
    # Given a database a newer agentsaga wrote (on Postgres, reached with a password in the URL)
    _one_run(db_url)
    raw_sql(db_url, "UPDATE agentsaga_meta SET value = '99' WHERE key = 'schema_version'")
    url = db_url if db_url.startswith("sqlite") else "postgresql://postgres:pw123@" + db_url.split("@", 1)[1]
    # When it is read
    done = cli("history", "r1", "--db", url, cwd=out)
    # Then the one line names the versions and the database, password masked
    assert done.returncode == 1
    assert_one_line_error(done, "database schema version 99 is newer than this agentsaga supports (3)",
                          url.replace("pw123", "***"))
    assert "pw123" not in done.stderr


@pytest.mark.parametrize("args", [["runs"], ["show", "r1"], ["history", "r1"]], ids=["runs", "show", "history"])
def test_a_schema_missing_a_column_is_named_in_one_line_not_a_driver_error(db_url, out, args):
    # Given an agentsaga database whose runs table lost a column behind agentsaga's back (an older
    # or hand-edited schema under a current version row), reached on Postgres with a password
    _one_run(db_url)
    raw_sql(db_url, "ALTER TABLE agentsaga_runs DROP COLUMN recoveries")
    url = db_url if db_url.startswith("sqlite") else "postgresql://postgres:pw123@" + db_url.split("@", 1)[1]
    # When a reading verb reads it
    done = cli(*args, "--db", url, cwd=out)
    # Then one line names the database (password masked), the missing column and what to do
    assert done.returncode == 1
    assert_one_line_error(done, f"{url.replace('pw123', '***')} lacks part of the agentsaga schema (version 3)",
                          "recoveries", "restore the database from a backup, or use another one")
    assert "pw123" not in done.stderr
    assert "OperationalError" not in done.stderr and "UndefinedColumn" not in done.stderr


def test_a_deleted_version_row_is_damage_and_a_reading_verb_does_not_stamp_it(db_url, out):
    # Given an agentsaga database whose version row was deleted
    _one_run(db_url)
    raw_sql(db_url, "DELETE FROM agentsaga_meta")
    before = footprint(db_url)
    # When a reading verb reads it
    done = cli("verify", "r1", "--db", db_url, cwd=out)
    # Then it says the database is damaged, and writes no version row
    assert done.returncode == 1
    assert_one_line_error(done, f"{db_url} is damaged: it holds agentsaga tables but no schema version")
    assert raw_sql(db_url, "SELECT key, value FROM agentsaga_meta") == []
    assert footprint(db_url) == before


def test_an_agentsaga_database_is_read_and_left_byte_for_byte_as_it_was(db_url, out):
    # Given an agentsaga database with a completed run
    _one_run(db_url)
    before = footprint(db_url)
    # When it is read by show, history (with the largest seqs a database binds) and verify --no-mark
    shown = cli("show", "r1", "--db", db_url, cwd=out)
    history = cli("history", "r1", "--after", "0", "--until", TOP, "--db", db_url, cwd=out)
    verified = cli("verify", "r1", "--no-mark", "--db", db_url, cwd=out)
    # Then each works, and the database is unchanged
    assert shown.returncode == 0 and "run r1  completed" in shown.stdout, shown.stderr
    assert history.returncode == 0 and "RunCompleted" in history.stdout, history.stderr
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert footprint(db_url) == before
    # And an offset past every run is an empty page, not an error
    paged = cli("runs", "--limit", TOP, "--offset", TOP, "--db", db_url, cwd=out)
    assert (paged.returncode, paged.stdout.strip()) == (0, "no runs"), paged.stderr


def test_an_empty_db_flag_is_a_usage_error_not_the_default_file(tmp_path):
    # Given a directory holding the default database file
    _one_run(f"sqlite:///{tmp_path}/agentsaga.db")
    for args in (["show", "r1", "--db", ""], ["--db", " ", "resume", "r1"]):
        # When a verb is given an empty --db (before or after the verb)
        done = cli(*args, cwd=tmp_path)
        # Then it is a usage error about --db (argparse's, with the usage line), not ./agentsaga.db
        assert done.returncode == 2
        assert "error: argument --db: is empty: give a database URL" in done.stderr
        assert "Traceback" not in done.stderr and "r1" not in done.stdout


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_database_has_nothing_to_read(tmp_path, url):
    done = cli("history", "r1", "--db", url, cwd=tmp_path)
    assert done.returncode == 1
    assert_one_line_error(done, f"{url} is an in-memory database", "nothing in it to read")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "flag", "allowed"), [
    (["runs", "--limit", "99999999999999999999"], "--limit", "1..2**63-1"),
    (["runs", "--limit", "-1"], "--limit", "1..2**63-1"),
    (["runs", "--limit", "0"], "--limit", "1..2**63-1"),
    (["runs", "--offset", "-5"], "--offset", "0..2**63-1"),
    (["runs", "--offset", str(2**63)], "--offset", "0..2**63-1"),
    (["history", "r1", "--until", "99999999999999999999999"], "--until", "0..2**63-1"),
    (["history", "r1", "--after", "-1"], "--after", "0..2**63-1"),
    (["show", "r1", "--steps", "-1"], "--steps", "0..2**63-1"),
    (["snapshots", "r1", "--quarantine", str(2**64), "--reason", "x"], "--quarantine", "1..2**63-1"),
    (["gc", "--keep-snapshots", str(2**63)], "--keep-snapshots", "0..2**63-1"),
    (["runs", "--limit", "ten"], "--limit", "1..2**63-1"),
], ids=["limit-huge", "limit-negative", "limit-zero", "offset-negative", "offset-huge", "until-huge",
        "after-negative", "steps-negative", "quarantine-huge", "keep-snapshots-huge", "limit-not-a-number"])
def test_count_and_seq_flags_out_of_range_are_usage_errors(tmp_path, args, flag, allowed):
    # When a count or seq flag is outside what a database can bind
    done = cli(*args, cwd=tmp_path)
    # Then argparse refuses it (exit 2) naming the flag and the range, before any database is opened
    assert done.returncode == 2, done.stdout
    assert f"error: argument {flag}: " in done.stderr and allowed in done.stderr
    assert "Traceback" not in done.stderr and "OverflowError" not in done.stderr
    assert list(tmp_path.iterdir()) == []
