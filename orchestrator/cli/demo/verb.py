"""``agentsaga demo``: the research-and-book agent, SIGKILLed midway, resumed, approved, reported.

    agentsaga demo [--db URL] [--manual-approval] [--report FILE]

What it shows, in order:

1. a scripted OpenAI-compatible model server and the booking service start on 127.0.0.1 (with
   ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set, the real model is used instead);
2. the agent (``agent.py``) runs in a child process (``child.py``) that is killed with a real
   SIGKILL right after the research loop's first model answer became durable (a paid call);
3. this process resumes the run: the model server's request count shows that the answer journaled
   before the crash is not asked for (nor paid for) again;
4. the run waits for approval; the demo sends it (``--manual-approval``: you do, with the printed
   ``agentsaga signal`` command from another terminal), and the run books and answers;
5. the run's step table, and the HTML report (``orc.report``) is written.

Everything it runs ships in the package (no source checkout needed). ``cli/commands.py`` wires the
verb with ``add_demo_verb(sub, verb)``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.cli.common import UsageError
from orchestrator.cli.demo.steps import llm_calls, step_table

__all__ = ["add_demo_verb", "cmd_demo", "shared_database"]

_DEMO_KEY = "demo-key-0000"  # the scripted server checks it; the journal never sees it
# By name, not imported: runpy warns when ``python -m`` runs a module its package already imported.
_CHILD = "orchestrator.cli.demo.child"


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


def shared_database(db: str | None) -> str:
    """The database URL that the demo, its child and the commands it prints all mean the same by.

    The default (``AGENTSAGA_DB``, else ``sqlite:///agentsaga.db``) depends on the environment
    and the working directory, and another terminal has neither: a relative SQLite path is made
    absolute, so a printed ``--db URL`` works from anywhere. An in-memory SQLite database cannot
    be shared with the child process at all.
    """
    from store import default_url

    url = db or default_url()
    if not url.startswith("sqlite:"):
        return url
    rest = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    path, sep, query = rest.partition("?")
    if not path or path == ":memory:" or "mode=memory" in query:
        raise UsageError(f"agentsaga demo needs a database its child process can share (a SQLite file or "
                         f"Postgres), not the in-memory SQLite of {url!r}")
    if path.startswith("file:") or os.path.isabs(path):
        return url  # a URI filename or an absolute path: already the same from anywhere
    return f"sqlite:///{os.path.abspath(path)}{sep}{query}"


def cmd_demo(args: argparse.Namespace) -> int:
    from orchestrator.testing import BookingService, ChatServer

    db = shared_database(args.db)
    real = bool(os.environ.get("OPENAI_BASE_URL") and os.environ.get("OPENAI_API_KEY"))
    server = None if real else ChatServer(None, api_key=_DEMO_KEY)
    if server is not None:
        # Before the agent is imported: its module-level LLM reads these (and the child inherits them).
        os.environ.update(OPENAI_BASE_URL=server.start(), OPENAI_API_KEY=_DEMO_KEY, OPENAI_MODEL=server.model)
    try:
        from orchestrator.cli.demo.agent import agent, DEFAULT_INPUT
        from orchestrator.cli.demo.model import scripted_model

        if server is not None:
            server.script(scripted_model)
        with BookingService() as service:
            return _demo(args, db, agent, {**DEFAULT_INPUT, "api": service.url}, service, server)
    finally:
        if server is not None:
            server.stop()


def _demo(args: argparse.Namespace, db: str, agent: Any, state: dict[str, Any], service: Any, server: Any) -> int:
    from orchestrator import Orchestrator

    db_flag = f" --db {shlex.quote(db)}"  # always: the user's other terminal may not share our defaults
    run_id = f"demo-{secrets.token_hex(4)}"
    model = f"scripted model at {server.url}" if server else f"{os.environ.get('OPENAI_MODEL') or 'gpt-4o-mini'} at " \
                                                              f"{os.environ['OPENAI_BASE_URL']}"
    _say(f"agentsaga demo: run {run_id}\n  database: {db}\n  model:    {model}\n  bookings: {service.url}\n")

    _say("1. The agent runs in a child process, killed with SIGKILL right after a paid model call is journaled")
    child = [sys.executable, "-m", _CHILD, "--child", "--run-id", run_id, "--input", json.dumps(state),
             "--db", db]
    killed = subprocess.run(child, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    if killed.returncode != -signal.SIGKILL:
        _say(f"   the child was not killed (exit {killed.returncode}):\n{killed.stderr.strip()[-2000:]}")
        return 1
    _say(f"   child died of SIGKILL; model requests so far: {server.count if server else '(real model)'}")

    with Orchestrator(db, workflows=[agent]) as orc:
        _say(f"\n2. Resuming run {run_id} in this process")
        result = orc.resume(run_id)
        if server:
            _say(f"   model requests now: {server.count}; model calls in the journal: {llm_calls(orc.history(run_id))} "
                 f"(the answer journaled before the crash was reused, not paid for again)")
        _say(f"   status: {result.status}")
        if result.status == "waiting":
            result = _approve(args, orc, run_id, db_flag)
        history = orc.history(run_id)
        _say(f"\n4. Run {run_id}: {result.status}" + (f" ({result.error})" if result.error else ""))
        _say(step_table(history))
        if server:
            _say(f"\n   model requests served: {server.count}; model calls journaled: {llm_calls(history)}")
        bookings = [e for e in service.ledger() if e["action"] in ("book", "cancel", "replay")]
        _say("   booking service: " + (", ".join(f"{e['action']} {e.get('id')}" for e in bookings) or "nothing"))
        answer = result.state.get("answer") if isinstance(result.state, dict) else None
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
    declined = json.dumps({"approved": False, "reason": "too expensive"})
    _say(f"\n3. The run waits for your approval. From another terminal run:\n\n"
         f"   agentsaga signal {run_id} approval --data {shlex.quote(data)}{db_flag}\n\n"
         f"   (or --data {shlex.quote(declined)} to decline). Waiting...")
    while not orc.store.signals.pending(run_id, "approval"):
        if orc.get_run(run_id).status != "waiting":
            break  # someone else (a worker, `agentsaga recover`) already continued it
        time.sleep(0.5)
    _say("   approval received; continuing")
    return orc.resume(run_id)


def _report(orc: Any, run_id: str, path: str) -> None:
    try:
        written = orc.report(run_id, path)
    except OSError as exc:
        _say(f"   could not write the report to {path}: {exc.strerror or exc}")
        return
    _say(f"5. HTML report: {Path(written).resolve()}")
