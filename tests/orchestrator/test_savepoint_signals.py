"""A savepoint carries the run's pending signals: those sent and not yet consumed. Restored with
the run in one transaction, each is received exactly once, in the order it was sent, by the wait
it would have reached at home; one already consumed (journaled ``SignalReceived``) is not carried
again. A tampered signal is refused like a tampered event, and a savepoint of the format before
signals were carried restores as it did. Real SQLite and Postgres, the API and the console script.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import agentsaga, assert_one_line_error  # noqa: E402

import flatflow  # noqa: E402

from orchestrator import Orchestrator, SavepointError  # noqa: E402
from orchestrator.engine.savepoints import FORMAT_VERSION  # noqa: E402
from store import RunNotFoundError, open_store  # noqa: E402
from workflows import Workflow  # noqa: E402

DATA = Path(__file__).parent / "data"


def approvals(*, stop_in_prep: bool = False) -> Workflow:
    """prep, then two waits for signal ``approval`` (each receives one); "dies" in prep if told to."""
    wf = Workflow("inbox")

    @wf.step(start=True)
    def prep(ctx, state):
        if stop_in_prep:
            raise KeyboardInterrupt
        return {"prepped": True}

    @wf.step()
    def ask(ctx, state):
        return {"first": ctx.wait_for("approval")}

    @wf.step()
    def again(ctx, state):
        return {"second": ctx.wait_for("approval")}

    return wf


#: the workflow the console script loads with --app
inbox = approvals()


def received(orc: Orchestrator, run_id: str) -> list[tuple[str, object]]:
    """The journal's SignalReceived events: (step, data), in journal order."""
    return [(e["data"]["step"], e["data"]["data"]) for e in orc.history(run_id) if e["kind"] == "SignalReceived"]


def restored_events(orc: Orchestrator, run_id: str) -> list[dict]:
    return [e["data"] for e in orc.history(run_id) if e["kind"] == "Restored"]


def pending(url: str, run_id: str) -> list[tuple[str, object]]:
    with open_store(url) as store:
        return [(name, json.loads(data)) for _, name, data, _ in store.signals.pending(run_id)]


def nothing_in(url: str, run_id: str) -> bool:
    with open_store(url) as store:
        try:
            store.get_run(run_id)
        except RunNotFoundError:
            return True
    return False


