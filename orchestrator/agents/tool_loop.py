"""Tools a model can call, and the bounded tool-calling loop that dispatches them durably.

    tools = ToolRegistry()

    @tools.tool
    def search(query: str, limit: int = 5) -> list[str]:
        '''Search the local corpus.'''              # the docstring is the tool's description
        ...

    @tools.tool(effect=True, compensate=cancel_booking)
    def book(tctx: ToolContext, venue: str) -> dict:  # a ToolContext parameter is injected, not shown
        return tctx.http.post(f"{API}/hotels", json={"venue": venue}).json()   # Idempotency-Key sent

    @agent.step(effect=True, compensate=tools.compensate)
    def research(ctx, state):
        out = run_tool_loop(ctx, llm, [{"role": "user", "content": state["question"]}], tools)
        return out.update(answer=out.content)         # carries the effect tools' records for undo

Parameters' JSON schema comes from the type hints (through a pydantic model built from the
signature; ``Annotated[int, Field(ge=1, description=...)]`` works) or, when the function takes one
pydantic model, from that model. The model's arguments are validated against it before the tool
runs.

The loop (``run_tool_loop`` / ``arun_tool_loop``): ask the model; if it calls tools, run each and
give it the results; repeat until it answers without calling a tool, at most ``max_iterations``
model calls (then ``ToolLoopLimitError``). Every model call is a durable ``llm`` call and every
tool call a durable ``tool`` call, both journaled as ``CallCompleted`` the moment they return:
request ``{"name", "call_id", "arguments"}``, response ``{"ok": true, "result"}`` or ``{"ok": false,
"error"}``. So a step that runs again replays the loop from the journal, paying for no model call
and running no tool twice, up to the point where it stopped.

What the model gets wrong is told to the model, not raised: a tool that does not exist, arguments
that are not JSON, arguments that fail the schema, and a tool that raises an ordinary exception all
become an ``{"error": ...}`` tool message (journaled with ``"rejected": true`` when the tool never
ran) and the loop goes on within its bound. A ``ToolError`` (the outside world failing: a timeout,
an open breaker) is not the model's fault and propagates, so the step's ``Retry`` applies.

Effects. A tool marked ``effect=True`` gets an idempotency key of its own, stable across retries,
recoveries and replays: ``"{base}:{loop}:{iteration}.{position}"`` where ``base`` is the step's
``ctx.idempotency_key`` (every step has one; it includes the rollback epoch), ``loop`` the ``loop=`` name (default ``"tools"``; give two loops in
one step different names), ``iteration`` the model call that asked for it and ``position`` its
place in that call's tool calls. ``tctx.http`` sends it as ``Idempotency-Key`` (``key:n`` for the
n-th further request), so a tool call re-sent after a crash is recognised by the service.
Compensation: each completed effect tool call is journaled as an effect of its own the moment it
returns, so a run that fails later (even in the same step, say when the loop runs out of
iterations) undoes it. Make the loop's step ``effect=True, compensate=tools.compensate``:
``tools.compensate`` undoes the tool calls newest first with each tool's ``compensate(tctx,
record)`` (``tctx.idempotency_key`` is ``"{tool key}:compensate"``). When the step completes its
tool calls join its own effect record (``out.update(...)`` still lists them as ``tool_effects`` for
your own use); when it fails, each is undone on its own. A loop in a step without a compensation
leaves its bookings listed as NOT undone when the run fails: never silently.

Tools may make durable calls of their own (``llm.chat``, ``ctx.http``, ``ctx.durable_call``, a
loop of their own): they are numbered under the tool's call (``"3.0"``, ``"3.1"`` inside call 3),
so a resumed step neither repeats them nor renumbers the calls after the tool. A loop run inside a
durable call (a tool that runs a loop of its own) puts that call's position in its keys' ``base``
(``"{key}:3:{loop}:{iteration}.{position}"``), so its effect tools never share a key with the
outer loop's.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from orchestrator.errors import ToolError, ToolLoopLimitError
from orchestrator.payload.exceptions import error_record

__all__ = ["ToolRegistry", "AgentTool", "ToolContext", "LoopResult", "ToolLoopLimitError",
           "run_tool_loop", "arun_tool_loop", "TOOL_EFFECTS"]

TOOL_EFFECTS = "tool_effects"  # the update field listing a loop's completed effect tools


@dataclass(slots=True)
class ToolContext:
    """What a tool that asks for it gets: the step's context and, for an effect, its own key."""

    step: Any  #: the step's StepContext (trace, run_id, ...)
    idempotency_key: str | None
    call_id: str | None = None
    _sub: Any = None  # the StepTools made for this tool's key

    @property
    def http(self) -> Any:
        """HTTP calls journaled with the step; an effect tool's send its idempotency key."""
        if self.idempotency_key is None:
            return self.step.http
        if self._sub is None:
            self._sub = self.step.tools.with_key(self.idempotency_key)
        return self._sub.http

    def _merge(self) -> None:
        """The tool's HTTP records and breaker transitions join the step's journal event."""
        if self._sub is not None:
            mine = self.step.tools
            mine.calls.extend(self._sub.calls)
            mine.transitions.extend(self._sub.transitions)
            self._sub = None


