"""Plain helpers for the audit tests (the console script, SQL behind the store's back, tampering).

The suite runs with --import-mode=importlib, so the test modules put this directory on sys.path
to import it; the module name is unique to the suite.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
AUDITFLOW = "tests/orchestrator/auditflow.py:wf"
CRASHFLOW = "tests/orchestrator/crashflow.py:wf"


def load(target: str):
    """The workflow behind a CLI target, loaded as `agentsaga resume` would load it."""
    from orchestrator.engine.loader import load_target

    where, _, attr = target.rpartition(":")
    return load_target(f"{ROOT / where}:{attr}")


def agentsaga(*args: str, db: str | None = None, ledger: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed console script from the repository root, as a user would."""
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    full_env = dict(os.environ)
    full_env.pop("AGENTSAGA_DB", None)
    if ledger is not None:
        full_env["CRASHFLOW_LEDGER"] = str(ledger)
    full_env.update(env or {})
    argv = [found, *args] + (["--db", db] if db else [])
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=full_env, timeout=120)


def assert_one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    """Non-zero exit, exactly one line on stderr naming the needles, no traceback."""
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("agentsaga: error: "), lines[0]
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def raw_sql(url: str, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
    """One statement (`?` placeholders) on the database behind `url`, outside any store."""
    if url.startswith("sqlite"):
        conn: Any = sqlite3.connect(url.split("sqlite:///", 1)[1], isolation_level=None)
    else:
        import psycopg

        conn = psycopg.connect("postgresql://" + url.split("://", 1)[1], autocommit=True)
        sql = sql.replace("?", "%s")
    try:
        cur = conn.execute(sql, params)
        return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


_SNAPSHOT_OF = "run_pk = (SELECT pk FROM agentsaga_runs WHERE run_id = ?) AND seq = ?"


def snapshot_text(url: str, run_id: str, seq: int) -> str:
    return raw_sql(url, f"SELECT state FROM agentsaga_snapshots WHERE {_SNAPSHOT_OF}", (run_id, seq))[0][0]


def tamper_snapshot(url: str, run_id: str, seq: int, change, *, rehash: bool) -> None:
    """Rewrite a stored snapshot's JSON with ``change(dict)``; with ``rehash`` its sha256 is
    recomputed too, so only a comparison with the journal can tell."""
    state = json.loads(snapshot_text(url, run_id, seq))
    change(state)
    text = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if rehash:
        digest = hashlib.sha256(text.encode()).hexdigest()
        raw_sql(url, f"UPDATE agentsaga_snapshots SET state = ?, sha256 = ? WHERE {_SNAPSHOT_OF}",
                (text, digest, run_id, seq))
    else:
        raw_sql(url, f"UPDATE agentsaga_snapshots SET state = ? WHERE {_SNAPSHOT_OF}", (text, run_id, seq))
