"""The durable core: event kinds, the fold, the journal writer, the driver, retries, sagas,
durable calls, signals and timers, leases and code loading. Knows no HTTP, LLM, CLI or HTML.

Most programs never import from here (``orchestrator.Orchestrator`` is the entry point); these
names are for reading journals (``EventKind``, ``RunState``, ``fold``) and for wiring the engine
into something else (``Engine``).
"""

from orchestrator.engine.context import StepContext, current_step
from orchestrator.engine.core import Engine, EngineConfig
from orchestrator.engine.events import ACTIVE_STATUSES, TERMINAL_STATUSES, EventKind
from orchestrator.engine.fold import RunState, apply, fold
from orchestrator.engine.journal import ActiveRun, JournalWriter
from orchestrator.engine.registry import WorkflowRegistry
from orchestrator.engine.result import RunResult

__all__ = [
    "Engine",
    "EngineConfig",
    "EventKind",
    "ACTIVE_STATUSES",
    "TERMINAL_STATUSES",
    "RunState",
    "fold",
    "apply",
    "ActiveRun",
    "JournalWriter",
    "WorkflowRegistry",
    "StepContext",
    "current_step",
    "RunResult",
]