@dataclass(slots=True)
class AgentTool:
    name: str
    fn: Callable[..., Any]
    description: str
    model: type[pydantic.BaseModel]
    effect: bool = False
    compensate: Callable[..., Any] | None = None
    context_param: str | None = None  # the parameter a ToolContext is passed as
    model_param: str | None = None  # set when the function takes one pydantic model

    def schema(self) -> dict[str, Any]:
        parameters = self.model.model_json_schema()
        parameters.pop("title", None)
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": parameters}}

    def bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for the function; ``ValueError`` listing every problem otherwise."""
        try:
            parsed = self.model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}"
                                 for e in exc.errors())
            raise ValueError(f"invalid arguments for tool {self.name!r}: {problems}") from None
        if self.model_param is not None:
            return {self.model_param: parsed}
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}


class ToolRegistry:
    """Tools by name; ``schemas()`` is what ``llm.chat(tools=...)`` sends.

    ``ToolRegistry([search, weather])`` registers plain functions at once (as ``@tools.tool`` does);
    the loop also takes such a list in place of a registry."""

    def __init__(self, tools: Iterable[Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, AgentTool] = {}
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Iterable):
            raise TypeError(f"ToolRegistry takes a list of functions, got {type(tools).__name__} {tools!r}")
        for fn in tools:
            if not callable(fn):
                raise TypeError(f"ToolRegistry takes functions; {fn!r} ({type(fn).__name__}) is not callable")
            self.tool(fn)

    def tool(self, fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
             description: str | None = None, effect: bool = False,
             compensate: Callable[..., Any] | None = None) -> Any:
        """Register ``fn`` as a tool (``@tools.tool`` or ``@tools.tool(effect=True, ...)``)."""
        # The caller's locals resolve string annotations of a model defined in a function body
        # (``from __future__ import annotations`` makes every annotation a string).
        scope = dict(sys._getframe(1).f_locals)

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            tool = _describe(func, name or func.__name__, description, effect, compensate, scope)
            if tool.name in self._tools:
                raise ValueError(f"a tool named {tool.name!r} is already registered")
            self._tools[tool.name] = tool
            return func

        return register(fn) if fn is not None else register

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def names(self) -> list[str]:
        return list(self._tools)

    def __getitem__(self, name: str) -> AgentTool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def compensate(self, ctx: Any, effect: Any) -> list[str]:
        """A step compensation: undo the effect tools the step's loop completed, newest first.

        ``effect`` is the step's record (its tools' calls joined to it, and listed in its update by
        ``LoopResult.update``), or one tool call's own record when the step failed before returning."""
        records = _tool_records(effect)
        undone = []
        for record in reversed(records):
            tool = self._tools.get(record.get("tool"))
            if tool is None or tool.compensate is None:
                raise LookupError(f"tool effect {record.get('tool')!r} (key {record.get('key')!r}) has no "
                                  "registered compensation; it cannot be undone")
            tctx = ToolContext(step=ctx, idempotency_key=f"{record['key']}:compensate", call_id=record.get("call_id"))
            try:
                tool.compensate(tctx, record)
            finally:
                tctx._merge()
            undone.append(record["key"])
        return undone


