"""The benchmark scripts run and end with one JSON object (a smoke test: no timing thresholds).

Given the quick mode of each script under ``bench/`` (``bench/peers.py`` when the peers are
installed, with one setting of each peer per backend), when it runs as a user would run it, then its last stdout line is JSON
carrying every key the issues name, and the numbers that can be measured here are numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_KEYS = {
    "sqlite_ms_per_step", "sqlite_floor_ms", "sqlite_ratio", "pg_ms_per_step", "pg_floor_ms", "pg_ratio",
    "bytes_per_step", "resume_ms_1k", "resume_ms_10k", "sqlite_effect_ms_per_step",
}
PEERS_KEYS = {"engines", "steps_ms", "workflows_per_s", "crash_resume", "bytes_per_step", "targets", "machine"}

pytestmark = [pytest.mark.slow, pytest.mark.long]

#: seconds a quick benchmark may take before it counts as hung: about a minute on an idle machine,
#: many times that on a loaded one, and a smoke test has no business timing it
HANG = 900.0


def run_quick(script: str, timeout: float, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing; stderr: {proc.stderr[-2000:]}"
    return json.loads(lines[-1])


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def test_core_quick_prints_the_required_json():
    # When
    out = run_quick("core.py", timeout=HANG)
    # Then
    assert CORE_KEYS <= out.keys()
    assert out["errors"] == {}, out["errors"]
    for key in ("sqlite_ms_per_step", "sqlite_floor_ms", "sqlite_ratio", "bytes_per_step",
                "resume_ms_1k", "resume_ms_10k"):
        assert is_number(out[key]) and out[key] > 0, (key, out[key])
    if out["pg_ms_per_step"] is None:
        # Postgres absent is fine on a laptop, never in CI (a silent skip would hide a broken backend).
        assert not os.environ.get("CI"), out.get("pg_reason")
        assert out.get("pg_reason")
    else:
        assert is_number(out["pg_ratio"]) and is_number(out["pg_floor_ms"])
    assert is_number(out["sqlite_effect_ms_per_step"]) or out.get("sqlite_effect_reason")


#: names the first of the peers' modules that does not import in a fresh interpreter (one interpreter
#: for the three, not one each: the answer is the same)
FIRST_MISSING = """
import importlib, sys
for mod in sys.argv[1:]:
    try:
        importlib.import_module(mod)
    except Exception:
        print(mod)
        break
