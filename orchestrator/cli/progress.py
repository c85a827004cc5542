"""Progress lines while a run executes: one per finished step, failed attempt, compensation and end.

An observer given to the Orchestrator by the CLI (``--progress``, or by default when stderr is a
terminal). It runs after each commit, so a line is only printed for what is durable. The engine
pays one ``if`` per commit when progress is off; when on, only the events shown are decoded.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from orchestrator.payload import codec
from orchestrator.audit.describe import headline
from orchestrator.cli.term import clip
from store import NewEvent

if TYPE_CHECKING:
    from orchestrator.engine.journal import ActiveRun

__all__ = ["Progress"]

_SHOWN = frozenset({
    "StepCompleted", "StepFailed", "CompensationCompleted", "CompensationFailed", "SagaStarted", "SagaCompleted",
    "SagaFailed", "RolledBack", "RunCompleted", "RunFailed", "RunCancelled", "WaitStarted", "WaitTimedOut",
    "TimerStarted",
})


class Progress:
    """An observer ``(run, events)`` printing to ``stream`` (stderr by default)."""

    def __init__(self, stream: TextIO | None = None, *, width: int = 160) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.started = time.monotonic()

    def __call__(self, run: ActiveRun, events: list[NewEvent]) -> None:
        run_id = run.run_id
        try:
            for event in events:
                if event.kind not in _SHOWN:
                    continue
                data = codec.loads(event.data)
                text = headline(event.kind, data)
                error = data.get("error")
                if isinstance(error, dict) and error.get("type"):  # history shows it on its own line
                    text += f" [{error['type']}: {error.get('message')}]"
                line = f"[{time.monotonic() - self.started:7.2f}s] {run_id} #{event.seq} {event.kind} {text}"
                print(clip(line, self.width), file=self.stream, flush=True)
        except Exception:  # a progress line must never fail the run it describes (a closed pipe, say)
            pass
