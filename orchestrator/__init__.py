"""The engine: fold and replay, scheduling, retries, recovery, and the agentsaga CLI."""

from orchestrator._codec import dumps as encode_json
from orchestrator._codec import loads as decode_json
from orchestrator._context import StepContext
from orchestrator._events import ACTIVE_STATUSES, TERMINAL_STATUSES, EventKind
from orchestrator._fold import RunState, apply, fold
from orchestrator._orchestrator import Orchestrator
from orchestrator._result import RunResult
from orchestrator.errors import (
    ConfigurationError,
    EncodingError,
    GraphChangedError,
    LoopLimitError,
    OrchestratorError,
    RunFailedError,
    RunStateError,
    StepTimeoutError,
    WaitTimeoutError,
    WorkflowNotFoundError,
    ReplayError,
    ReplayMismatchError,
    ReplayMissingError,
    InDoubtError,
    ToolError,
    RetryableToolError,
    PermanentToolError,
    CircuitOpenError,
)
from store.errors import FencedError, LeaseHeldError, RunNotFoundError, StoreError, StoreUnavailableError

__all__ = [
    "ACTIVE_STATUSES",
    "TERMINAL_STATUSES",
    "ConfigurationError",
    "EncodingError",
    "EventKind",
    "FencedError",
    "GraphChangedError",
    "LeaseHeldError",
    "LoopLimitError",
    "Orchestrator",
    "OrchestratorError",
    "RunFailedError",
    "RunNotFoundError",
    "RunResult",
    "RunState",
    "RunStateError",
    "StepContext",
    "StepTimeoutError",
    "StoreError",
    "StoreUnavailableError",
    "WorkflowNotFoundError",
    "WaitTimeoutError",
    "ReplayError",
    "ReplayMismatchError",
    "ReplayMissingError",
    "InDoubtError",
    "ToolError",
    "RetryableToolError",
    "PermanentToolError",
    "CircuitOpenError",
    "apply",
    "decode_json",
    "encode_json",
    "fold",
]
