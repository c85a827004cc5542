"""Runs examples/travel_booking.py's saga in a child process that SIGKILLs itself at a chosen point.

    python tests/orchestrator/sagachild.py DB_URL RUN_ID API_URL CARD CRASH

CRASH:
    sent:STEP        after STEP's request reached the service, before its response is journaled
    intent:STEP      after STEP's response was journaled, before the step's completion is
    result:STEP      right after the transaction holding STEP's completion committed
    undone:STEP      right after the compensation of STEP's effect committed
    undoing:STEP     after the compensation's request reached the service, before it is journaled
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def main(argv: list[str]) -> int:
    url, run_id, api, card, crash = argv
    os.chdir(ROOT)
    from orchestrator import Orchestrator
    from orchestrator.engine.loader import load_target

    trip = load_target("examples/travel_booking.py:trip")
    orc = Orchestrator(url, workflows=[trip])
    real_append = orc.store.append
    effect_steps: dict[int, str] = {}

    def append(run, events, **kw):
        for event in events:
            data = json.loads(event.data)
            if event.kind == "StepCompleted":
                effect_steps[event.seq] = data["step"]
                if crash == f"intent:{data['step']}":
                    os.kill(os.getpid(), signal.SIGKILL)
            if event.kind == "CallCompleted" and crash == f"sent:{data['step']}":
                os.kill(os.getpid(), signal.SIGKILL)
            if event.kind == "CompensationCompleted" and crash == f"undoing:{data['step']}":
                os.kill(os.getpid(), signal.SIGKILL)
        real_append(run, events, **kw)
        for event in events:
            data = json.loads(event.data)
            if event.kind == "StepCompleted" and crash == f"result:{data['step']}":
                os.kill(os.getpid(), signal.SIGKILL)
            if event.kind == "CompensationCompleted" and crash == f"undone:{data['step']}":
                os.kill(os.getpid(), signal.SIGKILL)

    orc.store.append = append  # type: ignore[method-assign]
    result = orc.run(trip, {"api": api, "city": "Lisbon", "nights": 2, "card": card}, run_id=run_id)
    print(result.status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