def _tool_records(effect: Any) -> list[dict[str, Any]]:
    """The effect tool records an effect stands for, oldest first, each once (by key)."""
    if getattr(effect, "call", -1) != -1:  # one tool call's own effect (its position in the step)
        return [effect.result] if isinstance(effect.result, dict) else []
    found: list[dict[str, Any]] = [c["result"] for c in getattr(effect, "calls", ()) if isinstance(c.get("result"), dict)]
    result = effect.result if isinstance(effect.result, dict) else {}
    found += list(result.get(TOOL_EFFECTS) or [])
    seen: set[Any] = set()
    out = []
    for record in found:
        key = record.get("key")
        if key in seen:
            continue
        seen.add(key)
        out.append(record)
    return out


def _describe(fn: Callable[..., Any], name: str, description: str | None, effect: bool,
              compensate: Callable[..., Any] | None, scope: dict[str, Any]) -> AgentTool:
    if not callable(fn):
        raise TypeError(f"tool {name!r} is not callable")
    try:
        hints = typing.get_type_hints(fn, localns=scope, include_extras=True)
    except NameError as exc:
        raise TypeError(f"tool {name!r}: cannot resolve a type hint ({exc}); define the type where the "
                        "tool can see it") from None
    context_param = model_param = None
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, Any)
        if hint is ToolContext or param.name in ("tctx", "tool_ctx"):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    if len(fields) == 1:
        (only, (hint, _)), = fields.items()
        if inspect.isclass(hint) and issubclass(hint, pydantic.BaseModel):
            model_param = only
            model = hint
    if model_param is None:
        model = pydantic.create_model(f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"),
                                      **fields)
    doc = inspect.getdoc(fn) or ""
    text = description if description is not None else doc.split("\n\n", 1)[0].strip()
    return AgentTool(name=name, fn=fn, description=text or name, model=model, effect=effect,
                     compensate=compensate, context_param=context_param, model_param=model_param)


@dataclass(slots=True)
class LoopResult:
    """What a tool loop ended with: the model's answer and how it got there."""

    content: str | None
    messages: list[dict[str, Any]]
    calls: list[dict[str, Any]] = field(default_factory=list)  # every tool call: request + outcome
    iterations: int = 0  # model calls made
    usage: dict[str, int] = field(default_factory=dict)  # summed over the loop's model calls
    effects: list[dict[str, Any]] = field(default_factory=list)  # completed effect tools (for undo)

    def update(self, **fields: Any) -> dict[str, Any]:
        """A step update with ``fields`` and, when effect tools ran, the records that undo them."""
        return {**fields, TOOL_EFFECTS: list(self.effects)} if self.effects else dict(fields)


