"""``agentsaga demo``: the research-and-book agent, SIGKILLed midway, resumed, approved, reported.

    agentsaga demo [--db URL] [--manual-approval] [--report FILE]

What it shows, in order:

1. a scripted OpenAI-compatible model server and the booking service start on 127.0.0.1 (with
   ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set, the real model is used instead);
2. the agent (``examples/research_agent.py``) runs in a child process that is killed with a real
   SIGKILL right after the research loop's first model answer became durable (a paid call);
3. this process resumes the run: the model server's request count shows that the answer journaled
   before the crash is not asked for (nor paid for) again;
4. the run waits for approval; the demo sends it (``--manual-approval``: you do, with the printed
   ``agentsaga signal`` command from another terminal), and the run books and answers;
5. the run's step table, and the HTML report (``orc.report``) is written.

``cli.py`` wires the verb with ``add_demo_verb(sub, verb)``; the child process is this module run
with ``python -m orchestrator.cli.demo --child ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_demo_verb", "cmd_demo"]

_EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
_TARGET = "research_agent.py:agent"
_DEMO_KEY = "demo-key-0000"  # the scripted server checks it; the journal never sees it


def add_demo_verb(sub: Any, verb: Any) -> argparse.ArgumentParser:
    """Register ``demo`` with the CLI's ``verb(name, func, help, json_flag)`` helper."""
    p = verb("demo", cmd_demo, "run the research-and-book agent: SIGKILL midway, resume, approval, report",
             json_flag=False)
    p.add_argument("--manual-approval", action="store_true",
                   help="wait for you to approve with `agentsaga signal` instead of approving automatically")
    p.add_argument("--report", metavar="FILE", default="agentsaga-demo.html", help="where to write the HTML report")
    return p


def _say(text: str = "") -> None:
    print(text, flush=True)


def _load(examples: Path) -> tuple[Any, Any, Any]:
    """The example's workflow and module, and the booking service class (as a user would load them)."""
    from orchestrator.engine.loader import load_target

    agent = load_target(str(examples / _TARGET))
    module = sys.modules[agent.steps["plan"].fn.__module__]
    return agent, module, module.BookingService


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestrator.testing.chatserver import ChatServer
    from orchestrator._orchestrator import Orchestrator
    from orchestrator.errors import ConfigurationError

    if not (_EXAMPLES / "research_agent.py").is_file():
        raise ConfigurationError(f"agentsaga demo needs the source checkout's examples/ ({_EXAMPLES} is missing); "
                                 "install with `pip install -e .` from the repository")
    real = bool(os.environ.get("OPENAI_BASE_URL") and os.environ.get("OPENAI_API_KEY"))
    server = None if real else ChatServer(None, api_key=_DEMO_KEY)
    if server is not None:
        # Before the example is imported: its module-level LLM reads these.
        os.environ.update(OPENAI_BASE_URL=server.start(), OPENAI_API_KEY=_DEMO_KEY, OPENAI_MODEL=server.model)
    try:
        agent, module, booking_service = _load(_EXAMPLES)
        if server is not None:
            server.script(module.scripted_model)
        with booking_service() as service:
            return _demo(args, agent, module, service, server, Orchestrator)
    finally:
        if server is not None:
            server.stop()


