"""agentsaga's orchestrator: durable, auditable runs of step-graph workflows.

The names most users need are here: ``Orchestrator``, ``RunResult``, ``StepContext`` and the
error tree. Each family has its own folder and imports: ``orchestrator.agents`` (model client,
prompts, tool loop, cassettes), ``orchestrator.scale`` (workers, limits), ``orchestrator.audit``
(summaries, verification, reports), ``orchestrator.tools`` (HTTP tool, breakers),
``orchestrator.engine`` (the journal's vocabulary and fold), ``orchestrator.payload`` (codec,
redaction), ``orchestrator.testing`` (a scripted model server, a booking service),
``orchestrator.contrib`` (OpenTelemetry).
"""

from typing import TYPE_CHECKING

from orchestrator._lazy import lazy_exports
from orchestrator.errors import (
    CircuitOpenError,
    CodeChangedError,
    ConfigurationError,
    EncodingError,
    GraphChangedError,
    InDoubtError,
    LoopLimitError,
    MigrationError,
    OrchestratorError,
    PermanentToolError,
    PromptError,
    ReplayError,
    ReplayMismatchError,
    ReplayMissingError,
    RetryableToolError,
    RunFailedError,
    JournalDamagedError,
    RunStateError,
    SavepointError,
    StepTimeoutError,
    ToolError,
    ToolLoopLimitError,
    WaitTimeoutError,
    WorkflowNotFoundError,
)
from store.errors import (
    FencedError,
    LeaseHeldError,
    RunNotFoundError,
    StoreError,
    StoreUnavailableError,
)

if TYPE_CHECKING:
    from orchestrator._orchestrator import Orchestrator
    from orchestrator.engine.context import StepContext
    from orchestrator.engine.result import RunResult

# Imported when first used: ``import orchestrator`` (and ``agentsaga --help``) need not load the
# engine, SQLAlchemy and pydantic; ``from orchestrator import Orchestrator`` does.
_LAZY = {"Orchestrator": "orchestrator._orchestrator", "StepContext": "orchestrator.engine.context",
         "RunResult": "orchestrator.engine.result"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

__all__ = [
    "Orchestrator",
    "RunResult",
    "StepContext",
    # the engine's errors (orchestrator.errors)
    "OrchestratorError",
    "ConfigurationError",
    "WorkflowNotFoundError",
    "GraphChangedError",
    "CodeChangedError",
    "MigrationError",
    "EncodingError",
    "StepTimeoutError",
    "LoopLimitError",
    "ToolLoopLimitError",
    "PromptError",
    "JournalDamagedError",
    "RunStateError",
    "SavepointError",
    "RunFailedError",
    "InDoubtError",
    "WaitTimeoutError",
    "ReplayError",
    "ReplayMismatchError",
    "ReplayMissingError",
    "ToolError",
    "RetryableToolError",
    "PermanentToolError",
    "CircuitOpenError",
    # the store's errors a caller meets (store.errors)
    "StoreError",
    "StoreUnavailableError",
    "RunNotFoundError",
    "FencedError",
    "LeaseHeldError",
]
