"""Agents on the engine: an OpenAI-compatible model client whose calls are durable, jinja2 prompts,
the tool-calling loop, and cassettes for replaying a run with no network."""

from orchestrator.agents.cassette import Cassette
from orchestrator.agents.llm import LLM, AsyncLLM, ChatResult, ToolCall
from orchestrator.agents.prompts import Prompt, Prompts, RenderedPrompt
from orchestrator.agents.tool_agent import tool_agent
from orchestrator.agents.tool_loop import LoopResult, ToolContext, ToolRegistry, arun_tool_loop, run_tool_loop
from orchestrator.errors import PromptError, ToolLoopLimitError

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
    "tool_agent",
    "ToolLoopLimitError",
    "Cassette",
]