def read_doc(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def write_doc(path: Path, doc: dict) -> None:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


@pytest.fixture
def source_url(tmp_path) -> str:
    """A SQLite database apart from the one a test restores into."""
    return f"sqlite:///{tmp_path}/source.db"


def waiting_with_two_approvals(url: str, path: Path, *, key: str | None = None) -> None:
    """A run ``sp`` waiting at ``ask``, sent two approvals (the second for the later wait), saved to ``path``."""
    with Orchestrator(url, workflows=[approvals()], signing_key=key) as orc:
        assert orc.run(orc.workflows.get("inbox"), {}, run_id="sp").status == "waiting"
        orc.signal("sp", "approval", {"n": 1})
        orc.signal("sp", "approval", {"n": 2})
        orc.savepoint("sp", name="with-inbox", path=path)


# -- the move ------------------------------------------------------------------------------------------
def test_pending_signals_move_with_the_run_and_are_each_received_once_in_order(source_url, db_url, tmp_path):
    # Given a run waiting for approval, sent two approvals before it was saved (the second one for
    # a wait it has not reached yet)
    path = tmp_path / "sp.savepoint.json.gz"
    waiting_with_two_approvals(source_url, path)
    # When it is restored into another database (SQLite, or Postgres)
    with Orchestrator(db_url, workflows=[approvals()]) as orc:
        assert orc.restore(path) == "sp"
        # Then both signals wait in its inbox there, in the order they were sent
        assert pending(db_url, "sp") == [("approval", {"n": 1}), ("approval", {"n": 2})]
        assert restored_events(orc, "sp")[-1]["signals"] == 2
        # And resuming it receives each once, the first by the first wait, with nothing left over
        result = orc.resume("sp")
        assert result.status == "completed", result.error
        assert result.state == {"prepped": True, "first": {"n": 1}, "second": {"n": 2}}
        assert received(orc, "sp") == [("ask", {"n": 1}), ("again", {"n": 2})]
        assert pending(db_url, "sp") == []
        assert orc.verify("sp").ok


def test_a_second_restore_of_the_same_savepoint_is_refused_and_queues_nothing_twice(source_url, db_url, tmp_path):
    # Given a savepoint with two pending signals, restored once
    path = tmp_path / "sp.savepoint.json.gz"
    waiting_with_two_approvals(source_url, path)
    with Orchestrator(db_url, workflows=[approvals()]) as orc:
        orc.restore(path)
        # When it is restored again into the same database
        with pytest.raises(SavepointError, match="already exists in this database; nothing was written"):
            orc.restore(path)
        # Then the inbox still holds each signal once, and the run receives each once
        assert pending(db_url, "sp") == [("approval", {"n": 1}), ("approval", {"n": 2})]
        assert orc.resume("sp").status == "completed"
        assert received(orc, "sp") == [("ask", {"n": 1}), ("again", {"n": 2})]


def test_a_signal_already_received_is_not_carried_again(db_url, tmp_path):
    # Given a run (on SQLite or Postgres) that received its first approval and now waits for the second
    path = tmp_path / "sp.savepoint.json.gz"
    with Orchestrator(db_url, workflows=[approvals()]) as orc:
        orc.run(orc.workflows.get("inbox"), {}, run_id="sp")
        orc.signal("sp", "approval", {"n": 1})
        assert orc.resume("sp").status == "waiting"
        # When it is saved
        orc.savepoint("sp", name="half", path=path)
    # Then the file carries no signal: the one sent was consumed, and its SignalReceived is in the journal
    assert read_doc(path)["signals"] == []
    # And restored elsewhere, it goes on to wait for the second, which is received once
    target = f"sqlite:///{tmp_path}/target.db"
    with Orchestrator(target, workflows=[approvals()]) as orc:
        orc.restore(path)
        assert orc.resume("sp").status == "waiting"
        orc.signal("sp", "approval", {"n": 2})
        result = orc.resume("sp")
        assert result.state == {"prepped": True, "first": {"n": 1}, "second": {"n": 2}}
        assert received(orc, "sp") == [("ask", {"n": 1}), ("again", {"n": 2})]


def test_a_run_moved_twice_keeps_a_pending_signal_whose_id_a_signal_consumed_in_its_first_home_had(db_url, tmp_path):
    # Given a run that received approval 1 (signal id 1 in its first, fresh database) and was moved
    # to a fresh SQLite database, where approval 2 was sent to it (id 1 there as well)
    first, second = tmp_path / "first.gz", tmp_path / "second.gz"
    with Orchestrator(db_url, workflows=[approvals()]) as orc:
        orc.run(orc.workflows.get("inbox"), {}, run_id="sp")
        orc.signal("sp", "approval", {"n": 1})
        orc.resume("sp")
        orc.savepoint("sp", name="first", path=first)
    middle = f"sqlite:///{tmp_path}/middle.db"
    with Orchestrator(middle, workflows=[approvals()]) as orc:
        orc.restore(first)
        orc.signal("sp", "approval", {"n": 2})
        # When it is saved there
        orc.savepoint("sp", name="second", path=second)
    # Then approval 2 is carried (the id its first home's journal names is not this home's)
    assert [s["data"] for s in read_doc(second)["signals"]] == ['{"n":2}']
    # And restored a second time, the run receives it once
    last = f"sqlite:///{tmp_path}/last.db"
    with Orchestrator(last, workflows=[approvals()]) as orc:
        orc.restore(second)
        assert orc.resume("sp").state == {"prepped": True, "first": {"n": 1}, "second": {"n": 2}}
        assert received(orc, "sp") == [("ask", {"n": 1}), ("again", {"n": 2})]
        assert [r["signals"] for r in restored_events(orc, "sp")] == [0, 1]


def test_a_signal_consumed_while_the_savepoint_is_read_is_carried_once_in_the_journal_not_twice(db_url, tmp_path):
    # Given a waiting run sent an approval, which another process consumes right after the
    # savepoint has read the run's inbox and before it reads the journal
    path = tmp_path / "sp.savepoint.json.gz"
    with Orchestrator(db_url, workflows=[approvals()]) as orc:
        orc.run(orc.workflows.get("inbox"), {}, run_id="sp")
        orc.signal("sp", "approval", {"n": 1})
        read_inbox = orc.store.signals.pending

        def inbox_then_consumed(run_id, name=None):
            found = read_inbox(run_id, name)
            with Orchestrator(db_url, workflows=[approvals()]) as other:
                assert other.resume("sp").status == "waiting"  # received by ask; again waits
            return found

        orc.store.signals.pending = inbox_then_consumed
        # When the savepoint is written
        orc.savepoint("sp", name="racing", path=path)
    # Then the signal is in the file once, as the journal's SignalReceived, not also as pending
    doc = read_doc(path)
    assert doc["signals"] == []
    assert [e["kind"] for e in doc["events"]].count("SignalReceived") == 1
    # And restored and resumed with a second approval, the first is not received again
    target = f"sqlite:///{tmp_path}/target.db"
    with Orchestrator(target, workflows=[approvals()]) as orc:
        orc.restore(path)
        orc.signal("sp", "approval", {"n": 2})
        assert orc.resume("sp").state["second"] == {"n": 2}
        assert received(orc, "sp") == [("ask", {"n": 1}), ("again", {"n": 2})]


def test_a_run_not_yet_waiting_carries_signals_queued_for_a_later_wait(source_url, db_url, tmp_path):
    # Given a run interrupted in its first step, before any wait, sent an approval for a wait it
    # has not reached
    with Orchestrator(source_url, workflows=[approvals(stop_in_prep=True)]) as orc, \
            pytest.raises(KeyboardInterrupt):
        orc.run(orc.workflows.get("inbox"), {}, run_id="sp")
    path = tmp_path / "sp.savepoint.json.gz"
    with Orchestrator(source_url, workflows=[approvals()]) as orc:
        assert orc.get_run("sp").status not in ("waiting", "completed")
        orc.signal("sp", "approval", {"n": 1})
        orc.savepoint("sp", name="early", path=path)
    # When it is restored and resumed elsewhere
    with Orchestrator(db_url, workflows=[approvals()]) as orc:
        orc.restore(path)
        result = orc.resume("sp")
        # Then the first wait receives the signal sent before the move, and the second waits
        assert result.status == "waiting"
        assert result.state == {"prepped": True, "first": {"n": 1}}
        assert received(orc, "sp") == [("ask", {"n": 1})]


def test_the_cli_moves_a_delivered_signal_from_sqlite_to_postgres(sqlite_url, pg_url, tmp_path):
    # Given a run waiting for approval on SQLite, sent it through `agentsaga signal`
    with Orchestrator(sqlite_url, workflows=[approvals()]) as orc:
        orc.run(orc.workflows.get("inbox"), {}, run_id="sp")
    app = f"{Path(__file__).resolve()}:inbox"
    sent = agentsaga("signal", "sp", "approval", "--data", '{"ok": "sent before the move"}', db=sqlite_url)
    assert sent.returncode == 0, sent.stderr
    # When `agentsaga savepoint` writes it and `agentsaga restore` brings it into Postgres
    out = tmp_path / "sp.gz"
    saved = agentsaga("savepoint", "sp", "--name", "mv", "--out", str(out), db=sqlite_url)
    assert saved.returncode == 0, saved.stderr
    done = agentsaga("restore", str(out), "--app", app, db=pg_url)
    assert done.returncode == 0, done.stderr
    # Then `agentsaga resume` there receives the signal: the run goes on to its second wait
    resumed = agentsaga("resume", "sp", "--app", app, "--json", db=pg_url)
    assert resumed.returncode == 4, (resumed.stdout, resumed.stderr)  # waiting: for the second approval
    assert json.loads(resumed.stdout)["state"]["first"] == {"ok": "sent before the move"}
    with Orchestrator(pg_url, workflows=[approvals()]) as orc:
        assert received(orc, "sp") == [("ask", {"ok": "sent before the move"})]
    # And a tampered signal is refused in one line before anything is written
    doc = read_doc(out)
    doc["signals"] = []
    write_doc(out, doc)
    other = f"sqlite:///{tmp_path}/other.db"
    assert_one_line_error(agentsaga("restore", str(out), "--app", app, db=other),
                          "holds 0 signals but its header says 1")


# -- refused files ---------------------------------------------------------------------------------------
@pytest.fixture
def saved(source_url, tmp_path) -> Path:
    path = tmp_path / "sp.savepoint.json.gz"
    waiting_with_two_approvals(source_url, path)
    return path


def refused(db_url: str, path: Path, *needles: str, key: str | None = None) -> None:
    with Orchestrator(db_url, workflows=[approvals()], signing_key=key) as orc, \
            pytest.raises(SavepointError) as info:
        orc.restore(path)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert nothing_in(db_url, "sp")


def test_an_edited_signal_is_refused_naming_it(saved, db_url):
    doc = read_doc(saved)
    doc["signals"][1]["data"] = '{"n": 20}'
    write_doc(saved, doc)
    refused(db_url, saved, "hash chain broken at signal #2 ('approval')")


def test_a_removed_or_reordered_signal_is_refused(saved, db_url):
    doc = read_doc(saved)
    write_doc(saved, {**doc, "signals": doc["signals"][:1]})
    refused(db_url, saved, "holds 1 signals but its header says 2", "signals were removed")
    write_doc(saved, {**doc, "signals": doc["signals"][::-1]})
    refused(db_url, saved, "hash chain broken at signal #1")


def test_a_signal_forged_with_its_chain_recomputed_is_refused_under_the_signing_key(source_url, db_url, tmp_path):
    # Given a signed savepoint whose second signal was changed, its link and head recomputed
    path = tmp_path / "signed.gz"
    waiting_with_two_approvals(source_url, path, key="k1")
    doc = read_doc(path)
    forged = doc["signals"][1]
    forged["data"] = '{"n": 20}'
    body = {k: forged[k] for k in ("id", "name", "data", "sent_at")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    doc["head"] = forged["link"] = hashlib.sha256(doc["signals"][0]["link"].encode() + text).hexdigest()
    write_doc(path, doc)
    # Then a reader without the key has only the chain to check, and restores it
    with Orchestrator(db_url, workflows=[approvals()]) as keyless:
        keyless.restore(path)
        assert pending(db_url, "sp")[1] == ("approval", {"n": 20})
        keyless.store.delete_runs(["sp"])
    # But under the key it is refused, as a forged event is
    refused(db_url, path, "signature does not match", key="k1")


def test_a_damaged_signal_is_refused_naming_what_is_wrong(saved, db_url):
    # Given a signal whose data is not JSON, its chain recomputed (as a careless tool would)
    doc = read_doc(saved)
    bad = doc["signals"][0]
    bad["data"] = "{not json"
    link = doc["events"][-1]["link"]
    for signal in doc["signals"]:
        body = {k: signal[k] for k in ("id", "name", "data", "sent_at")}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        link = signal["link"] = hashlib.sha256(link.encode() + text).hexdigest()
    doc["head"] = link
    write_doc(saved, doc)
    refused(db_url, saved, "signal #1 is damaged: its data is not JSON")


# -- the format before signals -------------------------------------------------------------------------
def test_a_savepoint_written_before_signals_were_carried_restores_as_before(db_url, tmp_path):
    # Given a version-1 savepoint (no signals in it) of a run parked at its wait, written by an
    # older agentsaga (see flatflow.py)
    original = json.loads((DATA / "flat-journal.savepoint.json").read_text(encoding="utf-8"))
    assert original["format_version"] == 1 and "signals" not in original
    assert FORMAT_VERSION == 2
    path = tmp_path / "v1.savepoint"
    path.write_bytes(gzip.compress((DATA / "flat-journal.savepoint.json").read_bytes()))
    flatflow.performed.clear()
    # When it is restored
    with Orchestrator(db_url, workflows=[flatflow.flat]) as orc:
        run_id = orc.restore(path)
        # Then the run arrives with an empty inbox, and says it brought no signal
        assert pending(db_url, run_id) == []
        assert restored_events(orc, run_id)[-1]["signals"] == 0
        # And a signal sent there is received once
        orc.signal(run_id, "go", {"by": "ann"})
        result = orc.resume(run_id)
        assert result.status == "completed" and result.state["by"] == "ann"
        assert received(orc, run_id) == [("ask", {"by": "ann"})]


def test_a_version_1_savepoint_holding_signals_is_refused(db_url, tmp_path):
    # Given the version-1 file with a signals list added (it cannot have one)
    doc = json.loads((DATA / "flat-journal.savepoint.json").read_text(encoding="utf-8"))
    doc["signals"] = [{"id": 1, "name": "go", "data": "{}", "sent_at": 0.0, "link": "x"}]
    path = tmp_path / "v1.savepoint"
    write_doc(path, doc)
    with Orchestrator(db_url, workflows=[flatflow.flat]) as orc, pytest.raises(SavepointError) as info:
        orc.restore(path)
    assert "format version 1, which carries no signals, but holds some" in str(info.value)
    assert nothing_in(db_url, "flat-parked")
