"""Test doubles users need too: a scripted OpenAI-compatible chat server on loopback."""

from orchestrator.testing.chatserver import ChatServer, Reply, error, reply, tool_call, tool_calls

__all__ = [
    "ChatServer",
    "Reply",
    "reply",
    "tool_call",
    "tool_calls",
    "error",
]
