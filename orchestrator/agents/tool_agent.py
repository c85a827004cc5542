"""``tool_agent``: the most common agent, a model with tools answering a question, as a ready workflow.

    def weather(city: str) -> str:
        '''Today's weather in a city.'''
        ...

    agent = tool_agent("umbrella", [weather])
    result = Orchestrator().run(agent, {"question": "Umbrella in Lisbon?"}, run_id="u1")
    print(result.state["answer"])

The workflow has one step, ``agent``, which runs the tool-calling loop (``run_tool_loop``) on the
input's ``question`` and stores the model's final text as ``answer``. Every model request and tool
call is a durable call of that step, so a run resumed after a crash asks the model nothing it had
already answered and runs no tool it had already run. With effect tools (a ``ToolRegistry`` whose
tools say ``effect=True, compensate=...``) the step is an effect compensated by the registry: a run
that fails for good undoes them newest first.

Write the step yourself (``run_tool_loop`` inside ``@wf.step``) as soon as the agent needs more than
one question and one answer: a plan before the loop, a human's approval after it, several loops.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.agents.llm import LLM
from orchestrator.agents.tool_loop import ToolRegistry, run_tool_loop
from workflows import Workflow

__all__ = ["tool_agent"]


def tool_agent(name: str, tools: ToolRegistry | Iterable[Callable[..., Any]], *, llm: LLM | None = None,
               system: str | None = None, max_iterations: int = 8, version: str = "1") -> Workflow:
    """A workflow ``name`` whose one step lets the model call ``tools`` until it answers the input's
    ``question`` (see the module docstring). ``llm`` defaults to ``LLM()`` (``OPENAI_BASE_URL``,
    ``OPENAI_MODEL``, ``OPENAI_API_KEY``), made at the first call; ``system`` is a system message."""
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    if not registry.names():
        raise ValueError(f"tool_agent {name!r}: give it at least one tool (a plain function)")
    if system is not None and not isinstance(system, str):
        raise TypeError(f"tool_agent {name!r}: system must be a string, got {type(system).__name__}")
    effects = [n for n in registry.names() if registry[n].effect]
    undo = [n for n in effects if registry[n].compensate is None]
    if undo:
        raise ValueError(f"tool_agent {name!r}: effect tool(s) {', '.join(undo)} need compensate=..., so that a "
                         "run that fails can undo them")
    models: list[LLM] = [llm] if llm is not None else []
    lock = threading.Lock()

    def model() -> LLM:
        with lock:  # made at the first call, not at import: importing the workflow stays cheap
            if not models:
                models.append(LLM())
            return models[0]

    wf = Workflow(name, version=version, description="a model answering the question with tools")
    caller = sys._getframe(1).f_globals  # where the workflow lives is the caller's module, not this one
    wf.module, wf.module_file = caller.get("__name__"), caller.get("__file__")

    def agent(ctx: Any, state: Any) -> dict[str, Any]:
        question = state.get("question") if isinstance(state, dict) else getattr(state, "question", None)
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"tool_agent {name!r}: the run's input needs a 'question' (a non-empty string), "
                             f"got {question!r}")
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": question})
        out = run_tool_loop(ctx, model(), messages, registry, max_iterations=max_iterations)
        return out.update(answer=out.content)

    wf.step(agent, compensate=registry.compensate if effects else None)
    return wf
