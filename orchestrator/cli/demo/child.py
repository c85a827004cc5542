"""The demo's child process: runs the agent and dies of a real SIGKILL at the chosen point.

    python -m orchestrator.cli.demo.child --child --run-id ID --input JSON --db URL

Started by ``agentsaga demo`` (``verb.py``) with the model server's address in its environment;
``--child`` guards against running it by hand by mistake, since it kills itself on purpose.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

__all__ = ["main"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.cli.demo.child",
                                     description="agentsaga demo's child process (started by `agentsaga demo`)")
    parser.add_argument("--child", action="store_true", required=True, help="confirm: this process SIGKILLs itself")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--input", required=True, help="the run's input as JSON")
    parser.add_argument("--db", required=True, help="the database URL the parent resumes from")
    parser.add_argument("--kill-in", default="research", help="the step whose first journaled model call is fatal")
    args = parser.parse_args(argv)

    # Imported here, after the environment the parent set up is in place: the agent's module reads
    # OPENAI_MODEL when it is imported (its LLM reads the base URL and key at each call).
    from orchestrator import Orchestrator
    from orchestrator.cli.demo.agent import agent

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
    sys.exit(main(sys.argv[1:]))
