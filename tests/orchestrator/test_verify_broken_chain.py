"""`verify` on incremental snapshots whose chain is broken: each link is reported once, saying where
its chain breaks, and is never diffed as raw link JSON against the fold (docs/audit.md "verify").
The library's report and the console script (text, `--json`, exit code 3), on SQLite and Postgres."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_helpers import raw_sql as sql  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from workflows import Snapshots, Workflow, reducers  # noqa: E402

VERIFY_FAILED = 3
_SNAPSHOT_OF = "run_pk = (SELECT pk FROM agentsaga_runs WHERE run_id = ?) AND seq = ?"
#: words of a field-by-field diff of a link's own JSON against the fold: never shown for a link
LINK_DIFF = ("append:", "base_seq:", "base_sha256:", "frontier: missing from the snapshot", "incremental:")


def counter() -> Workflow:
    """Eight increments then `done`; a full snapshot every 4th snapshot, incremental links between."""
    wf = Workflow("counter", reducers={"total": reducers.add}, snapshots=Snapshots(every=3, incremental=3))

    @wf.step(start=True)
    def inc(ctx, state):
        return {"n": state.get("n", 0) + 1, "total": 3}

    wf.route("inc", lambda s: "inc" if s["n"] < 8 else "done")

    @wf.step
    def done(ctx, state):
        return {}

    return wf


def tamper(url: str, run_id: str, seq: int, old: str, new: str, *, rehash: bool) -> None:
    """Replace ``old`` with ``new`` in a stored snapshot's text; with ``rehash`` its sha256 too."""
    [(text,)] = sql(url, f"SELECT state FROM agentsaga_snapshots WHERE {_SNAPSHOT_OF}", (run_id, seq))
    assert old in text, text
    text = text.replace(old, new, 1)
    if rehash:
        sql(url, f"UPDATE agentsaga_snapshots SET state = ?, sha256 = ? WHERE {_SNAPSHOT_OF}",
            (text, hashlib.sha256(text.encode()).hexdigest(), run_id, seq))
    else:
        sql(url, f"UPDATE agentsaga_snapshots SET state = ? WHERE {_SNAPSHOT_OF}", (text, run_id, seq))


@pytest.fixture
def chain(db_url: str) -> tuple[int, list[int]]:
    """A finished run 's1' with one chain: (the full snapshot's seq, its links' seqs in order)."""
    wf = counter()
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="s1").status == "completed"
        catalog = sorted(orc.snapshots("s1"), key=lambda s: s.seq)
    [full] = [s.seq for s in catalog if s.kind == "full"]
    links = [s.seq for s in catalog if s.kind == "incremental"]
    assert len(links) >= 2 and all(seq > full for seq in links), catalog
    return full, links


def agentsaga(*args: str, db: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSAGA_")}
    return subprocess.run([found, *args, "--db", db], capture_output=True, text=True, env=env, timeout=120)


def test_a_tampered_full_snapshot_is_diffed_and_each_link_on_it_is_reported_once(db_url, chain):
    # Given a run whose full snapshot was edited in the database and re-hashed
    full, links = chain
    tamper(db_url, "s1", full, '"total":', '"total":1000', rehash=True)
    # When it is verified, without its workflow (as the command line does)
    with Orchestrator(db_url) as orc:
        report = orc.verify("s1", mark=False)
    # Then the full snapshot comes first, with the field that differs
    assert not report.ok
    assert [(p.subject, p.seq) for p in report.problems] == [("snapshot", full), *(("snapshot", s) for s in links)]
    first = report.problems[0]
    assert f"differs from the fold of the journal at seq {full}" in first.message
    assert [d for d in first.differences if d.startswith("state.total: snapshot has 1000")], first.differences
    # And each link built on it is reported once, as a broken chain, with no field diff
    for problem in report.problems[1:]:
        assert problem.message.startswith(f"its chain is broken at seq {full}: "), problem.message
        assert problem.differences == ()
    # And a note says the links were not compared, and why
    assert f"snapshots at seq {', '.join(map(str, links))} were not compared with the fold: their chains " \
           "cannot be rebuilt" in report.notes
    # And the catalog verdicts: the full snapshot quarantined (intact bytes, wrong state), the links failed
    assert [(seq, validity) for seq, validity, _ in report.verdicts] == \
        [(full, "quarantined"), *((s, "failed") for s in links)]


def test_a_damaged_link_is_reported_once_and_the_links_after_it_name_it(db_url, chain):
    # Given a run whose first link's text was changed without its hash
    full, links = chain
    tamper(db_url, "s1", links[0], '"set":{', '"set":{"forged":1,', rehash=False)
    # When it is verified
    with Orchestrator(db_url) as orc:
        report = orc.verify("s1", mark=False)
    # Then the full snapshot verifies, the damaged link says its hash does not match, and the later
    # links say their chain is broken at it: one problem each, none diffed
    assert report.snapshots_verified == 1
    assert [(p.seq, p.differences) for p in report.problems] == [(s, ()) for s in links]
    assert report.problems[0].message.startswith("sha256 mismatch")
    assert all(p.message.startswith(f"its chain is broken at seq {links[0]}: ") for p in report.problems[1:])


@pytest.mark.slow
def test_the_command_line_reports_each_broken_link_once_in_text_and_json_and_exits_3(db_url, chain):
    # Given a run whose full snapshot was tampered with and re-hashed
    full, links = chain
    tamper(db_url, "s1", full, '"total":', '"total":1000', rehash=True)
    # When `agentsaga verify` reads it
    text = agentsaga("verify", "s1", "--no-mark", db=db_url)
    as_json = agentsaga("verify", "s1", "--no-mark", "--json", db=db_url)
    # Then both exit 3: the run does not verify
    assert text.returncode == as_json.returncode == VERIFY_FAILED, (text.stderr, as_json.stderr)
    # And the text names each snapshot once, the full one first, and no link is diffed field by field
    out = text.stdout.splitlines()
    assert out[0] == f"run s1: FAILED ({1 + len(links)} problems)", text.stdout
    named = [line.split(":")[0].strip() for line in out if line.startswith("  snapshot seq ")]
    assert named == [f"snapshot seq {s}" for s in (full, *links)], text.stdout
    assert not [line for line in out if line.strip().startswith(LINK_DIFF)], text.stdout
    assert "... and" not in text.stdout
    assert any(line.startswith("note: snapshots at seq ") and "cannot be rebuilt" in line for line in out)
    # And --json says the same: the same problems in the same order, verdicts to match
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    assert [(p["seq"], len(p["differences"]) > 0) for p in report["problems"]] == \
        [(full, True), *((s, False) for s in links)]
    assert [p["message"] for p in report["problems"]] == \
        [line.split(": ", 1)[1] for line in out if line.startswith("  snapshot seq ")]
    assert {v["seq"]: v["validity"] for v in report["verdicts"]} == {full: "quarantined", **dict.fromkeys(links, "failed")}
