"""The public surface is pinned: a name added to or dropped from a package's __all__ is a decision."""

from __future__ import annotations

import orchestrator
import workflows


def test_workflows_exports():
    assert sorted(workflows.__all__) == sorted([
        "END", "MISSING", "NO_RETRY", "DefinitionError", "Retry", "RoutingError", "Step", "Workflow",
        "WorkflowError", "reducers",
    ])
    for name in workflows.__all__:
        assert hasattr(workflows, name), name


def test_orchestrator_exports_resolve():
    for name in orchestrator.__all__:
        assert hasattr(orchestrator, name), name
    for required in ["Orchestrator", "RunResult", "StepContext", "fold", "EncodingError", "GraphChangedError",
                     "FencedError", "RunNotFoundError"]:
        assert required in orchestrator.__all__
