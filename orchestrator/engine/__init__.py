"""The durable core: event kinds, the fold, the journal writer, the driver, retries, sagas,
durable calls, signals and timers, leases and code loading. Knows no HTTP, LLM, CLI or HTML.

Most programs never import from here (``orchestrator.Orchestrator`` is the entry point); these
names are for reading journals (``EventKind``, ``RunState``, ``fold``) and for wiring the engine
into something else (``Engine``).
"""

# Imported on first use (PEP 562): reading a journal (``EventKind``, ``fold``), what the audit and
# the CLI's read verbs do, must not load the driver, the group committer and the rest of the engine.
from orchestrator._lazy import lazy_exports

# Imported now, not lazily: ``fold`` is also the name of its module, and importing the module
# (which the audit does) would make the package's ``fold`` that module. What reading uses anyway.
from orchestrator.engine.fold import RunState, apply, fold

_LAZY = {
    "StepContext": "orchestrator.engine.context",
    "current_step": "orchestrator.engine.context",
    "Engine": "orchestrator.engine.core",
    "EngineConfig": "orchestrator.engine.core",
    "ACTIVE_STATUSES": "orchestrator.engine.events",
    "TERMINAL_STATUSES": "orchestrator.engine.events",
    "EventKind": "orchestrator.engine.events",
    "ActiveRun": "orchestrator.engine.journal",
    "JournalWriter": "orchestrator.engine.journal",
    "WorkflowRegistry": "orchestrator.engine.registry",
    "RunResult": "orchestrator.engine.result",
}

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

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
