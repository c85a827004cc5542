"""The workflows a process knows: registered by name, found again for a stored run.

A run records its workflow's name, version and graph fingerprint; the code that drives it is the
workflow registered under that name (``Orchestrator(workflows=[...])``, ``register``, or on the
command line an app named with ``--app``, ``AGENTSAGA_APP`` or ``agentsaga.toml``). Nothing else:
a run whose workflow is not registered is an error that says how to register it, never a reason
to import whatever its database row names (invariant 11). Runs written by older versions still
carry a ``target`` (a module or file path); it is not read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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
        """The registered workflow that drives ``rec``; None (or ``WorkflowNotFoundError`` when required)."""
        wf = self._by_name.get(rec.workflow)
        if wf is not None or not required:
            return wf
        raise WorkflowNotFoundError(not_registered(rec, self.names()))


def not_registered(rec: RunRecord, known: list[str]) -> str:
    """Why a run cannot be driven here, and how to register its workflow."""
    here = f"this process registers {', '.join(map(repr, known))}" if known else "this process registers no workflow"
    return (f"run {rec.run_id!r} is workflow {rec.workflow!r} version {rec.version!r}, which is not registered "
            f"({here}). Register it: Orchestrator(workflows=[...]) in code; on the command line --app MODULE, "
            "AGENTSAGA_APP=MODULE or app = \"MODULE\" in agentsaga.toml (or [tool.agentsaga] in pyproject.toml). "
            "A run never names code to import (docs/security.md)")