"""


def _peers_missing() -> str | None:
    mods = ("dbos", "langgraph.graph", "langgraph.checkpoint.sqlite")
    proc = subprocess.run([sys.executable, "-c", FIRST_MISSING, *mods], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0 or proc.stdout.strip():
        return f"{proc.stdout.strip() or proc.stderr.strip()[-300:]} not importable (pip install -e '.[bench]')"
    return None


SMOKE_PEERS = ("agentsaga-sqlite", "agentsaga-pg", "dbos-sqlite", "dbos-pg", "langgraph-sqlite-sync",
               "langgraph-pg-sync")


def test_peers_quick_prints_the_required_json():
    # Given
    missing = _peers_missing()
    if missing:
        pytest.skip(missing)
    # When it runs each engine's adapter on each backend (the two variant settings of DBOS and
    # LangGraph on SQLite run the same adapters, and the throughput workload the same children: the
    # full run measures them; the smoke test keeps the README's test command inside CI's budget)
    out = run_quick("peers.py", HANG, "--systems", ",".join(SMOKE_PEERS), "--workloads", "steps,crash,bytes")
    # Then
    assert PEERS_KEYS <= out.keys()
    assert out["engines"]["agentsaga-sqlite"] is None, out["engines"]
    assert is_number(out["steps_ms"]["systems"]["agentsaga-sqlite"]["median"])
    for point, per in out["crash_resume"].items():
        for engine, row in per.items():
            assert row is not None, (point, engine, out["errors"])
            assert row["final_ok"], (point, engine)


AUDIT_KEYS = {"runs", "events", "sqlite_list_ms", "pg_list_ms", "sqlite_show_ms", "pg_show_ms", "report_ms",
              "report_steps", "targets", "targets_met"}


def test_audit_quick_prints_the_required_json():
    # When the audit benchmark runs in its quick mode
    out = run_quick("audit.py", timeout=HANG)
    # Then its JSON carries the listing, show and report numbers
    assert AUDIT_KEYS <= out.keys()
    assert out["runs"] == 2000 and out["events"] == 20000 and out["report_steps"] > 100
    for key in ("sqlite_list_ms", "sqlite_show_ms", "report_ms"):
        assert is_number(out[key]) and out[key] > 0, (key, out[key])
    if out["pg_list_ms"] is None:
        assert not os.environ.get("CI"), out.get("pg_reason")
        assert out.get("pg_reason")
    else:
        assert is_number(out["pg_list_ms"]) and is_number(out["pg_show_ms"])


AGENTS_KEYS = {"runs", "ratios", "conversation", "takeover", "startup", "targets", "targets_met", "errors"}


def test_agents_quick_prints_the_required_json():
    # When the many-agents benchmark runs in its quick mode
    out = run_quick("agents.py", timeout=HANG)
    # Then every measurement succeeded, each call was made exactly once, and the numbers are numbers
    assert AGENTS_KEYS <= out.keys()
    assert out["errors"] == {}, out["errors"]
    backends = ["sqlite"] + ([] if out["pg_reason"] else ["pg"])
    if out["pg_reason"]:
        assert not os.environ.get("CI"), out["pg_reason"]
    for backend in backends:
        for n in out["plan"]["ns"]:
            per = out["runs"][f"{backend}/{n}"]
            for op in ("floor", "plain", "durable", "llm"):
                assert is_number(per[op]["median"]) and per[op]["median"] > 0, (backend, n, op, per)
            assert is_number(out["ratios"][f"{backend}/{n}"]["llm_vs_durable"])
        convo = out["conversation"][backend]
        assert convo["status"] == "completed" and is_number(convo["first_ms"]) and is_number(convo["last_ms"])
        takeover = out["takeover"][backend]
        assert takeover["takeover"]["n"] == out["plan"]["reps"] and is_number(takeover["takeover"]["max"])
        assert is_number(out["targets"][f"takeover_over_lease_{backend}"][0])
    for command in ("python -c pass", "import orchestrator", "agentsaga --help", "agentsaga --version",
                    "agentsaga runs"):
        assert is_number(out["startup"][command].get("ms")), (command, out["startup"][command])


CHECKPOINT_ROW_KEYS = {"ms_per_step", "overhead", "growth", "snapshots", "bytes", "recovery_ms", "replayed"}


def test_checkpoints_quick_prints_a_row_per_policy_and_workload():
    # When the checkpoint benchmark runs in its quick mode
    out = run_quick("checkpoints.py", timeout=HANG)
    # Then every policy has a row of numbers for each workload, on SQLite and (in CI) Postgres
    backends = ["sqlite"] + (["postgres"] if out["postgres"] is not None else [])
    if out["postgres"] is None:
        assert not os.environ.get("CI"), out.get("pg_reason")
    for backend in backends:
        workloads = out[backend]
        assert {k.split("_")[0] for k in workloads} == {"steps", "conversation"}
        for rows in workloads.values():
            assert set(rows) == set(out["policies"]) and "none" in rows
            for name, row in rows.items():
                assert CHECKPOINT_ROW_KEYS <= row.keys(), name
                assert all(is_number(row[k]) for k in CHECKPOINT_ROW_KEYS), (name, row)
            # The floor writes only the final snapshot; a count policy writes more
            assert rows["none"]["snapshots"] == 1 and rows["every_10_full"]["snapshots"] > 1
