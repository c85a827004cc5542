"""The workflows a process knows: registered by name, found again for a stored run.

A run records its workflow's name, version and graph fingerprint; the code that drives it is the
workflow registered under that name (``Orchestrator(workflows=[...])``, ``register``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from orchestrator.engine.loader import load_target
from orchestrator.errors import ConfigurationError, WorkflowNotFoundError
from store import RunRecord
from workflows import Workflow

__all__ = ["WorkflowRegistry"]


class WorkflowRegistry:
    """Workflows by name. ``on_register`` is told of each newly registered workflow."""

    def __init__(self, workflows: Iterable[Workflow] = (), *,
                 on_register: Callable[[Workflow], None] | None = None) -> None:
        self._by_name: dict[str, Workflow] = {}
        self._on_register = on_register
        self.register(*workflows)

    def register(self, *workflows: Workflow) -> None:
        """Make workflows known by name (validated now: a bad graph fails here, not mid-run)."""
        for wf in workflows:
            if not isinstance(wf, Workflow):
                raise ConfigurationError(f"workflows must be Workflow objects, got {wf!r}")
            wf.validate()
            known = self._by_name.get(wf.name)
            if known is wf:
                continue
            if known is not None:
                raise ConfigurationError(f"two different workflows are named {wf.name!r}")
            if self._on_register is not None:
                self._on_register(wf)
            self._by_name[wf.name] = wf

    def get(self, name: str) -> Workflow | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def for_run(self, rec: RunRecord, *, required: bool = True) -> Workflow | None:
        """The workflow that drives ``rec``; None (or ``WorkflowNotFoundError`` when required)."""
        wf = self._by_name.get(rec.workflow)
        if wf is not None:
            return wf
        if rec.target:
            try:
                loaded = load_target(rec.target)
            except WorkflowNotFoundError:
                if required:
                    raise
                return None
            if loaded.name != rec.workflow:
                if required:
                    raise WorkflowNotFoundError(
                        f"target {rec.target!r} of run {rec.run_id!r} is workflow {loaded.name!r}, not {rec.workflow!r}"
                    )
                return None
            self.register(loaded)
            return loaded
        if required:
            raise WorkflowNotFoundError(
                f"workflow {rec.workflow!r} of run {rec.run_id!r} is not registered and the run records no import "
                "target; pass it with Orchestrator(workflows=[...])"
            )
        return None
