"""Three verbs around moving and recovering runs, through the real console script:

- `restore` refuses a bad savepoint (damaged, tampered, unsigned under a key, or of a workflow not
  registered) before it opens the target: a SQLite file that did not exist is not created;
- `archive --to DIR` makes a missing DIR (the last directory only, as `mkdir DIR`), and says
  "does not exist" or "is not a directory" for what it cannot use;
- `recover` that finds nothing to take says which runs are still leased, until when, and what to do.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import ConfigurationError, Orchestrator
from orchestrator.engine.loader import load_target
from store import open_store

pytestmark = pytest.mark.slow

FLOWS = '''\
from workflows import END, Workflow

counted = Workflow("counted")


@counted.step(start=True)
def only(ctx, state):
    return {"n": state.get("n", 0) + 1}


counted.edge("only", END)
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding the app, ``flows.py``, where the commands run."""
    where = tmp_path / "project"
    where.mkdir()
    (where / "flows.py").write_text(FLOWS, encoding="utf-8")
    return where


def agentsaga(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The console script, run in the project directory as a person would run it."""
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSAGA_")}
    return subprocess.run([found, *args], cwd=project, capture_output=True, text=True, env={**clean, **(env or {})},
                          timeout=120)


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentsaga: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def app(project: Path):
    return load_target(f"{project / 'flows.py'}:counted")


def finished_run(project: Path, url: str, run_id: str = "r1") -> None:
    wf = app(project)
    with Orchestrator(url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id=run_id).status == "completed"


def run_ids(url: str) -> list[str]:
    with open_store(url) as store:
        return sorted(r.run_id for r in store.list_runs(limit=None))


# -- restore -----------------------------------------------------------------------------------------
@pytest.fixture
def savepoint(project: Path, tmp_path: Path) -> Path:
    """A good savepoint file of a finished run 'r1' of flows.py's workflow."""
    source = f"sqlite:///{tmp_path / 'source.db'}"
    finished_run(project, source)
    with Orchestrator(source) as orc:
        return orc.savepoint("r1", name="nightly", path=project / "r1.savepoint.json.gz")


def _rewrite(path: Path, change) -> None:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    change(doc)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


DAMAGE = {
    "not gzip": (lambda p: p.write_bytes(b"garbage"), "does not decompress"),
    "gzip, not JSON": (lambda p: p.write_bytes(gzip.compress(b"garbage")), "its JSON does not parse"),
    "an event edited": (lambda p: _rewrite(p, lambda d: d["events"][0].update(at=0.0)), "hash chain broken at event"),
    "missing": (lambda p: p.unlink(), "cannot read"),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_restoring_a_bad_file_into_a_new_sqlite_database_leaves_no_database_behind(project, savepoint, damage):
    # Given a savepoint file that was damaged
    spoil, said = DAMAGE[damage]
    spoil(savepoint)
    before = sorted(p.name for p in project.iterdir())
    # When it is restored into a SQLite file that does not exist yet
    done = agentsaga(project, "restore", savepoint.name, "--app", "flows.py", "--db", "sqlite:///new.db")
    # Then the command refuses it in one line naming the file and what is wrong
    one_line_error(done, savepoint.name, said)
    # And nothing was left behind: no database file (nor its journal files), nothing else either
    assert sorted(p.name for p in project.iterdir()) == before


def test_restoring_a_file_unsigned_under_a_key_leaves_no_database_behind(project, savepoint):
    # Given an unsigned savepoint, restored where a signing key is configured
    before = sorted(p.name for p in project.iterdir())
    done = agentsaga(project, "restore", savepoint.name, "--app", "flows.py", "--db", "sqlite:///new.db",
                     env={"AGENTSAGA_SIGNING_KEY": "k"})
    # Then it is refused, and no database was created
    one_line_error(done, "is not signed, and a signing key is configured")
    assert sorted(p.name for p in project.iterdir()) == before


@pytest.mark.parametrize("apps", [[], ["--app", "other.py"]], ids=["no app", "another app"])
def test_restoring_a_run_whose_workflow_is_not_registered_leaves_no_database_behind(project, savepoint, apps):
    # Given a good savepoint, and an app that does not define its workflow (or no app at all)
    (project / "other.py").write_text(FLOWS.replace('"counted"', '"other"'), encoding="utf-8")
    before = sorted(p.name for p in project.iterdir())
    # When it is restored into a new SQLite file
    done = agentsaga(project, "restore", savepoint.name, *apps, "--db", "sqlite:///new.db")
    # Then the error names the workflow and what is registered, and no database was created
    registered = "other" if apps else "none"
    one_line_error(done, "workflow 'counted', which is not registered here", f"(registered: {registered})")
    assert sorted(p.name for p in project.iterdir()) == before


def _gzip_bomb(path: Path, mib: int, head: bytes = b"") -> Path:
    """A small gzip file that decompresses to ``mib`` MiB (``head``, then zero bytes)."""
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(head)
        block = b"\0" * (1 << 20)
        for _ in range(mib):
            fh.write(block)
    return path


def test_restoring_a_gzip_bomb_is_refused_at_the_bound_and_leaves_no_database_behind(project):
    # Given a 64 KB file that decompresses to 64 MiB, starting like a savepoint
    bomb = _gzip_bomb(project / "bomb.savepoint.json.gz", 64, b'{"format": "agentsaga-savepoint", "pad": "')
    assert bomb.stat().st_size < 200_000
    before = sorted(p.name for p in project.iterdir())
    # When it is restored with a bound of 1 MiB into a SQLite file that does not exist yet
    done = agentsaga(project, "restore", bomb.name, "--max-size", "1M", "--app", "flows.py", "--db", "sqlite:///new.db")
    # Then it is refused in one line naming the file and the bound, and nothing was left behind
    one_line_error(done, bomb.name, "decompresses to more than 1,048,576 bytes", "refused before anything was written")
    assert sorted(p.name for p in project.iterdir()) == before
    # And a bound that is not a size is a usage error
    bad = agentsaga(project, "restore", bomb.name, "--max-size", "lots", "--db", "sqlite:///new.db")
    assert bad.returncode == 2 and "--max-size 'lots' is not a size" in bad.stderr
    assert sorted(p.name for p in project.iterdir()) == before


def test_a_gzip_bomb_is_read_a_chunk_at_a_time_up_to_the_bound(project, tmp_path):
    import tracemalloc

    from orchestrator import SavepointError

    # Given a file that decompresses to 64 MiB, and a database with the workflow registered
    bomb = _gzip_bomb(tmp_path / "bomb.gz", 64)
    wf = app(project)
    with Orchestrator(f"sqlite:///{tmp_path / 'target.db'}", workflows=[wf]) as orc:
        # When it is restored with a bound of 2 MiB
        tracemalloc.start()
        try:
            with pytest.raises(SavepointError, match="decompresses to more than 2,097,152 bytes"):
                orc.restore(bomb, max_bytes=2 * 1024 * 1024)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # Then it held no more than about the bound in memory, and wrote nothing
        assert peak < 8 * 1024 * 1024
    assert run_ids(f"sqlite:///{tmp_path / 'target.db'}") == []


def test_a_good_file_is_still_restored_into_a_new_sqlite_database(project, savepoint):
    # When a good savepoint is restored into a SQLite file that does not exist yet
    done = agentsaga(project, "restore", savepoint.name, "--app", "flows.py", "--db", "sqlite:///new.db")
    # Then the database is created and holds the run, finished
    assert done.returncode == 0, done.stderr
    assert "restored run r1 (counted, completed)" in done.stdout
    assert run_ids(f"sqlite:///{project / 'new.db'}") == ["r1"]


# -- archive -----------------------------------------------------------------------------------------
def test_archive_makes_a_missing_directory_under_an_existing_one(project, sqlite_url):
    # Given a finished run
    finished_run(project, sqlite_url)
    # When it is archived to a directory that does not exist yet
    done = agentsaga(project, "archive", "--older-than", "0s", "--to", "archive", "--db", sqlite_url)
    # Then the directory is made and said so, and the run moved into it
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "created directory archive"
    assert sorted(p.name for p in (project / "archive").iterdir()) == ["r1.savepoint.json.gz"]
    assert run_ids(sqlite_url) == []


def test_archive_into_an_existing_directory_makes_nothing_and_json_says_whether_it_did(project, sqlite_url):
    # Given a finished run and a directory that exists
    finished_run(project, sqlite_url)
    (project / "kept").mkdir()
    # When it is archived there, and another time to a new directory, with --json
    there = agentsaga(project, "archive", "--older-than", "0s", "--to", "kept", "--db", sqlite_url)
    made = agentsaga(project, "archive", "--older-than", "0s", "--to", "fresh", "--json", "--db", sqlite_url)
    # Then the first made no directory and says none, the second made one and says so
    assert there.returncode == made.returncode == 0, (there.stderr, made.stderr)
    assert "created directory" not in there.stdout and "1 run(s) archived to kept" in there.stdout
    assert json.loads(made.stdout) == {"archived": [], "spared": [], "to": "fresh", "created": True}
    assert (project / "fresh").is_dir()


def test_archive_refuses_a_path_whose_parent_does_not_exist_and_makes_nothing(project, sqlite_url):
    # Given a finished run
    finished_run(project, sqlite_url)
    # When it is archived to a path two directories deep that does not exist
    done = agentsaga(project, "archive", "--older-than", "0s", "--to", "typo/archive", "--db", sqlite_url)
    # Then the error says that it does not exist, nor its parent, and nothing was made or moved
    one_line_error(done, "'typo/archive' does not exist, and neither does its parent 'typo'")
    assert not (project / "typo").exists()
    assert run_ids(sqlite_url) == ["r1"]


def test_archive_to_a_file_says_it_is_not_a_directory(project, sqlite_url):
    # Given a finished run and a file where the directory should be
    finished_run(project, sqlite_url)
    (project / "afile").write_text("x", encoding="utf-8")
    # When it is archived there
    done = agentsaga(project, "archive", "--older-than", "0s", "--to", "afile", "--db", sqlite_url)
    # Then the error says it is not a directory, and the run stays
    line = one_line_error(done, "'afile' is not a directory")
    assert "does not exist" not in line
    assert run_ids(sqlite_url) == ["r1"]


def test_the_library_says_a_missing_directory_does_not_exist(project, sqlite_url, tmp_path):
    # Given an Orchestrator, and a directory that does not exist
    with Orchestrator(sqlite_url, workflows=[app(project)]) as orc:
        # When it is asked to archive there, then it says so (and makes nothing: the CLI does that)
        with pytest.raises(ConfigurationError, match="'.*nowhere' is not a directory: it does not exist"):
            orc.archive(older_than=0, to=tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


# -- recover -----------------------------------------------------------------------------------------
def leased(project: Path, url: str, run_id: str, owner: str, ttl: float) -> float:
    """A running run of flows.py's workflow whose lease ``owner`` holds for ``ttl`` more seconds;
    when the lease expires."""
    wf = app(project)
    with Orchestrator(url, workflows=[wf]) as orc:
        orc.start(wf, {}, run_id=run_id)
        orc.store.leases.acquire(run_id, owner=owner, ttl=ttl, now=time.time(), status="running")
        return orc.store.get_run(run_id).lease_expires_at


def utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def commands(line: str) -> list[list[str]]:
    """The commands a line names between backquotes, split as a shell would split them."""
    return [shlex.split(c) for c in re.findall(r"`([^`]+)`", line)]


def test_recover_says_which_run_is_still_leased_and_until_when(project, db_url):
    # Given a run another machine's process drives, its lease good for ten more minutes
    until = leased(project, db_url, "h1", owner="elsewhere:4242:abc", ttl=600)
    # When recover runs
    done = agentsaga(project, "recover", "--app", "flows.py", "--db", db_url)
    # Then it recovers nothing, and says which run is leased, until when, and that its owner may be alive
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith(f"no interrupted runs to recover now; 1 run (h1) is still leased until {utc(until)} (in ")
    assert int(re.search(r"\(in (\d+)s\)", line).group(1)) in range(500, 601)
    assert "its owner may be alive" in line
    # And it names the commands for later and for now, with this invocation's app and database
    assert commands(line) == [["agentsaga", "recover", "--app", "flows.py", "--db", db_url],
                              ["agentsaga", "resume", "h1", "--app", "flows.py", "--db", db_url]]
    # And the run is untouched: still leased by its owner
    with open_store(db_url) as store:
        rec = store.get_run("h1")
    assert (rec.status, rec.lease_owner) == ("running", "elsewhere:4242:abc")


def test_the_resume_command_recover_names_takes_the_run_over_as_printed(project, db_url):
    # Given recover's message about a leased run
    leased(project, db_url, "h1", owner="elsewhere:4242:abc", ttl=600)
    line = agentsaga(project, "recover", "--app", "flows.py", "--db", db_url).stdout
    resume = commands(line)[-1]
    # When the resume command it names is run as printed
    done = agentsaga(project, *resume[1:])
    # Then the run is taken over and finished
    assert done.returncode == 0, done.stderr
    with open_store(db_url) as store:
        assert store.get_run("h1").status == "completed"


def test_recover_says_when_a_leased_runs_owner_is_gone_from_this_machine(project, db_url):
    # Given a run leased by a process of this machine that has exited (as after a SIGKILL)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    owner = f"{socket.gethostname()}:{gone.pid}:dead"
    leased(project, db_url, "k1", owner=owner, ttl=600)
    # When recover runs
    done = agentsaga(project, "recover", "--app", "flows.py", "--db", db_url)
    # Then it says the owner is gone and names the command that takes the run over now
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith("no interrupted runs to recover now; 1 run (k1) is still leased until ")
    assert f"its owner {owner!r} is no longer running on this machine; take the run over now with" in line
    assert commands(line) == [["agentsaga", "resume", "k1", "--app", "flows.py", "--db", db_url]]


def test_recover_counts_several_leased_runs_and_names_the_first_lease_to_end(project, db_url):
    # Given three runs leased by another machine, ending in 10, 5 and 15 minutes
    leased(project, db_url, "a", owner="elsewhere:1:x", ttl=600)
    first = leased(project, db_url, "b", owner="elsewhere:1:x", ttl=300)
    leased(project, db_url, "c", owner="elsewhere:1:x", ttl=900)
    # When recover runs
    done = agentsaga(project, "recover", "--app", "flows.py", "--db", db_url)
    # Then it counts them, soonest lease first, and names when the first ends
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith(f"no interrupted runs to recover now; 3 runs (b, a, c) are still leased, "
                           f"the first until {utc(first)} (in ")
    assert "their owners may be alive" in line
    assert commands(line)[1] == ["agentsaga", "resume", "RUN", "--app", "flows.py", "--db", db_url]
    # And --json still prints only what was recovered: nothing
    as_json = agentsaga(project, "recover", "--app", "flows.py", "--json", "--db", db_url)
    assert as_json.returncode == 0 and as_json.stdout == "", as_json.stderr


def test_recover_with_no_unfinished_runs_says_there_is_nothing_to_recover(project, db_url):
    # Given only a finished run
    finished_run(project, db_url)
    # When recover runs, then it says there is nothing to recover
    done = agentsaga(project, "recover", "--app", "flows.py", "--db", db_url)
    assert (done.returncode, done.stdout) == (0, "no interrupted runs to recover\n"), done.stderr


def test_a_savepoints_default_file_stays_in_the_working_directory_whatever_the_run_id(project, tmp_path):
    # Given finished runs whose ids hold path separators
    source = f"sqlite:///{tmp_path / 'source.db'}"
    finished_run(project, source, run_id="../escape")
    finished_run(project, source, run_id="sub/dir")
    outside = sorted(p.name for p in project.parent.iterdir())
    # When each is saved without --out, under a name holding a separator too
    for run_id in ("../escape", "sub/dir"):
        done = agentsaga(project, "savepoint", run_id, "--name", "v/1", "--db", source)
        assert done.returncode == 0, done.stderr
    # Then both files are in the working directory, named with the id and name URL-quoted,
    # and nothing was written beside it
    assert sorted(p.name for p in project.glob("*.savepoint.json.gz")) == [
        "..%2Fescape.v%2F1.savepoint.json.gz", "sub%2Fdir.v%2F1.savepoint.json.gz"]
    assert sorted(p.name for p in project.parent.iterdir()) == outside
    # And each restores as the run it holds
    done = agentsaga(project, "restore", "..%2Fescape.v%2F1.savepoint.json.gz", "--app", "flows.py",
                     "--db", "sqlite:///new.db")
    assert done.returncode == 0, done.stderr
    assert run_ids(f"sqlite:///{project / 'new.db'}") == ["../escape"]
