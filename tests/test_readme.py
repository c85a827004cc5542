"""The README stays true: its example runs, crashes and resumes as shown, and its set-up commands
match .ci/run."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator import Orchestrator

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
HANG = 120  # seconds: a bound on waiting for a child, never a expectation of how long it takes
ANSWER = "found something on durability / found something on sagas"

# Put on the child's PYTHONPATH, this instruments the README's program without changing a line of
# it: every execution of a step is appended to a ledger outside the database, and with README_GATE
# ("step:n") the process announces the n-th completion of that step, once it is journaled, by
# writing README_READY, then waits there to be killed.
SITECUSTOMIZE = '''
import functools, inspect, json, os, threading
import orchestrator, workflows

LEDGER, GATE, READY = os.environ["README_LEDGER"], os.environ.get("README_GATE"), os.environ.get("README_READY")

def _counted(fn):
    def note():
        with open(LEDGER, "a", encoding="utf-8") as fh:
            fh.write(fn.__name__ + "\\n")
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def step(ctx, state):
            note()
            return await fn(ctx, state)
    else:
        @functools.wraps(fn)
        def step(ctx, state):
            note()
            return fn(ctx, state)
    return step

_step = workflows.Workflow.step
def counting_step(self, fn=None, /, **options):
    if fn is not None:
        return _step(self, _counted(fn), **options)
    register = _step(self, **options)
    return lambda f: register(_counted(f))
workflows.Workflow.step = counting_step

_completed = {}
def gate(run, events):
    for event in events:
        if event.kind == "StepCompleted":
            name = json.loads(event.data)["step"]
            _completed[name] = _completed.get(name, 0) + 1
            if GATE == f"{name}:{_completed[name]}":
                with open(READY + ".tmp", "w") as fh:
                    fh.write(str(event.seq))
                os.replace(READY + ".tmp", READY)
                threading.Event().wait()

_init = orchestrator.Orchestrator.__init__
def init(self, *args, observers=(), **options):
    _init(self, *args, observers=(*observers, gate), **options)
orchestrator.Orchestrator.__init__ = init
'''


def readme_example() -> str:
    [code] = [b for b in re.findall(r"```python\n(.*?)```", README, re.DOTALL) if "Orchestrator(" in b]
    return code


def readme_commands() -> list[str]:
    """The commands shown right after the example: how to run it, and how to resume it."""
    after = README[README.index(readme_example()):]
    block = re.search(r"```bash\n(.*?)```", after, re.DOTALL).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def argv(command: str) -> list[str]:
    """A README command as this environment runs it: its python and its agentsaga script."""
    words = shlex.split(command)
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    assert words[0] == "agentsaga", command
    script = Path(sys.executable).with_name("agentsaga")
    return [str(script), *words[1:]] if script.exists() else [sys.executable, "-m", "orchestrator.cli", *words[1:]]


def test_readme_example_runs(tmp_path, monkeypatch):
    # Given the README's Python example, run as a script in an empty directory
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    # When it runs
    exec(compile(readme_example(), "README.md", "exec"), namespace)  # noqa: S102 - the README is ours
    # Then the run completed with the documented answer, in the database the README names
    result = namespace["result"]
    assert result.status == "completed"
    assert result.state["answer"] == ANSWER
    assert (tmp_path / "agent.db").exists()
    namespace["orc"].close()


def test_readme_shows_how_to_run_and_resume():
    run, resume = readme_commands()
    assert run == "python agent.py"
    assert resume == "agentsaga resume r1 --app agent.py --db sqlite:///agent.db"
    assert "Save this as `agent.py`" in README


@pytest.mark.parametrize("how", ["the same command", "agentsaga resume"])
def test_readme_example_survives_sigkill_and_resumes_as_shown(tmp_path, how):
    # Given agent.py saved from the README, instrumented from outside (a ledger of step executions,
    # and a gate that holds the process once the first search's completion is journaled)
    (tmp_path / "agent.py").write_text(readme_example(), encoding="utf-8")
    gate_dir = tmp_path / "instrument"
    gate_dir.mkdir()
    (gate_dir / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    ledger, ready = tmp_path / "ledger.txt", tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(gate_dir), os.environ.get("PYTHONPATH", "")]),
               README_LEDGER=str(ledger))
    env.pop("AGENTSAGA_DB", None)
    env.pop("AGENTSAGA_APP", None)
    run, resume = readme_commands()

    # When `python agent.py` is killed with SIGKILL after plan and one search completed
    child = subprocess.Popen(argv(run), cwd=tmp_path, env={**env, "README_GATE": "search:1", "README_READY": str(ready)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG
    while not ready.exists():
        if child.poll() is not None:
            pytest.fail(f"agent.py ended before the gate (exit {child.returncode}): {child.communicate()}")
        assert time.monotonic() < deadline, "agent.py never reached the first search's completion"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=HANG) == -signal.SIGKILL
    before = Counter(ledger.read_text(encoding="utf-8").split())
    assert before == {"plan": 1, "search": 1}

    # And the run is continued with the command the README shows
    command = run if how == "the same command" else resume
    done = subprocess.run(argv(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG, check=False)

    # Then it completed with the documented answer, and no completed step ran again
    assert done.returncode == 0, done.stderr
    if how == "the same command":
        assert done.stdout.strip() == f"completed {ANSWER}"
    else:
        assert "status completed" in done.stdout and ANSWER in done.stdout
    after = Counter(ledger.read_text(encoding="utf-8").split())
    assert after - before == {"search": 1, "answer": 1}
    with Orchestrator(f"sqlite:///{tmp_path}/agent.db") as orc:
        completed = Counter(e["data"]["step"] for e in orc.history("r1") if e["kind"] == "StepCompleted")
        assert completed == {"plan": 1, "search": 2, "answer": 1}
        assert orc.verify("r1").ok

    # And running the program once more prints the same result and runs no step
    again = subprocess.run(argv(run), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG, check=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"completed {ANSWER}"
    assert Counter(ledger.read_text(encoding="utf-8").split()) == after


def test_readme_first_command_is_the_demo():
    assert "pip install -e . && agentsaga demo" in README


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -e '.[test]' && pytest -n 3\n" in README
    assert "pip install -q -e '.[test]'" in ci and "python -m pytest -n 3\n" in ci
