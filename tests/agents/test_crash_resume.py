"""A process killed with SIGKILL after a paid model call; the resumed run does not pay for it again.

The chat server runs in the test process and counts requests; the agent runs in a child process
that kills itself right after the model's answer was committed to the journal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import calls  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.engine.loader import load_target  # noqa: E402

CHILD = Path(__file__).parent / "llmchild.py"
pytestmark = pytest.mark.slow


def script(body, n):
    """Answers by the conversation, so the answers do not depend on which process asks."""
    text = body["messages"][-1]["content"]
    return f"draft #{n}" if text.startswith("Draft") else f"final, from [{text.split(': ', 1)[1]}]"


def run_child(db_url: str, run_id: str, kill_after: str, llm_url: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, AGENT_TEST_LLM_URL=llm_url)
    return subprocess.run([sys.executable, str(CHILD), db_url, run_id, kill_after], env=env,
                          capture_output=True, text=True, timeout=120)


def test_sigkill_after_a_paid_model_call_then_resume_makes_no_second_request(db_url, chat, monkeypatch):
    chat.script(script)
    # Given a run killed by SIGKILL right after its first model answer was journaled
    killed = run_child(db_url, "k1", "llm:1", chat.url)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert chat.count == 1
    # When this process resumes it
    monkeypatch.setenv("AGENT_TEST_LLM_URL", chat.url)
    agent = load_target(f"{CHILD}:agent")
    with Orchestrator(db_url, workflows=[agent]) as orc:
        result = orc.resume("k1")
        journal = calls(orc, "k1", "llm")
    # Then only the second model call was made: the first answer came from the journal
    assert result.status == "completed", result.error
    assert chat.count == 2
    assert [r["body"]["messages"][-1]["content"] for r in chat.requests] == [
        "Draft an answer to: why journal model calls?", "Improve this draft: draft #0"]
    # And the step used the journaled draft, which was made by the process that died
    assert result.state["draft"] == "draft #0" and result.state["final"] == "final, from [draft #0]"
    # And each model call is journaled once
    assert [c["index"] for c in journal] == [0, 1]


def test_sigkill_after_both_calls_resumes_without_any_request(db_url, chat, monkeypatch):
    chat.script(script)
    # Given a run killed after both of its model calls were journaled (the step had not returned)
    killed = run_child(db_url, "k2", "llm:2", chat.url)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    monkeypatch.setenv("AGENT_TEST_LLM_URL", chat.url)
    # When it is resumed
    with Orchestrator(db_url, workflows=[load_target(f"{CHILD}:agent")]) as orc:
        result = orc.resume("k2")
    # Then the step ran again but asked the model nothing
    assert result.status == "completed" and chat.count == 2
    assert result.state["final"] == "final, from [draft #0]"
