"""The pydantic-ai durability capability (``pip install 'agentsaga[pydantic-ai]'``).

    from pydantic_ai import Agent
    from orchestrator.contrib.pydantic_ai import AgentsagaDurability, tool_context

    durability = AgentsagaDurability(effects={"book_hotel": cancel_hotel})
    agent = Agent(model, name="planner", deps_type=Deps, capabilities=[durability])

    @agent.tool
    async def book_hotel(ctx: RunContext[Deps], city: str) -> dict:
        key = tool_context().idempotency_key             # stable across crashes and retries
        return await ctx.deps.bookings.post("/hotels", json={"city": city}, headers={"Idempotency-Key": key})

    @flow.step(effect=True, compensate=durability.compensate)
    async def plan(ctx, state):
        result = await agent.run(state["question"], deps=make_deps(ctx))   # durable inside a step
        return {"answer": result.output}

Inside an agentsaga step, every model request and every tool call of the agent is a durable call
of the step (``ctx.adurable_call``): journaled as ``CallCompleted`` the moment it returns, and
answered from the journal when the step runs again (a crash, a retry, a wake-up), so a completed
model request is never paid for twice and a completed tool call never runs twice. Outside a step
the capability is transparent: the agent runs as it always does.

Delegation. An agent run inside a tool call (a tool that delegates to another agent) is durable
too: its model requests and tool calls are durable calls made inside the tool's call, numbered
under it (``"3.0"``, ``"3.1"``... inside call 3; see ``orchestrator.engine.context.CallScope``).
When the step runs again, a completed tool call is answered from the journal and the agent inside
it does not run; a tool call that had not completed runs again, and the requests its agent had
journaled are answered from the journal, not paid for again.

Built on pydantic-ai's public engine-builder surface (``pydantic_ai.durable_exec``): a
``BaseDurabilityCapability`` whose backend is a ``JournalCallableOperationBackend``, the tier for
engines that run a callback in a named durable unit in the same process (Prefect's and Restate's
shape). pydantic-ai assembles the durable model and toolsets; this module only decides what each
unit journals. Values cross as JSON (``JSON_CODEC``), because the journal stores JSON.

What is journaled (``docs/agents.md`` has the table):

- a model request: kind ``llm``, request ``{"agent", "model", "messages", "parameters",
  "settings"?}``; response the ``ModelResponse`` as pydantic-ai's JSON. The request's messages
  leave out what pydantic-ai makes anew on every execution (``timestamp``, ``run_id``,
  ``conversation_id`` of each message and part; see ``VOLATILE``) and ``None`` fields, so a resumed run asks for the same request and gets
  the journaled answer; a request that really differs (a changed prompt, instructions or tool list)
  is performed again and journaled with ``replaced: true`` (``if_changed="perform"``, the default;
  ``"raise"`` refuses with ``CallChangedError`` showing the difference instead).
- a tool call: kind ``tool``, request ``{"agent", "tool", "call_id", "arguments"}``; response
  pydantic-ai's ``CallToolResult`` (``{"kind": "tool_return", "result"}``, or a retry prompt the
  model gets back). A tool that raises is journaled as ``CallFailed`` and fails the step (its
  ``Retry`` applies), as it would fail the agent run.
- anything else pydantic-ai makes durable (MCP or dynamic tool discovery, custom argument
  validators, an event-stream handler, a run's start time for ``timeout=``): kind ``pydantic-ai``,
  request ``{"agent", "operation", ...}``.

Order. Tool calls run one after another inside a step (``sequential_tools_in_durable_context``),
in the order the model listed them: durable calls are matched by position, and parallel tool
calls would number differently on every execution. After a crash the tool calls already journaled
are not run again and the rest run in order; the one that was running when the process died runs
again (an effect tool with the same idempotency key).

Effects. Every tool call has the key ``"{step key}:{agent}:{index}:{tool call id}"``
(``tool_context().idempotency_key``, sent by ``tool_context().http``): the step key is
``ctx.idempotency_key`` (run, step, tick) and ``index`` the call's position in the step execution
(``3`` or, for a tool of an agent run inside call 3, ``3.1``), so the key is the same when the call
is re-sent after a crash and differs for two agent runs in one step even when a model reuses tool
call ids. ``effects={"tool name": undo}`` marks the tools that
change the world: a completed call of one is journaled as an effect of its own the moment it
returns; make the step ``effect=True, compensate=durability.compensate`` and the saga undoes them
newest first with ``undo(tctx, record)`` when the run fails (``tctx.idempotency_key ==
f"{key}:compensate"``).

Dependencies. ``deps`` are never journaled (they are live objects: clients, connections). A step
runs again from its first line after a crash, so the deps a step builds for ``agent.run(deps=...)``
are built again by the resuming process: write them as a factory of the step context
(``make_deps(ctx)``). Give the same factory as ``AgentsagaDurability(deps=make_deps)`` and
compensations get ``tctx.deps`` from it too (they run later, with no agent run around them).

Streaming (``agent.run_stream`` and friends in a step): each model request is one durable call
that consumes the stream inside the call and journals the final ``ModelResponse`` when it ends;
the caller gets that response whole. To see tokens as they come, give the capability an
``event_stream_handler``: it gets the model's events live, inside the call. A crash mid-stream
journals nothing for that request: the resumed step asks the model again and the handler sees the
new stream from its start. A request whose response was journaled is not streamed again when the
step runs again: the journaled response comes back whole and the handler sees no events for it.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
    conversation_id_from_run_id,
)
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.tools import AgentDepsT, RunContext

from orchestrator.engine.context import StepContext, current_step
from orchestrator.errors import EncodingError

__all__ = ["AgentsagaDurability", "ToolCallContext", "tool_context", "VOLATILE"]

#: Keys left out of a journaled request's messages and parts: pydantic-ai sets them anew on every execution
#: (when a message or part was made, which agent run made it), so they would make every resumed
#: request look changed. They stay in the journaled *responses*.
VOLATILE = frozenset({"timestamp", "run_id", "conversation_id"})

_MODEL_PARAMETERS = TypeAdapter(ModelRequestParameters)


@dataclass(slots=True)
class ToolCallContext:
    """What a tool call (or a compensation undoing one) knows about where it runs.

    ``step`` is the agentsaga step's context (``run_id``, ``trace``...), ``idempotency_key`` the
    call's own key (``...:compensate`` in a compensation), ``deps`` the deps (the run's inside a tool
    call; built by ``AgentsagaDurability(deps=...)`` in a compensation)."""

    step: StepContext
    agent: str
    tool: str
    call_id: str | None
    idempotency_key: str | None
    deps: Any = None
    _sub: Any = field(default=None, repr=False)  # the step tools made for this key

    @property
    def http(self) -> Any:
        """HTTP for this call, sending its key: plain requests recorded with the step's journal event,
        sent again (with the same key) when the tool call runs again."""
        if self.idempotency_key is None:
            raise RuntimeError("tool_context().http is only available while a tool call is performed in a step")
        if self._sub is None:
            self._sub = self.step.tools.with_key(self.idempotency_key)
        return self._sub.http

    def _merge(self) -> None:
        """The call's HTTP records join the step's journal event (as the tool loop's do)."""
        if self._sub is not None:
            self.step.tools.calls.extend(self._sub.calls)
            self.step.tools.transitions.extend(self._sub.transitions)
            self._sub = None


_TOOL_CALL: ContextVar[ToolCallContext | None] = ContextVar("agentsaga_pydantic_ai_tool_call", default=None)


def tool_context() -> ToolCallContext | None:
    """The tool call being performed durably (inside a tool function), or None."""
    return _TOOL_CALL.get()


class _StepRuns:
    """Per step execution: how many agent runs it started, at the top of the step and inside each
    durable call (a run's ordinal there makes its default id)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[int | str | None, int] = {}


# Keyed weakly by the step's context: the count goes with the step execution.
_RUNS: weakref.WeakKeyDictionary[StepContext, _StepRuns] = weakref.WeakKeyDictionary()


class AgentsagaDurability(BaseDurabilityCapability[AgentDepsT]):
    """The capability that makes a pydantic-ai agent durable inside agentsaga steps.

    - ``effects``: tool name -> compensation ``undo(tctx, record)`` for tools that change the world
      (``record``: ``{"agent", "tool", "call_id", "arguments", "result", "key"}``).
    - ``deps``: a factory ``(step_ctx) -> deps`` for compensations (see the module docstring).
    - ``if_changed``: ``"perform"`` (default) performs a request that differs from the journaled one
      again, visibly (``replaced``); ``"raise"`` refuses with ``CallChangedError``.
    - ``name``, ``models``, ``event_stream_handler``: as for pydantic-ai's other engines (the agent's
      ``name`` is used by default and appears in every journaled request).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="agentsaga",
        durable_unit_noun="durable call",
        durable_unit_plural="durable calls",
        durable_container_noun="step",
        codec=JSON_CODEC,  # the journal stores JSON
        serialization_failure=lambda exc: EncodingError(f"a pydantic-ai value cannot be journaled as JSON: {exc}"),
        # Tools passed to one run (agent.run(toolsets=...)) would bypass the wrapping: refused in a step.
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit", "dynamic": "enter-never"},
        journal_discovery=True,
        # Durable calls are matched by position: tool calls must run in a fixed order.
        sequential_tools_in_durable_context=True,
    )

    def __init__(self, *, effects: Mapping[str, Callable[..., Any]] | None = None,
                 deps: Callable[[StepContext], Any] | None = None, if_changed: str = "perform",
                 name: str | None = None, models: Mapping[str, Any] | None = None,
                 event_stream_handler: Any = None) -> None:
        if if_changed not in ("perform", "raise"):
            raise ValueError(f"if_changed must be 'perform' or 'raise', got {if_changed!r}")
        for tool, undo in (effects or {}).items():
            if not callable(undo):
                raise TypeError(f"effects[{tool!r}] must be a compensation undo(tctx, record), got {undo!r}")
        if deps is not None and not callable(deps):
            raise TypeError(f"deps must be a factory (step_ctx) -> deps, got {deps!r}")
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self.effects: dict[str, Callable[..., Any]] = dict(effects or {})
        self.deps_factory = deps
        self.if_changed = if_changed
        self._backend: _Backend | None = None

    # -- where we are --------------------------------------------------------------------------------
    @property
    def in_durable_context(self) -> bool:
        return current_step() is not None

    def _step(self) -> StepContext | None:
        return current_step() if self.in_durable_context else None

    def get_default_run_id(self) -> str | None:
        step = self._step()
        if step is None:
            return None
        runs = _RUNS.setdefault(step, _StepRuns())
        # The n-th agent run of a step execution is the n-th again when the step runs again; one run
        # inside a durable call (a delegate of a tool) is counted within that call, which a resumed
        # step may answer from the journal without running it.
        inside = step.call_position
        n = runs.counts[inside] = runs.counts.get(inside, 0) + 1
        if inside is None:
            return f"{step.idempotency_key}:{self.name}:{n}"
        return f"{step.idempotency_key}:{self.name}:{inside}/{n}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    def get_run_clock(self) -> Callable[[], datetime] | None:
        step = self._step()
        return step.now if step is not None else None  # the Orchestrator's injected clock

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        step = self._step()
        if step is None:
            return None
        # Journaled, so a resumed run counts its timeout= from when it first started.
        stamp = await step.adurable_call("pydantic-ai", {"agent": self.name, "operation": "run_start_time"},
                                         lambda: step.now().isoformat())
        return datetime.fromisoformat(stamp)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: Any) -> Any:
        step = self._step()
        if step is not None:
            # The agent's tool calls send keys made from the step's key: in an effect step, say so
            # before anything leaves, so a crash mid-run resumes the step (the journaled calls are
            # not repeated) instead of leaving it in doubt (docs/sagas.md, in-doubt rules).
            step.key_sent()
        return await super().wrap_run(ctx, handler=handler)

    # -- the engine ---------------------------------------------------------------------------------
    def _bind_to_agent(self, agent: Any) -> None:
        self._backend = _Backend(self)
        super()._bind_to_agent(agent)

    def get_durable_operation_backend(self) -> _Backend:
        if self._backend is None:
            self._backend = _Backend(self)
        return self._backend

    # -- compensation -------------------------------------------------------------------------------
    async def compensate(self, ctx: StepContext, effect: Any) -> list[str]:
        """A step compensation: undo the effect tools the step's agent runs completed, newest first.

        ``effect`` is one tool call's own record (the step failed before returning) or the step's
        record with its calls' effects joined to it (the step completed, a later one failed)."""
        undone = []
        deps = None
        if self.deps_factory is not None:
            deps = self.deps_factory(ctx)
            if inspect.isawaitable(deps):
                deps = await deps
        for record in reversed(_tool_records(effect)):
            undo = self.effects.get(record.get("tool"))
            if undo is None:
                raise LookupError(f"tool effect {record.get('tool')!r} (key {record.get('key')!r}) has no "
                                  "compensation in AgentsagaDurability(effects=...); it cannot be undone")
            tctx = ToolCallContext(step=ctx, agent=str(record.get("agent")), tool=str(record.get("tool")),
                                   call_id=record.get("call_id"), idempotency_key=f"{record['key']}:compensate",
                                   deps=deps)
            try:
                result = undo(tctx, record)
                if inspect.isawaitable(result):
                    await result
            finally:
                tctx._merge()
            undone.append(record["key"])
        return undone

    # -- journaled requests ---------------------------------------------------------------------------
    def describe(self, operation_id: Any, name: str, cache_key: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
        """(kind, request) a durable unit is journaled as: stable across executions (see VOLATILE)."""
        if isinstance(operation_id, ModelRequestId):
            model_id, messages, settings, parameters, run_context = cache_key
            request: dict[str, Any] = {
                "agent": self.name,
                "model": model_id or _model_label(run_context) or operation_id.model_name,
                "messages": stable_messages(ModelMessagesTypeAdapter.dump_python(messages, mode="json")),
                "parameters": _parameters(_MODEL_PARAMETERS.dump_python(parameters, mode="json")),
            }
            if operation_id.streaming:
                request["stream"] = True
            if settings:
                request["settings"] = to_jsonable_python(settings, fallback=_type_name)
            return "llm", request
        if isinstance(operation_id, ToolsetCallToolId):
            tool, arguments, run_context = cache_key[0], cache_key[1], cache_key[2]
            return "tool", {"agent": self.name, "tool": tool, "call_id": run_context.tool_call_id,
                            "arguments": to_jsonable_python(arguments, fallback=_type_name)}
        if isinstance(operation_id, ToolsetValidateToolArgumentsId):
            tool, arguments, run_context = cache_key[0], cache_key[1], cache_key[2]
            return "pydantic-ai", {"agent": self.name, "operation": "validate_args", "tool": tool,
                                   "call_id": run_context.tool_call_id,
                                   "arguments": to_jsonable_python(arguments, fallback=_type_name)}
        # Discovery, event handlers, capability operations: named, with what of their inputs is data.
        inputs = [_input(value) for value in cache_key]
        request = {"agent": self.name, "operation": name}
        if any(value is not None for value in inputs):
            request["inputs"] = inputs
        return "pydantic-ai", request


class _Backend(JournalCallableOperationBackend[dict[str, Any]]):
    """Runs each durable unit as a durable call of the current step."""

    def __init__(self, owner: AgentsagaDurability[Any]) -> None:
        config: RoleBasedOperationConfig[dict[str, Any]] = RoleBasedOperationConfig(
            model={}, event={}, capability={}, tool={})
        super().__init__(agent_name=owner.name, config=config)
        self.owner = owner

    async def execute(self, *, operation_id: Any, name: str, body: Callable[[], Awaitable[object]],
                      cache_key: tuple[Any, ...], config: Any) -> object:
        owner = self.owner
        step = current_step()
        if step is None:  # pydantic-ai only dispatches here inside a durable context
            return await body()
        kind, request = owner.describe(operation_id, name, cache_key)
        call: ToolCallContext | None = None
        effect = None
        if kind == "tool":
            run_context: RunContext[Any] = cache_key[2]
            call = ToolCallContext(step=step, agent=owner.name, tool=request["tool"], call_id=request["call_id"],
                                   idempotency_key=None, deps=run_context.deps)
            if request["tool"] in owner.effects:
                effect = _effect_of(call, request)

        async def perform() -> object:
            if call is not None:
                # The call's position in the step execution is fixed: so is its key (module docstring).
                call.idempotency_key = f"{step.idempotency_key}:{owner.name}:{step.call_position}:{request['call_id']}"
            current = _TOOL_CALL.set(call)
            try:
                return await body()
            finally:
                _TOOL_CALL.reset(current)
                if call is not None:
                    call._merge()

        return await step.adurable_call(kind, request, perform, if_changed=owner.if_changed, effect=effect)


def _effect_of(call: ToolCallContext, request: dict[str, Any]) -> Callable[[Any], dict[str, Any] | None]:
    """The effect a completed effect tool call made, as the engine records it."""

    def made(response: Any) -> dict[str, Any] | None:
        if not isinstance(response, dict) or response.get("kind") != "tool_return":
            return None  # a retry prompt, a deferral: the tool did not complete
        record = {"agent": call.agent, "tool": call.tool, "call_id": call.call_id,
                  "arguments": request["arguments"], "result": response.get("result"), "key": call.idempotency_key}
        return {"name": call.tool, "key": call.idempotency_key, "result": record}

    return made


def _tool_records(effect: Any) -> list[dict[str, Any]]:
    """The tool effect records an effect stands for, oldest first, each once (by key)."""
    if getattr(effect, "call", -1) != -1:  # one tool call's own effect (its position in the step)
        return [effect.result] if isinstance(effect.result, dict) and "tool" in effect.result else []
    seen: set[Any] = set()
    out = []
    for call in getattr(effect, "calls", ()) or ():
        record = call.get("result") if isinstance(call, dict) else None
        if isinstance(record, dict) and "tool" in record and record.get("key") not in seen:
            seen.add(record.get("key"))
            out.append(record)
    return out


def stable_messages(messages: list[Any]) -> list[Any]:
    """Messages (pydantic-ai's JSON) as journaled in a request: each message and part without the
    ``VOLATILE`` keys and ``None`` fields. Contents and tool arguments are kept exactly."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        kept = _fields(message)
        if isinstance(kept.get("parts"), list):
            kept["parts"] = [_fields(part) if isinstance(part, dict) else part for part in kept["parts"]]
        out.append(kept)
    return out


def _fields(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k not in VOLATILE and v is not None}


def _parameters(value: dict[str, Any]) -> dict[str, Any]:
    """Model request parameters without empty fields (tool definitions included)."""
    out = {}
    for k, v in value.items():
        if v is None or v == [] or v == {}:
            continue
        if isinstance(v, list):
            v = [{tk: tv for tk, tv in t.items() if tv is not None} if isinstance(t, dict) else t for t in v]
        out[k] = v
    return out


def _model_label(run_context: Any) -> str | None:
    model = getattr(run_context, "model", None)
    if model is None:
        return None
    return getattr(model, "model_id", None) or getattr(model, "model_name", None)


def _input(value: Any) -> Any:
    """A unit's input as journaled: a run context by its position in the run, data as JSON."""
    if isinstance(value, RunContext):
        return {"run_step": value.run_step, "tool_call_id": value.tool_call_id}
    try:
        value = to_jsonable_python(value, fallback=_type_name)
        if isinstance(value, dict):  # an event: when it happened is not what it is
            value = _fields(value)
        return value
    except Exception:  # describing an input must never fail the call
        return _type_name(value)


def _type_name(value: Any) -> str:
    return f"<{type(value).__name__}>"
