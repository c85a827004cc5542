"""The engine: fold and replay, scheduling, retries, recovery, and the agentsaga CLI."""

from typing import Any

# The agent API (model client, prompts, tool loop, cassettes, the scripted chat server) is imported
# on first use: a process that only resumes runs should not pay for jinja2 and the LLM client.
_LAZY = {
    "LLM": "orchestrator.agents.llm", "AsyncLLM": "orchestrator.agents.llm", "ChatResult": "orchestrator.agents.llm",
    "ToolCall": "orchestrator.agents.llm",
    "Prompt": "orchestrator.agents.prompts", "Prompts": "orchestrator.agents.prompts",
    "RenderedPrompt": "orchestrator.agents.prompts", "PromptError": "orchestrator.agents.prompts",
    "ToolRegistry": "orchestrator.agents.tool_loop", "ToolContext": "orchestrator.agents.tool_loop",
    "LoopResult": "orchestrator.agents.tool_loop", "run_tool_loop": "orchestrator.agents.tool_loop",
    "arun_tool_loop": "orchestrator.agents.tool_loop", "ToolLoopLimitError": "orchestrator.agents.tool_loop",
    "Cassette": "orchestrator.agents.cassette", "ChatServer": "orchestrator.testing.chatserver",
    "Worker": "orchestrator.scale.worker", "Limits": "orchestrator.scale.limits", "QueueLimit": "orchestrator.scale.limits",
    "Stats": "orchestrator.audit.stats", "collect_stats": "orchestrator.audit.stats",
    "enable_tracing": "orchestrator.contrib.otel", "Tracing": "orchestrator.contrib.otel",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


from orchestrator.audit.gc import GcReport
from orchestrator.audit.summary import RunSummary
from orchestrator.audit.verify import VerifyProblem, VerifyReport
from orchestrator.payload.codec import dumps as encode_json
from orchestrator.payload.codec import loads as decode_json
from orchestrator.engine.context import StepContext
from orchestrator.engine.events import ACTIVE_STATUSES, TERMINAL_STATUSES, EventKind
from orchestrator.engine.fold import RunState, apply, fold
from orchestrator._orchestrator import Orchestrator
from orchestrator.engine.result import RunResult
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
