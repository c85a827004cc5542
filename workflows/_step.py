"""A step's definition: the function and its options, frozen as data."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workflows._policies import NO_RETRY, Retry

__all__ = ["Step"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One node of the graph. Options are keyword-only on ``Workflow.step``.

    ``reads`` names the state fields the step depends on: the journal then records their values as
    the step's input; without it the input is recorded by reference to the journal position the
    state was folded at (never a full copy per step, so the journal grows linearly).

    The effect options (``effect``, ``compensate``, ``check``, ``resend``, ``breaker``) describe a
    call to the outside world; see the ``compensations`` package for what the engine does with them.
    """

    name: str
    fn: Callable[..., Any]
    is_async: bool
    start: bool = False
    retry: Retry = NO_RETRY
    timeout: float | None = None
    reads: tuple[str, ...] | None = None
    max_visits: int | None = None
    on_failure: str | None = None
    durable_start: bool = False
    effect: bool = False
    compensate: Callable[..., Any] | str | None = None
    check: Callable[..., Any] | None = None
    resend: bool | None = None
    breaker: Any = None  # a breaker name, or a compensations.BreakerConfig
    into: str | None = None  # the state field a non-dict return value is stored in
    description: str | None = None

    @property
    def journals_start(self) -> bool:
        """Whether a durable StepStarted is committed before the step runs (always for effects)."""
        return self.effect or self.durable_start

    def describe(self, *, home: str | None = None) -> dict[str, Any]:
        """The part of the step that belongs to the graph's identity (no function bodies). ``home``
        is the module the workflow was defined in (see ``_function_name``)."""
        out: dict[str, Any] = {"name": self.name}
        if self.start:
            out["start"] = True
        if self.effect:
            out["effect"] = True
        if self.on_failure:
            out["on_failure"] = self.on_failure
        if self.compensate is not None:
            # Which compensation undoes the effect is part of what a run was started under: a run
            # must not be compensated by other code without saying so (GraphChangedError).
            homes = {home, getattr(self.fn, "__module__", None)}
            out["compensate"] = (self.compensate if isinstance(self.compensate, str)
                                 else _function_name(self.compensate, homes=homes))
        return out


def _function_name(fn: Any, *, homes: set[str | None]) -> str:
    """How the graph's identity names ``fn``: by its qualified name alone when it lives in one of
    the ``homes`` (the modules of the workflow and of the step function), else as ``module:qualname``.

    The name must not depend on how the app was loaded or where it sits on disk: the functions of
    one file are in ``__main__`` under ``python agent.py``, in a module named after the file's
    absolute path under ``agentsaga resume --app agent.py``, and in ``mypkg.agents`` when imported.
    A run started one way must resume the other way, and after the project directory moved. A
    function of another module is imported by that module's own name, the same whichever way the
    app was loaded, so its module stays part of the name: ``flights:cancel`` is not
    ``hotels:cancel``. The colon also tells this form from the ``module.qualname`` that older
    versions recorded (read by ``orchestrator/engine/graph_changes.py``)."""
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    if module is None or module in homes:
        return qualname
    return f"{module}:{qualname}"


def is_async_callable(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
