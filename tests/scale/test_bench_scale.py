"""bench/scale.py --quick runs as a user would run it and ends with one JSON object carrying every
number the issue names (a smoke test: no timing thresholds; the numbers are the benchmark's job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.long]


def test_scale_quick_prints_the_required_json(pg_base_url):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "scale.py"), "--quick"], capture_output=True,
                          text=True, timeout=900, cwd=ROOT, env={**os.environ, "AGENTSAGA_TEST_PG": pg_base_url})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == {}, out["errors"]
    assert set(out["throughput"]) == {"1", "2"}
    for r in out["throughput"].values():
        assert r["runs_per_s"] > 0 and r["steps_per_s"] == pytest.approx(10 * r["runs_per_s"], rel=0.01)
    assert out["dbos"] or out.get("dbos_reason")
    assert out["claim_latency"]["p50_ms"] > 0
    assert out["recovery"]["max_s"] > 0 and out["recovery"]["lease_s"] > 0
    assert out["idle_cpu"]["cpu_s_per_10s"] >= 0
    assert set(out["targets"]) == {"throughput_5x_dbos", "recovery_within_lease_plus_1s"}
