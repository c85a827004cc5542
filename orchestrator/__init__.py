"""The engine: fold and replay, scheduling, retries, recovery, and the agentsaga CLI."""

from typing import Any

# The agent API (model client, prompts, tool loop, cassettes, the scripted chat server) is imported
# on first use: a process that only resumes runs should not pay for jinja2 and the LLM client.
_LAZY = {
    "LLM": "orchestrator._llm", "AsyncLLM": "orchestrator._llm", "ChatResult": "orchestrator._llm",
    "ToolCall": "orchestrator._llm",
    "Prompt": "orchestrator._prompts", "Prompts": "orchestrator._prompts",
    "RenderedPrompt": "orchestrator._prompts", "PromptError": "orchestrator._prompts",
    "ToolRegistry": "orchestrator._agent_tools", "ToolContext": "orchestrator._agent_tools",
    "LoopResult": "orchestrator._agent_tools", "run_tool_loop": "orchestrator._agent_tools",
    "arun_tool_loop": "orchestrator._agent_tools", "ToolLoopLimitError": "orchestrator._agent_tools",
    "Cassette": "orchestrator._cassette", "ChatServer": "orchestrator._chatserver",
    "Worker": "orchestrator._worker", "Limits": "orchestrator._limits", "QueueLimit": "orchestrator._limits",
    "Stats": "orchestrator._stats", "collect_stats": "orchestrator._stats",
    "enable_tracing": "orchestrator._otel", "Tracing": "orchestrator._otel",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


from orchestrator._gc import GcReport
from orchestrator._summary import RunSummary
from orchestrator._verify import VerifyProblem, VerifyReport
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
    "Worker",
    "Limits",
    "QueueLimit",
    "Stats",
    "collect_stats",
    "enable_tracing",
    "Tracing",
    "GcReport",
    "RunSummary",
    "VerifyProblem",
    "VerifyReport",
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
