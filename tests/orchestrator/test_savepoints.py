"""Savepoints: a run written to a portable file and brought into another database, where it
resumes as if it had never moved; damaged, tampered, newer, unsigned or foreign files refused with
nothing written. Real SQLite and Postgres; a real SIGKILL inside a restore."""

from __future__ import annotations

import gzip
import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import agentsaga, assert_one_line_error

from orchestrator import Orchestrator, SavepointError
from orchestrator.engine.savepoints import read_savepoint
from store import RunNotFoundError, open_store
from workflows import END, Workflow, reducers

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def counter(limit: int = 12, *, stop_at: int | None = None, name: str = "mover") -> Workflow:
    """Counts to ``limit``, remembering every count it ran; "dies" (KeyboardInterrupt) at ``stop_at``."""
    wf = Workflow(name, reducers={"seen": reducers.append})

    @wf.step(start=True)
    def tick(ctx, state):
        if state["n"] == stop_at:
            raise KeyboardInterrupt
        return {"n": state["n"] + 1, "seen": state["n"]}

    wf.route("tick", lambda s: "tick" if s["n"] < limit else END)
    return wf


def interrupted_on(url: str, run_id: str, stop_at: int, **options) -> None:
    with Orchestrator(url, workflows=[counter(stop_at=stop_at)], snapshot_every=3, **options) as orc, \
            pytest.raises(KeyboardInterrupt):
        orc.run(orc.workflows.get("mover"), {"n": 0}, run_id=run_id)