def _demo(args: argparse.Namespace, agent: Any, module: Any, service: Any, server: Any, orchestrator: Any) -> int:
    db = args.db
    db_flag = f" --db {db}" if db else ""
    run_id = f"demo-{secrets.token_hex(4)}"
    model = f"scripted model at {server.url}" if server else f"{os.environ.get('OPENAI_MODEL') or 'gpt-4o-mini'} at " \
                                                              f"{os.environ['OPENAI_BASE_URL']}"
    _say(f"agentsaga demo: run {run_id}\n  database: {db or os.environ.get('AGENTSAGA_DB') or 'sqlite:///agentsaga.db'}"
         f"\n  model:    {model}\n  bookings: {service.url}\n")
    state = {**module.DEFAULT_INPUT, "api": service.url}

    _say("1. The agent runs in a child process, killed with SIGKILL right after a paid model call is journaled")
    child = [sys.executable, "-m", "orchestrator.cli.demo", "--child", "--run-id", run_id,
             "--input", json.dumps(state), *(["--db", db] if db else [])]
    killed = subprocess.run(child, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    paid_before = server.count if server else None
    if killed.returncode != -signal.SIGKILL:
        _say(f"   the child was not killed (exit {killed.returncode}):\n{killed.stderr.strip()[-2000:]}")
        return 1
    _say(f"   child died of SIGKILL; model requests so far: {paid_before if server else '(real model)'}")

    with orchestrator(db, workflows=[agent]) as orc:
        _say(f"\n2. Resuming run {run_id} in this process")
        result = orc.resume(run_id)
        if server:
            calls = _llm_calls(orc.history(run_id))
            _say(f"   model requests now: {server.count}; model calls in the journal: {calls} "
                 f"(the answer journaled before the crash was reused, not paid for again)")
        _say(f"   status: {result.status}")
        if result.status == "waiting":
            result = _approve(args, orc, run_id, db_flag)
        history = orc.history(run_id)
        _say(f"\n4. Run {run_id}: {result.status}" + (f" ({result.error})" if result.error else ""))
        _say(_step_table(history))
        if server:
            _say(f"\n   model requests served: {server.count}; model calls journaled: {_llm_calls(history)}")
        bookings = [e for e in service.ledger() if e["action"] in ("book", "cancel", "replay")]
        _say("   booking service: " + (", ".join(f"{e['action']} {e.get('id')}" for e in bookings) or "nothing"))
        answer = (result.state or {}).get("answer") if isinstance(result.state, dict) else None
        if answer:
            _say(f"\n   answer: {answer}")
        _say("")
        _report(orc, run_id, args.report)
        _say(f"\nNext: agentsaga runs{db_flag}   |   agentsaga history {run_id}{db_flag}")
    return 0 if result.status == "completed" else 1


def _approve(args: argparse.Namespace, orc: Any, run_id: str, db_flag: str) -> Any:
    if not args.manual_approval:
        _say("\n3. The run waits for approval; the demo approves it (signal 'approval')")
        orc.signal(run_id, "approval", {"approved": True, "by": "agentsaga demo"})
        return orc.resume(run_id)
    data = json.dumps({"approved": True, "by": os.environ.get("USER") or "me"})
    _say(f"\n3. The run waits for your approval. From another terminal run:\n\n"
         f"   agentsaga signal {run_id} approval --data '{data}'{db_flag}\n\n"
         f"   (or --data '{{\"approved\": false, \"reason\": \"too expensive\"}}' to decline). Waiting...")
    while not orc.store.signals.pending(run_id, "approval"):
        if orc.get_run(run_id).status != "waiting":
            break  # someone else (a worker, `agentsaga recover`) already continued it
        time.sleep(0.5)
    _say("   approval received; continuing")
    return orc.resume(run_id)


def _llm_calls(history: list[dict[str, Any]]) -> int:
    return sum(1 for e in history if e["kind"] == "CallCompleted" and e["data"].get("kind") == "llm")


def _step_table(history: list[dict[str, Any]]) -> str:
    """One row per step execution, with its model calls, tokens and tool calls, and the crash."""
    from orchestrator.cli.term import table

    rows: list[list[Any]] = []
    calls: dict[str, list[dict[str, Any]]] = {}
    for event in history:
        kind, data = event["kind"], event["data"]
        if kind == "CallCompleted":
            calls.setdefault(data["step"], []).append(data)
        elif kind == "Resumed":
            rows.append(["-- resumed --", "", "", "", "", "", f"by {data.get('owner', '?')}"])
        elif kind == "WaitStarted":
            rows.append([data["step"], "waiting", "", "", "", "", f"for signal {data.get('name')!r}"])
        elif kind in ("StepCompleted", "StepFailed"):
            made = calls.pop(data["step"], [])
            llm = [c for c in made if c["kind"] == "llm"]
            tokens = sum(((c.get("response") or {}).get("usage") or {}).get("total_tokens") or 0 for c in llm)
            tools = sum(1 for c in made if c["kind"] == "tool")
            outcome = "completed" if kind == "StepCompleted" else ("failed" if data.get("final") else "retrying")
            note = (data.get("error") or {}).get("message", "") if kind == "StepFailed" else \
                ("; ".join(t.get("msg", "") for t in data.get("trace") or []) or "")
            rows.append([data["step"], outcome, f"{data.get('ms') or 0:.0f}", len(llm), tokens or "", tools or "",
                         note])
    return table(["STEP", "OUTCOME", "MS", "MODEL CALLS", "TOKENS", "TOOL CALLS", "NOTE"], rows)


def _report(orc: Any, run_id: str, path: str) -> None:
    report = getattr(orc, "report", None)
    if report is None:
        _say("   (no HTML report: this agentsaga has no orc.report yet)")
        return
    try:
        written = report(run_id, path)
    except OSError as exc:
        _say(f"   could not write the report to {path}: {exc.strerror or exc}")
        return
    _say(f"5. HTML report: {written}")


# -- the child process: runs the agent and dies of SIGKILL at the chosen point -----------------------
def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator.cli.demo")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--db", default=None)
    parser.add_argument("--kill-in", default="research", help="the step whose first journaled model call is fatal")
    args = parser.parse_args(argv)
    from orchestrator._orchestrator import Orchestrator

    agent, _, _ = _load(_EXAMPLES)
    orc = Orchestrator(args.db, workflows=[agent])
    append = orc.store.append

    def append_then_maybe_die(run: str, events: Any, **kw: Any) -> Any:
        # A real SIGKILL at a chosen point: just after the transaction holding the research loop's
        # first model answer committed. Everything before is durable; nothing after ran.
        out = append(run, events, **kw)
        for event in events:
            if event.kind == "CallCompleted":
                data = json.loads(event.data)
                if data.get("step") == args.kill_in and data.get("kind") == "llm":
                    os.kill(os.getpid(), signal.SIGKILL)
        return out

    orc.store.append = append_then_maybe_die  # type: ignore[method-assign]
    result = orc.run(agent, json.loads(args.input), run_id=args.run_id)
    print(f"child finished without being killed: {result.status}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