# -- the loop ----------------------------------------------------------------------------------------
class _Loop:
    """One run of the loop: builds each tool call's durable request and its outcome."""

    def __init__(self, ctx: Any, registry: ToolRegistry, loop: str) -> None:
        self.ctx = ctx
        self.registry = registry
        self.loop = loop
        base = getattr(ctx, "idempotency_key", None) or f"{ctx.run_id}:{ctx.step}:{ctx.tick}"
        inside = getattr(ctx, "call_position", None)
        # A loop inside a durable call (a tool's own loop) numbers its iterations from 0 too: the
        # call's position keeps its keys apart from the loop around it.
        self.base = base if inside is None else f"{base}:{inside}"
        self.result = LoopResult(content=None, messages=[])

    def request(self, call: Any) -> tuple[dict[str, Any], AgentTool | None, dict[str, Any] | None, str | None]:
        """(journaled request, tool, bound kwargs, rejection) for one of the model's tool calls."""
        try:
            arguments: Any = call.parse()
        except ValueError as exc:
            request = {"name": call.name, "call_id": call.id, "arguments": call.arguments}
            return request, None, None, f"tool {call.name!r}: {exc}; send the arguments as a JSON object"
        request = {"name": call.name, "call_id": call.id, "arguments": arguments}
        tool = self.registry._tools.get(call.name)
        if tool is None:
            known = ", ".join(self.registry.names()) or "none"
            return request, None, None, f"there is no tool named {call.name!r}; the tools are: {known}"
        try:
            return request, tool, tool.bind(arguments), None
        except ValueError as exc:
            return request, tool, None, str(exc)

    def context(self, tool: AgentTool, call: Any, iteration: int, position: int) -> ToolContext | None:
        key = f"{self.base}:{self.loop}:{iteration}.{position}" if tool.effect else None
        if tool.context_param is None and key is None:
            return None
        return ToolContext(step=self.ctx, idempotency_key=key, call_id=call.id)

    @staticmethod
    def effect_of(tool: AgentTool | None, request: dict[str, Any],
                  tctx: ToolContext | None) -> Callable[[dict[str, Any]], dict[str, Any] | None] | None:
        """For an effect tool: the effect its completed call made, as the engine records it (so the
        step's compensation undoes it even if the step later fails before returning)."""
        if tool is None or not tool.effect:
            return None

        def made(outcome: dict[str, Any]) -> dict[str, Any] | None:
            if not outcome.get("ok"):
                return None
            key = tctx.idempotency_key if tctx else None
            return {"name": tool.name, "key": key, "result": {
                "tool": tool.name, "call_id": request["call_id"], "arguments": request["arguments"],
                "result": outcome.get("result"), "key": key}}

        return made

    def record(self, request: dict[str, Any], outcome: dict[str, Any], iteration: int, tool: AgentTool | None,
               tctx: ToolContext | None) -> dict[str, Any]:
        entry = {"iteration": iteration, **request, **outcome}
        self.result.calls.append(entry)
        if tool is not None and tool.effect and outcome.get("ok"):
            self.result.effects.append({"tool": tool.name, "call_id": request["call_id"], "arguments":
                                        request["arguments"], "result": outcome.get("result"),
                                        "key": tctx.idempotency_key if tctx else None})
        text = outcome["result"] if outcome.get("ok") else {"error": outcome["error"]}
        if not isinstance(text, str):
            # Compact, as the journal's redaction re-writes JSON-looking strings: the request the
            # next model call journals must equal the one it makes, or a resume would pay again.
            text = json.dumps(text, ensure_ascii=False, separators=(",", ":"), default=str)
        return {"role": "tool", "tool_call_id": request["call_id"], "content": text}

    def add_usage(self, usage: dict[str, Any]) -> None:
        for name, value in usage.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.result.usage[name] = self.result.usage.get(name, 0) + value


def _jsonable(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _failed(exc: Exception) -> dict[str, Any]:
    # Bounded: the error goes to the model and into the journal with the next model call's request.
    return {"ok": False, "error": f"{type(exc).__name__}: {error_record(exc, with_traceback=False)['message']}"}


def _too_many(ctx: Any, max_iterations: int, last: Sequence[Any]) -> ToolLoopLimitError:
    names = ", ".join(sorted({c.name for c in last})) or "none"
    return ToolLoopLimitError(f"step {getattr(ctx, 'step', '?')!r}: the tool loop made {max_iterations} model calls "
                              f"(max_iterations) and the model still asked for tools ({names}); raise "
                              "max_iterations or have the prompt ask for an answer")


def _registry(tools: ToolRegistry | Iterable[Callable[..., Any]]) -> ToolRegistry:
    """A registry as given, or one made of a list of plain functions."""
    return tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)


def _start(messages: Sequence[Any], max_iterations: int) -> list[Any]:
    if not isinstance(max_iterations, int) or max_iterations < 1:
        raise ValueError(f"max_iterations must be an integer >= 1, got {max_iterations!r}")
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return list(messages)


