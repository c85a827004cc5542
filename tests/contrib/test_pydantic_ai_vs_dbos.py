"""The same pydantic-ai script under DBOS's pydantic-ai durability and under agentsaga's: the call logs.

Runs where DBOS and its pydantic-ai integration are installed (the ``bench`` extra, which CI
installs). Each engine runs tests/contrib/peer_trip.py in a child process of its own (DBOS keeps
process-wide state), DBOS on a SQLite system database of its own, agentsaga on each backend. DBOS's
side does not depend on agentsaga's backend: it runs once per module (a module-scoped fixture) and
each backend's agentsaga run is held to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed: pip install -e '.[pydantic-ai]'")
pytest.importorskip("dbos", reason="DBOS is not installed: pip install -e '.[bench]'")
pytest.importorskip("pydantic_ai.durable_exec.dbos", reason="pydantic-ai's DBOS integration is not importable")

sys.path.insert(0, str(Path(__file__).parent))

from agentflow import read_ledger  # noqa: E402

SCRIPT = Path(__file__).parent / "peer_trip.py"
pytestmark = pytest.mark.slow


def peer(engine: str, url: str, verb: str, ledger: Path, kill: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AGENTSAGA_TEST_KILL"}
    env["AGENTSAGA_TEST_LEDGER"] = str(ledger)
    if kill:
        env["AGENTSAGA_TEST_KILL"] = kill
    return subprocess.run([sys.executable, str(SCRIPT), engine, url, "trip-1", verb], env=env, capture_output=True,
                          text=True, timeout=180)


def output(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["output"]


def turns(log: list[list[object]]) -> list[object]:
    """The call log by model turn: each model request, then the set of tool calls it asked for
    (DBOS runs one answer's tool calls in parallel, so their order there is the scheduler's)."""
    out: list[object] = []
    for entry in log:
        if entry[0] == "model":
            out.append(tuple(entry))
            out.append([])
        else:
            out[-1].append(tuple(entry))
    return [sorted(x) if isinstance(x, list) else x for x in out]


@pytest.fixture(scope="module")
def dbos_ran(tmp_path_factory) -> tuple[str, list]:
    """The script run to the end under DBOS: its answer and its call log."""
    tmp = tmp_path_factory.mktemp("dbos-ran")
    out = output(peer("dbos", f"sqlite:///{tmp}/dbos.sqlite", "run", tmp / "dbos.jsonl"))
    return out, read_ledger(str(tmp / "dbos.jsonl"))


@pytest.fixture(scope="module")
def dbos_recovered(tmp_path_factory) -> tuple[str, list]:
    """The script SIGKILLed during its second model request under DBOS, then recovered in a fresh
    process: the answer and the call log of both processes."""
    tmp = tmp_path_factory.mktemp("dbos-recovered")
    killed = peer("dbos", f"sqlite:///{tmp}/dbos.sqlite", "run", tmp / "dbos.jsonl", kill="model:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    out = output(peer("dbos", f"sqlite:///{tmp}/dbos.sqlite", "recover", tmp / "dbos.jsonl"))
    return out, read_ledger(str(tmp / "dbos.jsonl"))


def test_the_call_logs_of_one_script_match_under_dbos_and_agentsaga(dbos_ran, db_url, tmp_path):
    # Given one agent script (a model, a weather tool, two bookings in one answer)
    # When it runs to the end under DBOS's durability and under agentsaga's
    dbos_out, dbos_log = dbos_ran
    ours_out = output(peer("agentsaga", db_url, "run", tmp_path / "ours.jsonl"))
    # Then both made the same model requests and tool calls, turn by turn, and answered the same
    ours_log = read_ledger(str(tmp_path / "ours.jsonl"))
    assert turns(dbos_log) == turns(ours_log)
    assert [e[:2] for e in ours_log] == [["model", 1], ["tool", "weather"], ["model", 2], ["tool", "book_hotel"],
                                         ["tool", "book_car"], ["model", 3]]
    assert dbos_out == ours_out


def test_after_a_sigkill_during_the_second_request_neither_engine_pays_for_the_first_again(
        dbos_recovered, db_url, tmp_path):
    # Given the script SIGKILLed during its second model request, under each engine (DBOS's: the fixture)
    killed = peer("agentsaga", db_url, "run", tmp_path / "agentsaga.jsonl", kill="model:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # When each engine finishes the interrupted run in a fresh process
    dbos_out, dbos_log = dbos_recovered
    ours_out = output(peer("agentsaga", db_url, "recover", tmp_path / "agentsaga.jsonl"))
    ours_log = read_ledger(str(tmp_path / "agentsaga.jsonl"))
    # Then both answer the same, and neither asked the model for the first request twice
    assert dbos_out == ours_out
    assert [e for e in dbos_log if e[0] == "model"] == [e for e in ours_log if e[0] == "model"]
    # And under agentsaga every tool ran exactly once. (DBOS's integration runs function tools in the
    # workflow itself, not as steps, so it may run the weather tool again on recovery: what the
    # tool does must then be idempotent. agentsaga journals each tool call.)
    tools = [tuple(e) for e in ours_log if e[0] == "tool"]
    assert sorted(tools) == sorted(set(tools)) and len(tools) == 3