def rewrite(path: Path, change) -> None:
    """Decompress the file, let ``change(doc)`` edit it, compress it back (no chain recomputed)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    change(doc)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def nothing_in(url: str, run_id: str) -> bool:
    with open_store(url) as store:
        try:
            store.get_run(run_id)
        except RunNotFoundError:
            return True
    return False


# -- the move ----------------------------------------------------------------------------------------
def test_a_savepoint_moves_sqlite_to_postgres_to_sqlite_and_resumes_as_if_it_never_moved(sqlite_url, pg_url,
                                                                                       tmp_path):
    # Given a run interrupted at count 4 on SQLite
    interrupted_on(sqlite_url, "trip", stop_at=4)
    first = tmp_path / "one.savepoint.json.gz"
    with Orchestrator(sqlite_url) as source:
        source.savepoint("trip", name="before-move", path=first)
        source_history = source.history("trip")
    # When it is restored into Postgres, resumed there until it is interrupted at count 8
    with Orchestrator(pg_url, workflows=[counter(stop_at=8)], snapshot_every=3) as pg:
        assert pg.restore(first) == "trip"
        assert pg.get_run("trip").status == "pending"
        moved = pg.history("trip")
        with pytest.raises(KeyboardInterrupt):
            pg.resume("trip")
        second = tmp_path / "two.savepoint.json.gz"
        pg.savepoint("trip", name="back", path=second)
    # And brought back into a fresh SQLite database and resumed to the end
    back_url = f"sqlite:///{tmp_path}/back.db"
    with Orchestrator(back_url, workflows=[counter()]) as back:
        back.restore(second)
        result = back.resume("trip")
        history = back.history("trip")
    # Then it ends as an uninterrupted run would, every count run exactly once
    assert result.status == "completed"
    assert result.state == {"n": 12, "seen": list(range(12))}
    # And the journal it carried is the source's, byte for byte, followed by the Restored events
    assert moved[:len(source_history)] == source_history
    restored = [e["data"] for e in history if e["kind"] == "Restored"]
    assert [r["savepoint"] for r in restored] == ["before-move", "back"]
    # And the second resume started from the snapshot the savepoint carried, not from seq 0
    resumed = [e["data"] for e in history if e["kind"] == "Resumed"][-1]
    assert resumed["snapshot_seq"] > 0 and resumed["snapshot_seq"] == restored[-1]["snapshot_seq"]
    # And the moved journal verifies in its new home
    with Orchestrator(back_url, workflows=[counter()]) as back:
        assert back.verify("trip").ok


def test_a_finished_run_restores_finished(sqlite_url, pg_url, tmp_path):
    with Orchestrator(sqlite_url, workflows=[counter(limit=3)]) as orc:
        orc.run(orc.workflows.get("mover"), {"n": 0}, run_id="done")
        orc.savepoint("done", name="final", path=tmp_path / "f.gz")
        original = orc.get_run("done")
    with Orchestrator(pg_url, workflows=[counter(limit=3)]) as pg:
        pg.restore(tmp_path / "f.gz")
        row = pg.get_run("done")
        assert (row.status, row.finished_at, row.created_at) == ("completed", original.finished_at, original.created_at)
        assert pg.result("done").state == {"n": 3, "seen": [0, 1, 2]}


# -- refused files -------------------------------------------------------------------------------------
@pytest.fixture
def source_url(tmp_path) -> str:
    """A SQLite database apart from the target (``db_url``) a test restores into."""
    return f"sqlite:///{tmp_path}/source.db"


@pytest.fixture
def saved(source_url, tmp_path) -> Path:
    interrupted_on(source_url, "sp", stop_at=5)
    path = tmp_path / "sp.savepoint.json.gz"
    with Orchestrator(source_url) as orc:
        orc.savepoint("sp", name="x", path=path)
    return path


def refused(db_url: str, path: Path, *needles: str, key: str | None = None) -> None:
    with Orchestrator(db_url, workflows=[counter()], signing_key=key) as orc, \
            pytest.raises(SavepointError) as info:
        orc.restore(path)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert nothing_in(db_url, "sp")


def test_an_edited_event_is_refused_naming_its_seq(saved, db_url):
    rewrite(saved, lambda d: d["events"][3].update(data=d["events"][3]["data"].replace('"n"', '"m"')))
    refused(db_url, saved, "hash chain broken at event seq 4")


def test_an_edited_header_is_refused_naming_the_header(saved, db_url):
    rewrite(saved, lambda d: d["run"].update(workflow="other"))
    refused(db_url, saved, "hash chain broken at the header")


def test_a_truncated_file_and_removed_events_are_refused(saved, db_url, tmp_path):
    cut = tmp_path / "cut.gz"
    cut.write_bytes(saved.read_bytes()[: len(saved.read_bytes()) // 2])
    refused(db_url, cut, "truncated")
    rewrite(saved, lambda d: d["events"].pop())
    refused(db_url, saved, "but its header says", "truncated or events were removed")


def test_a_newer_format_and_a_foreign_file_are_refused(saved, db_url, tmp_path):
    rewrite(saved, lambda d: d.update(format_version=3))
    refused(db_url, saved, "format version 3", "reads versions 1 to 2")
    other = tmp_path / "other.gz"
    other.write_bytes(gzip.compress(b'{"hello": 1}'))
    refused(db_url, other, "not an agentsaga savepoint")


def test_a_run_of_an_unregistered_workflow_or_an_existing_run_is_refused(saved, db_url, source_url):
    with Orchestrator(db_url, workflows=[counter(name="someone-else")]) as orc, pytest.raises(SavepointError) as info:
        orc.restore(saved)
    assert "workflow 'mover', which is not registered here (registered: someone-else)" in str(info.value)
    assert nothing_in(db_url, "sp")
    with Orchestrator(source_url, workflows=[counter()]) as same, pytest.raises(SavepointError, match="already exists"):
        same.restore(saved)


def test_with_a_key_savepoints_are_signed_and_unsigned_or_forged_ones_refused(source_url, db_url, tmp_path):
    # Given a run, saved once without a key and once with one
    interrupted_on(source_url, "sp", stop_at=5)
    plain, signed = tmp_path / "plain.gz", tmp_path / "signed.gz"
    with Orchestrator(source_url) as orc:
        orc.savepoint("sp", name="p", path=plain)
    with Orchestrator(source_url, signing_key="k1") as orc:
        orc.savepoint("sp", name="s", path=signed)
    # Then under the key the unsigned one is refused, and one signed with another key too
    refused(db_url, plain, "is not signed, and a signing key is configured", key="k1")
    refused(db_url, signed, "signature does not match", key="k2")

    # And an edit whose whole chain was recomputed (a hash detects accidents, not intent) is refused
    def forge(doc):
        doc["events"][2]["data"] = doc["events"][2]["data"].replace("tick", "tock")
        link = doc["events"][1]["link"]
        for event in doc["events"][2:]:
            body = {k: event[k] for k in ("seq", "kind", "at", "data")}
            text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
            link = event["link"] = hashlib.sha256(link.encode() + text).hexdigest()
        doc["head"] = link

    forged = tmp_path / "forged.gz"
    forged.write_bytes(signed.read_bytes())
    rewrite(forged, forge)
    with Orchestrator(db_url, workflows=[counter()]) as keyless:
        keyless.restore(forged)  # without a key, a consistent chain is all there is to check
        keyless.store.delete_runs(["sp"])
    refused(db_url, forged, "signature does not match", key="k1")
    # And the genuine signed file restores under its key
    with Orchestrator(db_url, workflows=[counter()], signing_key="k1") as orc:
        assert orc.restore(signed) == "sp"


# -- through the CLI, and a SIGKILL inside the restore ------------------------------------------------
RESTORE_CHILD = '''
import os, signal, sys
sys.path.insert(0, {here!r})
from test_savepoints import counter
from orchestrator import Orchestrator
orc = Orchestrator(sys.argv[1], workflows=[counter()])
dialect = orc.store._d   # the crash point is inside the store's transaction
real = dialect.execute
def execute(conn, sql, params):
    done = real(conn, sql, params)
    if sql.startswith("INSERT INTO agentsaga_snapshots"):   # run row and events are in, not committed
        os.kill(os.getpid(), signal.SIGKILL)
    return done
dialect.execute = execute
orc.restore(sys.argv[2])
'''


def test_sigkill_inside_a_restore_leaves_nothing_and_the_restore_can_be_run_again(saved, db_url, tmp_path):
    # Given a process restoring the savepoint, killed after the run row and journal were inserted
    child = tmp_path / "restore_child.py"
    child.write_text(RESTORE_CHILD.format(here=str(HERE)), encoding="utf-8")
    killed = subprocess.run([sys.executable, str(child), db_url, str(saved)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Then the target holds nothing of the run
    assert nothing_in(db_url, "sp")
    # And restoring again brings it in whole, and it resumes to the end
    with Orchestrator(db_url, workflows=[counter()]) as orc:
        orc.restore(saved)
        assert orc.resume("sp").state == {"n": 12, "seen": list(range(12))}


def test_the_cli_saves_restores_and_refuses_with_one_line(sqlite_url, pg_url, tmp_path):
    # Given a run interrupted on SQLite, of a workflow the CLI can load from this file
    interrupted_on(sqlite_url, "sp", stop_at=5)
    out = tmp_path / "cli.gz"
    app = f"{Path(__file__).resolve()}:mover"
    # When `agentsaga savepoint` writes it and `agentsaga restore` brings it into Postgres
    saved = agentsaga("savepoint", "sp", "--name", "nightly", "--out", str(out), db=sqlite_url)
    assert saved.returncode == 0, saved.stderr
    assert "wrote savepoint nightly of run sp" in saved.stdout and out.exists()
    done = agentsaga("restore", str(out), "--app", app, db=pg_url)
    assert done.returncode == 0, done.stderr
    assert "restored run sp (mover, pending)" in done.stdout and "agentsaga resume sp" in done.stdout
    # Then `agentsaga resume` there finishes it
    resumed = agentsaga("resume", "sp", "--app", app, "--json", db=pg_url)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == {"n": 12, "seen": list(range(12))}
    # And a second restore, a tampered file, or one without its app are one-line errors
    assert_one_line_error(agentsaga("restore", str(out), "--app", app, db=pg_url), "already exists")
    rewrite(out, lambda d: d["events"][1].update(at=0.0))
    assert_one_line_error(agentsaga("restore", str(out), "--app", app, db=f"sqlite:///{tmp_path}/x.db"),
                          "hash chain broken at event seq 2")


#: the workflow the CLI test loads with --app
mover = counter()


# -- the chain, as a property ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_doc(tmp_path_factory) -> dict:
    """One savepoint's document (a run of 12 counts, interrupted at 9), decoded."""
    tmp = tmp_path_factory.mktemp("chain")
    url = f"sqlite:///{tmp}/chain.db"
    interrupted_on(url, "ch", stop_at=9)
    with Orchestrator(url) as orc:
        orc.savepoint("ch", name="prop", path=tmp / "ch.gz")
    return json.loads(gzip.decompress((tmp / "ch.gz").read_bytes()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_change_to_one_event_is_refused_naming_that_event(saved_doc, tmp_path, data):
    # Given a savepoint, and one field of one of its events changed to any other value
    doc = json.loads(json.dumps(saved_doc))
    index = data.draw(st.integers(0, len(doc["events"]) - 1), label="event")
    field = data.draw(st.sampled_from(["seq", "kind", "at", "data"]), label="field")
    old = doc["events"][index][field]
    new = data.draw(st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=30)).filter(
        lambda v: v != old and not (isinstance(v, (int, float)) and isinstance(old, (int, float)) and v == old)),
        label="new value")
    doc["events"][index][field] = new
    path = tmp_path / f"p{index}-{field}.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    # When it is read, Then it is refused at exactly that event
    with pytest.raises(SavepointError) as info:
        read_savepoint(path, key=None)
    named = new if field == "seq" else doc["events"][index]["seq"]
    assert f"hash chain broken at event seq {named!r} (#{index + 1})" in str(info.value)