def run_tool_loop(ctx: Any, llm: Any, messages: Sequence[Any] | str,
                  tools: ToolRegistry | Iterable[Callable[..., Any]], *,
                  max_iterations: int = 8, loop: str = "tools", **params: Any) -> LoopResult:
    """Let the model call ``tools`` until it answers (sync steps; see the module docstring)."""
    tools = _registry(tools)
    history = _start(messages, max_iterations)
    state = _Loop(ctx, tools, loop)
    calls: list[Any] = []
    for iteration in range(max_iterations):
        answer = llm.chat(ctx, history, tools=tools, **params)
        state.add_usage(answer.usage)
        history.append(answer.message)
        calls = answer.tool_calls
        if not calls:
            state.result.content, state.result.iterations = answer.content, iteration + 1
            state.result.messages = history
            return state.result
        for position, call in enumerate(calls):
            request, tool, kwargs, rejected = state.request(call)
            if tool is not None and inspect.iscoroutinefunction(tool.fn):
                raise TypeError(f"tool {tool.name!r} is async: use arun_tool_loop in an async step")
            tctx = state.context(tool, call, iteration, position) if tool is not None else None

            def perform(tool: AgentTool | None = tool, kwargs: Any = kwargs, rejected: str | None = rejected,
                        tctx: ToolContext | None = tctx) -> dict[str, Any]:
                if rejected is not None or tool is None:
                    return {"ok": False, "rejected": True, "error": rejected}
                if tctx is not None and tool.context_param is not None:
                    kwargs = {**kwargs, tool.context_param: tctx}
                try:
                    value = tool.fn(**kwargs)
                except ToolError:
                    raise  # the outside world failed, not the model: the step's Retry decides
                except Exception as exc:
                    return _failed(exc)
                finally:
                    if tctx is not None:
                        tctx._merge()
                return {"ok": True, "result": _jsonable(value)}

            outcome = ctx.durable_call("tool", request, perform, effect=state.effect_of(tool, request, tctx))
            history.append(state.record(request, outcome, iteration, tool, tctx))
    raise _too_many(ctx, max_iterations, calls)


async def arun_tool_loop(ctx: Any, llm: Any, messages: Sequence[Any] | str,
                         tools: ToolRegistry | Iterable[Callable[..., Any]], *,
                         max_iterations: int = 8, loop: str = "tools", **params: Any) -> LoopResult:
    """The async twin of ``run_tool_loop`` (an ``AsyncLLM``; tools may be sync or async)."""
    tools = _registry(tools)
    history = _start(messages, max_iterations)
    state = _Loop(ctx, tools, loop)
    calls: list[Any] = []
    for iteration in range(max_iterations):
        answer = await llm.chat(ctx, history, tools=tools, **params)
        state.add_usage(answer.usage)
        history.append(answer.message)
        calls = answer.tool_calls
        if not calls:
            state.result.content, state.result.iterations = answer.content, iteration + 1
            state.result.messages = history
            return state.result
        for position, call in enumerate(calls):
            request, tool, kwargs, rejected = state.request(call)
            tctx = state.context(tool, call, iteration, position) if tool is not None else None

            async def perform(tool: AgentTool | None = tool, kwargs: Any = kwargs, rejected: str | None = rejected,
                              tctx: ToolContext | None = tctx) -> dict[str, Any]:
                if rejected is not None or tool is None:
                    return {"ok": False, "rejected": True, "error": rejected}
                if tctx is not None and tool.context_param is not None:
                    kwargs = {**kwargs, tool.context_param: tctx}
                try:
                    value = tool.fn(**kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                except ToolError:
                    raise
                except Exception as exc:
                    return _failed(exc)
                finally:
                    if tctx is not None:
                        tctx._merge()
                return {"ok": True, "result": _jsonable(value)}

            outcome = await ctx.adurable_call("tool", request, perform, effect=state.effect_of(tool, request, tctx))
            history.append(state.record(request, outcome, iteration, tool, tctx))
    raise _too_many(ctx, max_iterations, calls)
