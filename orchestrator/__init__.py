"""The engine: fold and replay, scheduling, retries, recovery, and the agentsaga CLI."""

from orchestrator._agent_tools import (
    LoopResult,
    ToolContext,
    ToolLoopLimitError,
    ToolRegistry,
    arun_tool_loop,
    run_tool_loop,
)
from orchestrator._cassette import Cassette
from orchestrator._chatserver import ChatServer
from orchestrator._codec import dumps as encode_json
from orchestrator._codec import loads as decode_json
from orchestrator._context import StepContext
from orchestrator._events import ACTIVE_STATUSES, TERMINAL_STATUSES, EventKind
from orchestrator._fold import RunState, apply, fold
from orchestrator._llm import LLM, AsyncLLM, ChatResult, ToolCall
from orchestrator._prompts import Prompt, PromptError, Prompts, RenderedPrompt
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
    "LLM",
    "AsyncLLM",
    "ChatResult",
    "ToolCall",
    "Prompt",
    "Prompts",
    "RenderedPrompt",
    "PromptError",
    "ToolRegistry",
    "ToolContext",
    "LoopResult",
    "run_tool_loop",
    "arun_tool_loop",
    "ToolLoopLimitError",
    "Cassette",
    "ChatServer",
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
