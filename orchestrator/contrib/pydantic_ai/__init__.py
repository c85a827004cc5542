"""pydantic-ai agents made durable by agentsaga: ``pip install 'agentsaga[pydantic-ai]'``.

    from orchestrator.contrib.pydantic_ai import AgentsagaDurability, tool_context

``AgentsagaDurability`` is a pydantic-ai capability: attach it to an ``Agent`` and every model
request and tool call the agent makes inside an agentsaga step is a durable call of that step
(``_durability.py`` says what is journaled and why; docs/agents.md shows it in use). Importing
this package imports pydantic-ai; nothing else in ``orchestrator`` does.
"""

from orchestrator.contrib.pydantic_ai._durability import VOLATILE, AgentsagaDurability, ToolCallContext, tool_context

__all__ = ["AgentsagaDurability", "ToolCallContext", "tool_context", "VOLATILE"]
