"""The README stays true: its example runs, and its set-up commands match .ci/run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_example_runs(tmp_path, monkeypatch):
    # Given the README's Python example, pointed at a temporary database
    [code] = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "Orchestrator(" in b]
    code = code.replace('"sqlite:///agent.db"', f'"sqlite:///{tmp_path}/agent.db"')
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme_example"}
    # When it runs
    exec(compile(code, "README.md", "exec"), namespace)
    # Then the run completed with the documented answer
    result = namespace["result"]
    assert result.status == "completed"
    assert result.state["answer"] == "found something on durability / found something on sagas"


def test_readme_first_command_is_the_demo():
    assert "pip install -e . && agentsaga demo" in README


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -e '.[test]' && pytest" in README
    assert "pip install -q -e '.[test]'" in ci and "python -m pytest" in ci
