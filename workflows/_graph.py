"""``Workflow``: a named, versioned step graph with a state type. Pure definition, no I/O.

Execution model (the engine follows it; it is described here because the graph defines it):
the run advances in *ticks*. A tick runs its frontier of steps (concurrently where there are
several); every step sees the state as it was when the tick began. When every step of the tick has
completed, their updates are merged in frontier order (deterministic, whatever order they finished
in) and the next frontier is the ordered union of the steps they routed to. A join
(``edge(["a", "b"], "c")``) schedules ``c`` once every source has completed since ``c`` last ran.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from workflows._policies import END, END_NAME, NO_RETRY, Retry, _End
from workflows._reducers import MISSING, Reducer, check_reducer, reducers_of_model, replace
from workflows._snapshots import Snapshots, snapshots_from
from workflows._step import Step, is_async_callable
from workflows.errors import DefinitionError, InputError, ReducerError, RoutingError

__all__ = ["Workflow"]

Router = Callable[[Any], Any]


def _callable_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


class Workflow:
    """A step graph. Build it with ``@wf.step``, ``wf.edge`` and ``wf.route``.

    ``state`` is an optional pydantic (or SQLModel) model: inputs and merged states are validated
    against it and steps receive model instances. Without it the state is a dict. ``reducers`` maps
    field names to reducers (see ``workflows.reducers``); a model can also declare them with
    ``Annotated[list[str], append]``. ``max_visits`` bounds how often any one step may run in a
    run (loops must end); a step can override it.
    """

    def __init__(
        self,
        name: str,
        *,
        version: str = "1",
        state: type | None = None,
        reducers: Mapping[str, Reducer] | None = None,
        max_visits: int = 1000,
        description: str | None = None,
        snapshots: Snapshots | Mapping[str, Any] | None = None,
        on_code_change: str = "journal",
    ) -> None:
        if not isinstance(name, str) or not name.strip() or not _storable_name(name):
            raise DefinitionError(f"workflow name must be a non-empty string without control characters or lone "
                                  f"surrogates, got {name!r}")
        if not isinstance(version, str) or not version or not _storable_name(version):
            raise DefinitionError(f"version must be a non-empty string without control characters or lone "
                                  f"surrogates, got {version!r}", workflow=name)
        if state is not None and not hasattr(state, "model_validate"):
            raise DefinitionError(
                f"state must be a pydantic/SQLModel model class or None, got {state!r}", workflow=name
            )
        if not isinstance(max_visits, int) or isinstance(max_visits, bool) or max_visits < 1:
            raise DefinitionError(f"max_visits must be an integer >= 1, got {max_visits!r}", workflow=name)
        if on_code_change not in ("journal", "refuse"):
            raise DefinitionError(f"on_code_change must be 'journal' or 'refuse', got {on_code_change!r}",
                                  workflow=name)
        #: what a resume does when a step's code changed since it ran: journal CodeChanged, or refuse
        self.on_code_change = on_code_change
        #: declared state migrations: from_version -> (to_version, fn(state) -> state)
        self.migrations: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {}
        try:
            #: when runs are snapshotted (None: the Orchestrator's default; see docs/checkpoints.md)
            self.snapshots: Snapshots | None = snapshots_from(snapshots)
        except DefinitionError as exc:
            raise DefinitionError(str(exc), workflow=name) from None
        self.name = name
        self.version = version
        self.state_model = state
        self.max_visits = max_visits
        self.description = description
        self.steps: dict[str, Step] = {}
        self.edges: dict[str, list[str]] = {}
        self.routes: dict[str, tuple[Router, tuple[str, ...] | None]] = {}
        self.joins: dict[str, tuple[str, ...]] = {}
        self._join_sources: dict[str, list[str]] = {}
        self.reducers: dict[str, Reducer] = {}
        if state is not None:
            self.reducers.update(reducers_of_model(state, workflow=name))
        for field_name, reducer in (reducers or {}).items():
            self.reducers[field_name] = check_reducer(field_name, reducer, workflow=name)
        # The module the workflow is defined in: functions of it are named in the graph's identity
        # without their module, whose name depends on how the app was loaded (Step.describe). A
        # run never records it (invariant 11).
        caller = sys._getframe(1).f_globals
        self.module: str | None = caller.get("__name__")
        self.module_file: str | None = caller.get("__file__")
        self._validated_fingerprint: str | None = None

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version!r}, steps={list(self.steps)})"

    # -- building ---------------------------------------------------------------------------
    def step(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        start: bool = False,
        retry: Retry | None = None,
        timeout: float | None = None,
        reads: Sequence[str] | None = None,
        max_visits: int | None = None,
        on_failure: str | None = None,
        durable_start: bool = False,
        effect: bool | None = None,
        compensate: Callable[..., Any] | str | None = None,
        check: Callable[..., Any] | None = None,
        resend: bool | None = None,
        breaker: Any = None,
        into: str | None = None,
    ) -> Any:
        """Register a sync or async function ``(ctx, state) -> update`` as a step.

        The first step declared is where a run starts, unless some step says ``start=True``.
        ``into="field"`` stores whatever the step returns (a string, a list, ...) as that one field.
        A step given a ``compensate`` (or a ``check``) is an effect: ``effect=True`` may be left out."""
        is_effect = (compensate is not None or check is not None) if effect is None else effect

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            step_name = name or getattr(func, "__name__", None)
            if not step_name or not isinstance(step_name, str):
                raise DefinitionError(f"cannot name step {func!r}; pass name=...", workflow=self.name)
            if step_name == END_NAME:
                raise DefinitionError(f"{END_NAME!r} is reserved for END", workflow=self.name, step=step_name)
            if step_name in self.steps:
                raise DefinitionError(f"duplicate step name {step_name!r}", workflow=self.name, step=step_name)
            if not callable(func):
                raise DefinitionError(f"step {step_name!r} is not callable", workflow=self.name, step=step_name)
            if retry is not None and not isinstance(retry, Retry):
                raise DefinitionError(
                    f"step {step_name!r}: retry must be a Retry(...), got {retry!r}", workflow=self.name, step=step_name
                )
            if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                        or not math.isfinite(timeout) or timeout <= 0):
                raise DefinitionError(
                    f"step {step_name!r}: timeout must be a positive number of seconds, got {timeout!r}",
                    workflow=self.name, step=step_name,
                )
            if max_visits is not None and (not isinstance(max_visits, int) or isinstance(max_visits, bool)
                                           or max_visits < 1):
                raise DefinitionError(
                    f"step {step_name!r}: max_visits must be an integer >= 1, got {max_visits!r}",
                    workflow=self.name, step=step_name,
                )
            for flag, value, optional in (("start", start, False), ("durable_start", durable_start, False),
                                          ("effect", effect, True), ("resend", resend, True)):
                if not isinstance(value, bool) and not (optional and value is None):
                    raise DefinitionError(f"step {step_name!r}: {flag} must be True or False, got {value!r}",
                                          workflow=self.name, step=step_name)
            if (compensate is not None or check is not None) and not is_effect:
                raise DefinitionError(
                    f"step {step_name!r}: effect=False contradicts compensate/check, which only an effect has "
                    "(leave effect out: a step with a compensation is an effect)", workflow=self.name, step=step_name
                )
            if into is not None and (not isinstance(into, str) or not into):
                raise DefinitionError(f"step {step_name!r}: into must be a state field name, got {into!r}",
                                      workflow=self.name, step=step_name)
            read_keys = None if reads is None else tuple(reads)
            if read_keys is not None and not all(isinstance(k, str) for k in read_keys):
                raise DefinitionError(f"step {step_name!r}: reads must be field names", workflow=self.name, step=step_name)
            self.steps[step_name] = Step(
                name=step_name,
                fn=func,
                is_async=is_async_callable(func),
                start=start,
                retry=retry or NO_RETRY,
                timeout=float(timeout) if timeout is not None else None,
                reads=read_keys,
                max_visits=max_visits,
                on_failure=on_failure,
                durable_start=durable_start,
                effect=is_effect,
                compensate=compensate,
                check=check,
                resend=resend,
                breaker=breaker,
                into=into,
                description=(func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else None,
            )
            self._validated_fingerprint = None
            return func

        if fn is not None:
            return register(fn)
        return register

    def migrate(self, *, from_version: str, to_version: str | None = None) -> Callable[..., Any]:
        """Declare how a run's state written under ``from_version`` becomes a state of ``to_version``
        (default: this workflow's version): ``@wf.migrate(from_version="1") def up(state): return {...}``.
        A run started under an older version resumes through the chain of migrations to this one,
        journaled; without a path the graph-change error stays (see docs/checkpoints.md)."""
        target = self.version if to_version is None else to_version
        for label, value in (("from_version", from_version), ("to_version", target)):
            if not isinstance(value, str) or not value:
                raise DefinitionError(f"migrate({label}=...) must be a non-empty version string, got {value!r}",
                                      workflow=self.name)
        if from_version == target:
            raise DefinitionError(f"a migration from version {from_version!r} to itself", workflow=self.name)
        if from_version in self.migrations:
            raise DefinitionError(f"two migrations from version {from_version!r}", workflow=self.name)

        def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
            if not callable(fn):
                raise DefinitionError(f"migration from version {from_version!r} is not callable", workflow=self.name)
            self.migrations[from_version] = (target, fn)
            return fn

        return register

    def edge(self, source: str | Sequence[str], target: str | _End) -> Workflow:
        """A static edge ``source -> target``. Several edges from one step run in parallel.

        With a list of sources the edge is a join: ``target`` runs once all of them completed.
        """
        tgt = END_NAME if isinstance(target, _End) else target
        if not isinstance(tgt, str):
            raise DefinitionError(f"edge target must be a step name or END, got {target!r}", workflow=self.name)
        if isinstance(source, str):
            self.edges.setdefault(source, [])
            if tgt in self.edges[source]:
                raise DefinitionError(f"duplicate edge {source!r} -> {tgt!r}", workflow=self.name, step=source)
            self.edges[source].append(tgt)
        else:
            sources = tuple(source)
            if len(sources) < 2 or not all(isinstance(s, str) for s in sources):
                raise DefinitionError(
                    f"a join needs two or more source step names, got {source!r}", workflow=self.name
                )
            if tgt == END_NAME:
                raise DefinitionError("a join cannot target END", workflow=self.name)
            if tgt in self.joins:
                raise DefinitionError(f"step {tgt!r} already has a join", workflow=self.name, step=tgt)
            self.joins[tgt] = sources
            for s in sources:
                self._join_sources.setdefault(s, []).append(tgt)
        self._validated_fingerprint = None
        return self

    def sequence(self, *steps: str | _End) -> Workflow:
        """Edges along a chain: ``wf.sequence("plan", "search", "answer", END)`` is three ``edge`` calls."""
        if len(steps) < 2:
            raise DefinitionError(f"a sequence needs two or more steps, got {list(steps)!r}", workflow=self.name)
        for source, target in zip(steps, steps[1:]):
            if isinstance(source, _End):
                raise DefinitionError("END can only end a sequence", workflow=self.name)
            self.edge(source, target)
        return self

    def route(self, source: str, router: Router, *, targets: Iterable[str | _End] | None = None) -> Workflow:
        """A conditional edge: ``router(state)`` returns a step name, several names or END.

        ``targets`` (optional) declares what the router may return, so validation can check
        reachability and a router returning anything else fails clearly.
        """
        if not callable(router):
            raise DefinitionError(f"router for {source!r} is not callable: {router!r}", workflow=self.name, step=source)
        if source in self.routes:
            raise DefinitionError(f"step {source!r} already has a router", workflow=self.name, step=source)
        declared = None
        if targets is not None:
            declared = tuple(END_NAME if isinstance(t, _End) else t for t in targets)
        self.routes[source] = (router, declared)
        self._validated_fingerprint = None
        return self

    # -- validation and identity -------------------------------------------------------------
    @property
    def start_steps(self) -> list[str]:
        """The steps marked ``start=True``; without any, the first step declared."""
        marked = [s.name for s in self.steps.values() if s.start]
        return marked or list(self.steps)[:1]

    def validate(self) -> None:
        """Check the graph; raise ``DefinitionError`` naming the step at fault."""
        if self._validated_fingerprint is not None:
            return
        wf = self.name
        if not self.steps:
            raise DefinitionError("has no steps", workflow=wf)
        if not self.edges and not self.routes and not self.joins:
            # A workflow with no edges at all is a chain: its steps run in the order they were
            # declared, then the run ends (the edges are made here, so the fingerprint shows them).
            if len(self.steps) > 1:
                self.sequence(*self.steps, END)
            else:
                self.edge(next(iter(self.steps)), END)

        def known(name: str, where: str, step: str) -> None:
            if name != END_NAME and name not in self.steps:
                raise DefinitionError(f"{where} targets unknown step {name!r}", workflow=wf, step=step)

        for src, targets in self.edges.items():
            if src not in self.steps:
                raise DefinitionError(f"edge from unknown step {src!r}", workflow=wf, step=src)
            for t in targets:
                known(t, f"edge {src!r} ->", src)
        for src, (_, declared) in self.routes.items():
            if src not in self.steps:
                raise DefinitionError(f"router on unknown step {src!r}", workflow=wf, step=src)
            for t in declared or ():
                known(t, f"router of {src!r}", src)
        for tgt, sources in self.joins.items():
            known(tgt, f"join {list(sources)!r} ->", tgt)
            for s in sources:
                if s not in self.steps:
                    raise DefinitionError(f"join into {tgt!r} from unknown step {s!r}", workflow=wf, step=s)
        for step in self.steps.values():
            if step.on_failure is not None:
                known(step.on_failure, f"failure route of {step.name!r}", step.name)
        # Reachability. A router without declared targets may go anywhere, so it reaches all.
        reached: set[str] = set()
        todo = list(self.start_steps)
        while todo:
            cur = todo.pop()
            if cur in reached or cur == END_NAME:
                continue
            reached.add(cur)
            todo.extend(self.edges.get(cur, ()))
            todo.extend(self._join_sources.get(cur, ()))
            if cur in self.routes:
                declared = self.routes[cur][1]
                todo.extend(declared if declared is not None else self.steps)
            failure = self.steps[cur].on_failure
            if failure:
                todo.append(failure)
        if self.snapshots is not None:
            self.snapshots.check_gates(self.steps, wf)
        unreachable = [s for s in self.steps if s not in reached]
        if unreachable:
            raise DefinitionError(
                f"step {unreachable[0]!r} is unreachable from the start step(s) {self.start_steps}",
                workflow=wf, step=unreachable[0],
            )
        self._validated_fingerprint = self._compute_fingerprint()

    def describe(self) -> dict[str, Any]:
        """The graph as data: steps, edges, routers, joins. Recorded on every run."""
        return {
            "name": self.name,
            "steps": [self.steps[n].describe(home=self.module) for n in sorted(self.steps)],
            "edges": sorted([src, t] for src, ts in self.edges.items() for t in ts),
            "routes": sorted(
                [src, _callable_name(r), sorted(d) if d is not None else None] for src, (r, d) in self.routes.items()
            ),
            "joins": sorted([t, list(s)] for t, s in self.joins.items()),
        }

    def _compute_fingerprint(self) -> str:
        text = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def fingerprint(self) -> str:
        """sha256 of the graph description; changes when steps, edges, routers or joins change."""
        self.validate()
        assert self._validated_fingerprint is not None
        return self._validated_fingerprint

    # -- evaluation (pure; the engine journals what these return) ------------------------------
    def successors(self, step: str, view: Any) -> list[str]:
        """Where ``step`` goes next: its static edges, then its router's choice (END dropped)."""
        out = [t for t in self.edges.get(step, ()) if t != END_NAME]
        if step in self.routes:
            router, declared = self.routes[step]
            chosen = router(view)
            for name in self._normalise_route(step, router, chosen, declared):
                if name != END_NAME and name not in out:
                    out.append(name)
        return out

    def join_targets(self, step: str) -> dict[str, list[str]]:
        """Joins this step feeds: ``{target: [all sources]}``."""
        return {t: list(self.joins[t]) for t in self._join_sources.get(step, ())}

    def _normalise_route(self, step: str, router: Router, chosen: Any, declared: tuple[str, ...] | None) -> list[str]:
        items = list(chosen) if isinstance(chosen, (list, tuple)) else [chosen]
        names: list[str] = []
        for item in items:
            name = END_NAME if isinstance(item, _End) else item
            if not isinstance(name, str):
                raise RoutingError(
                    f"router {_callable_name(router)!r} of step {step!r} returned {chosen!r}; "
                    "expected a step name, a list of step names or END",
                    step=step,
                )
            if name != END_NAME and name not in self.steps:
                raise RoutingError(
                    f"router {_callable_name(router)!r} of step {step!r} returned unknown step {name!r}", step=step
                )
            if declared is not None and name not in declared:
                raise RoutingError(
                    f"router {_callable_name(router)!r} of step {step!r} returned {name!r}, "
                    f"not one of its declared targets {list(declared)}",
                    step=step,
                )
            names.append(name)
        return names

    # -- state -------------------------------------------------------------------------------
    def reduce(self, state: dict[str, Any], update: Mapping[str, Any]) -> None:
        """Merge an update into ``state`` in place with the declared reducers."""
        reducers = self.reducers
        for key, value in update.items():
            reducer = reducers.get(key, replace)
            if reducer is replace:
                state[key] = value
            else:
                current = state.get(key, MISSING)
                try:
                    state[key] = reducer(current, value)
                except Exception as exc:
                    name = getattr(reducer, "__qualname__", None) or type(reducer).__qualname__
                    module = getattr(reducer, "__module__", "") or ""
                    if module == "workflows._reducers":
                        name = f"reducers.{name}"
                    now = "nothing yet" if current is MISSING else f"{type(current).__name__} {_short(current)}"
                    raise ReducerError(
                        f"field {key!r}: reducer {name} could not merge {type(value).__name__} {_short(value)} "
                        f"into {now}: {type(exc).__name__}: {exc}", field=key) from exc

    def initial_state(self, value: Any) -> dict[str, Any]:
        """The run input as a state dict (validated against the state model if there is one)."""
        if value is None:
            value = {}
        model = self.state_model
        if model is not None:
            if isinstance(value, model):
                return value.model_dump()
            try:
                return model.model_validate(value).model_dump()
            except ValueError as exc:  # pydantic's ValidationError: one line per field at fault
                problems = [f"{'.'.join(str(p) for p in e['loc']) or '(the input)'}: {e['msg']}"
                            for e in exc.errors()] if hasattr(exc, "errors") else [str(exc)]
                raise InputError(f"input does not fit the state model {model.__name__}: " + "; ".join(problems),
                                 workflow=self.name) from exc
        if hasattr(value, "model_dump"):
            return value.model_dump()
        if not isinstance(value, Mapping):
            raise DefinitionError(
                f"input must be a dict (or a {self.name!r} state model), got {type(value).__name__}", workflow=self.name
            )
        bad = [k for k in value if not isinstance(k, str)]
        if bad:  # as for a step's update: a state field is named by a string
            raise InputError(f"input has a non-string key {bad[0]!r}; the input's keys are the state's fields, "
                             "which are named by strings", workflow=self.name)
        return dict(value)

    def view(self, state: dict[str, Any]) -> Any:
        """What a step or router sees: a model instance for typed state, else a shallow copy."""
        model = self.state_model
        if model is not None:
            return model.model_validate(state)
        return dict(state)

    def normalise_update(self, step: str, result: Any) -> dict[str, Any]:
        """A step's return value as a dict of field updates, or a clear error naming the step."""
        into = self.steps[step].into if step in self.steps else None
        if into is not None:
            return {into: result.model_dump() if hasattr(result, "model_dump") else result}
        if result is None:
            return {}
        if isinstance(result, dict):
            bad = [k for k in result if not isinstance(k, str)]
            if bad:
                raise TypeError(f"step {step!r} returned an update with a non-string key {bad[0]!r}")
            return result
        if hasattr(result, "model_dump"):
            return result.model_dump(exclude_unset=True)
        raise TypeError(
            f"step {step!r} returned {type(result).__name__} ({_short(result)}); a step returns a dict of state "
            f"updates, a state model or None. To keep a single value as one field, declare "
            f"@wf.step(into='{step}_result') (any field name)"
        )

    def check_state(self, step: str, state: dict[str, Any]) -> None:
        """Validate a merged state against the model (typed state only)."""
        if self.state_model is not None:
            self.state_model.model_validate(state)


def _storable_name(name: str) -> bool:
    """Whether a database can store ``name`` as it is: no control character (Postgres refuses a NUL)
    and no lone surrogate (not UTF-8)."""
    return name.isprintable() or not any(unicodedata.category(c) in ("Cc", "Cs") for c in name)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
