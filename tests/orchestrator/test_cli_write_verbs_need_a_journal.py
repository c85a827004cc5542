"""The verbs that work on a run that must already exist (resume, signal, cancel, compensate,
rollback, retry, fork) never make a database out of a mistyped ``--db``, through the real console
script: pointed at a SQLite file that does not exist, at an empty one, at a new Postgres schema or
at another application's database, they fail with one line naming the database and saying it holds
no agentsaga journal (or does not exist), exit 1, and leave it exactly as it was: no file, no
tables. The verbs that start runs (``run``) still create the database, and a database that needs
a migration is migrated by a driving verb, not refused.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import AUDITFLOW, ROOT, agentsaga, assert_one_line_error, load, raw_sql  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402

pytestmark = pytest.mark.slow

WRITE_VERBS = [
    ["resume", "r1"], ["signal", "r1", "go"], ["signal", "r1", "go", "--resume"], ["cancel", "r1"],
    ["compensate", "r1"], ["rollback", "r1", "--to", "1"], ["retry", "r1"], ["fork", "r1", "--from", "plan"],
]
VERB_IDS = ["resume", "signal", "signal-resume", "cancel", "compensate", "rollback", "retry", "fork"]
NO_JOURNAL = "holds no agentsaga journal (it has no agentsaga tables: not an agentsaga database, or a mistyped --db)"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The installed console script, run in ``cwd`` without AGENTSAGA_DB or an app in the environment."""
    exe = Path(sys.executable).parent / "agentsaga"
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSAGA_DB", "AGENTSAGA_APP")}
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def tables(url: str) -> list[str]:
    if url.startswith("sqlite"):
        return [r[0] for r in raw_sql(url, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return [r[0] for r in raw_sql(url, "SELECT table_name FROM information_schema.tables"
                                        " WHERE table_schema = current_schema() ORDER BY table_name")]


@pytest.fixture
def empty(db_url: str) -> str:
    """An empty database: a 0-byte SQLite file, or a new Postgres schema."""
    if db_url.startswith("sqlite"):
        Path(db_url.split("sqlite:///", 1)[1]).write_bytes(b"")
    return db_url


@pytest.mark.parametrize("verb", WRITE_VERBS, ids=VERB_IDS)
def test_a_write_verb_on_an_empty_database_names_it_and_creates_no_tables(empty, tmp_path, verb):
    # Given an empty database (a 0-byte SQLite file, or a new Postgres schema)
    work = tmp_path / "work"
    work.mkdir()
    # When a verb that works on an existing run is pointed at it
    done = cli(*verb, "--db", empty, cwd=work)
    # Then it fails with one line naming the run and the database, and saying it holds no journal
    assert done.returncode == 1, done.stdout
    assert_one_line_error(done, f"no run 'r1': {empty} {NO_JOURNAL}", "nothing was created in it",
                          "--db URL or set AGENTSAGA_DB")
    # And the database is still empty: no tables, and on SQLite a 0-byte file with nothing beside it
    assert tables(empty) == []
    if empty.startswith("sqlite"):
        path = Path(empty.split("sqlite:///", 1)[1])
        assert path.stat().st_size == 0
        assert sorted(p.name for p in path.parent.iterdir()) == [path.name, "work"]
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("verb", WRITE_VERBS, ids=VERB_IDS)
def test_a_write_verb_on_a_sqlite_file_that_does_not_exist_names_it_and_creates_none(tmp_path, verb):
    # Given a --db naming a file that does not exist
    missing = tmp_path / "mistyped.db"
    # When a verb that works on an existing run is pointed at it
    done = cli(*verb, "--db", f"sqlite:///{missing}", cwd=tmp_path)
    # Then it fails with one line naming the file it looked for, and creates none
    assert done.returncode == 1, done.stdout
    assert_one_line_error(done, f"no run 'r1': no database at {str(missing)!r}")
    assert list(tmp_path.iterdir()) == []


def test_a_write_verb_leaves_another_applications_database_as_it_was(db_url, tmp_path):
    # Given another application's database: one table, none of agentsaga's
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.split("sqlite:///", 1)[1])
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
        conn.commit()
        conn.close()
    else:
        raw_sql(db_url, "CREATE TABLE users (id INTEGER PRIMARY KEY)")
    # When a run is resumed in it
    done = cli("resume", "r1", "--db", db_url, cwd=tmp_path)
    # Then it is refused naming the database, and the database has only its own table
    assert done.returncode == 1, done.stdout
    assert_one_line_error(done, f"no run 'r1': {db_url} {NO_JOURNAL}")
    assert tables(db_url) == ["users"]


def test_run_still_creates_the_database_it_is_pointed_at(db_url, tmp_path):
    # Given an empty database (on SQLite, no file at all)
    # When a run is started in it
    done = agentsaga("run", AUDITFLOW, "--input", "{}", "--run-id", "r1", db=db_url)
    # Then the schema is created and the run is in it
    assert done.returncode == 0, done.stderr
    assert "agentsaga_runs" in tables(db_url)
    assert raw_sql(db_url, "SELECT status FROM agentsaga_runs WHERE run_id = 'r1'") == [("completed",)]


def test_a_write_verb_migrates_a_database_that_needs_it_rather_than_refusing_it(db_url):
    # Given a run waiting to be driven in a database at schema version 2 (the columns version 3 added
    # to snapshots dropped, and its version row saying 2)
    wf = load(AUDITFLOW)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        orc.start(wf, {}, run_id="r1")
    for column in ("kind", "base_seq", "base_sha256", "root_seq", "signature"):
        raw_sql(db_url, f"ALTER TABLE agentsaga_snapshots DROP COLUMN {column}")
    raw_sql(db_url, "UPDATE agentsaga_meta SET value = '2' WHERE key = 'schema_version'")
    # When the run is cancelled from the command line
    done = agentsaga("cancel", "r1", "--app", str(ROOT / AUDITFLOW), db=db_url)
    # Then the database was migrated and the run cancelled
    assert done.returncode == 0, done.stderr
    assert raw_sql(db_url, "SELECT value FROM agentsaga_meta WHERE key = 'schema_version'") == [("3",)]
    assert raw_sql(db_url, "SELECT status FROM agentsaga_runs WHERE run_id = 'r1'") == [("cancelled",)]
