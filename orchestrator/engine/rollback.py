"""Where a rollback returns to: a journal seq at a tick boundary, found from a seq or a step name.

``Engine.rollback`` compensates the effects recorded after that point (newest first) and appends
``RolledBack``: history is not rewritten (invariant 7).
"""

from __future__ import annotations

from typing import Any

from orchestrator.engine.events import EventKind
from orchestrator.engine.fold import RunState, apply
from orchestrator.errors import RunStateError

__all__ = ["checkpoint_seq"]


def checkpoint_seq(run_id: str, events: list[tuple[int, str, Any]], to: int | str) -> int:
    """The journal seq a rollback returns to: a seq, or the tick start of a step's last execution."""
    last = events[-1][0] if events else 0
    if isinstance(to, bool) or not isinstance(to, (int, str)):
        raise RunStateError(f"rollback target must be a seq or a step name, got {to!r}")
    if isinstance(to, int):
        if not 1 <= to <= last:
            raise RunStateError(f"run {run_id!r} has no checkpoint at seq {to}: its journal holds seq 1..{last}")
        return to
    completions = [d for _, kind, d in events if kind == EventKind.STEP_COMPLETED and d["step"] == to]
    if not completions:
        raise RunStateError(f"run {run_id!r} has no completed step {to!r} to roll back to")
    state_at = completions[-1].get("input", {}).get("state_at")
    if state_at is None:  # the step declared reads=: find its tick's start by folding
        tick = completions[-1]["tick"]
        folded = RunState()
        for seq, kind, data in events:
            if folded.tick == tick and not folded.done and folded.seq:
                return folded.seq
            apply(folded, seq, kind, data)
        raise RunStateError(f"cannot locate the start of step {to!r}'s tick in run {run_id!r}")
    return int(state_at)
