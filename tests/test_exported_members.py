"""The public surface is pinned: a name added to or dropped from a package's ``__all__`` is a decision.

Each package of ``orchestrator`` exports the names of its family; the root keeps only what most
users import. (``store`` and ``compensations`` pin theirs beside their own tests.)
"""

from __future__ import annotations

import importlib

import pytest

EXPORTS: dict[str, set[str]] = {
    "workflows": {
        "END", "MISSING", "NO_RETRY", "DefinitionError", "Retry", "RoutingError", "ReducerError", "InputError", "Step", "Workflow",
        "WorkflowError", "reducers", "Snapshots", "Adaptive",
    },
    "orchestrator": {
        "Orchestrator", "RunResult", "StepContext",
        "OrchestratorError", "ConfigurationError", "WorkflowNotFoundError", "GraphChangedError", "EncodingError",
        "CodeChangedError", "MigrationError",
        "StepTimeoutError", "LoopLimitError", "ToolLoopLimitError", "PromptError", "RunStateError", "JournalDamagedError", "SavepointError", "RunFailedError",
        "InDoubtError", "WaitTimeoutError", "ReplayError", "ReplayMismatchError", "ReplayMissingError", "ToolError",
        "RetryableToolError", "PermanentToolError", "CircuitOpenError",
        "StoreError", "StoreUnavailableError", "RunNotFoundError", "FencedError", "LeaseHeldError",
    },
    "orchestrator.engine": {
        "Engine", "EngineConfig", "EventKind", "ACTIVE_STATUSES", "TERMINAL_STATUSES", "RunState", "fold", "apply",
        "ActiveRun", "JournalWriter", "WorkflowRegistry", "StepContext", "RunResult", "current_step",
    },
    "orchestrator.payload": {
        "dumps", "loads", "canonical_dumps", "Redactor", "JournalRedactor", "REDACTED", "DEFAULT_PATTERNS",
        "bound_json", "error_record",
    },
    "orchestrator.tools": {
        "HttpTool", "AsyncHttpTool", "parse_retry_after", "StoreBreakers", "ToolLimits", "CallLimits", "ToolBox",
        "StepTools",
    },
    "orchestrator.agents": {
        "LLM", "AsyncLLM", "ChatResult", "ToolCall", "Prompt", "Prompts", "RenderedPrompt", "PromptError",
        "ToolRegistry", "ToolContext", "LoopResult", "run_tool_loop", "arun_tool_loop", "tool_agent",
        "ToolLoopLimitError",
        "Cassette",
    },
    "orchestrator.audit": {"Audit", "RunSummary", "VerifyReport", "VerifyProblem", "GcReport", "Stats"},
    "orchestrator.scale": {"Worker", "Limits", "QueueLimit", "DeadLetterPolicy"},
    "orchestrator.cli": {"main", "build_parser"},
    "orchestrator.contrib": set(),
}


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_each_package_exports_exactly_its_pinned_names(package):
    # Given a package of the public surface
    module = importlib.import_module(package)
    # Then its __all__ is exactly the pinned list, without duplicates, and every name resolves
    assert set(module.__all__) == EXPORTS[package]
    assert len(module.__all__) == len(set(module.__all__))
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.{name}"


#: exported names that are modules, by decision
MODULE_EXPORTS = {"workflows": {"reducers"}}

_EXPORTED_MODULES = """
import importlib, json, pkgutil, sys, types
package = sys.argv[1]
module = importlib.import_module(package)
for info in pkgutil.iter_modules(module.__path__):
    if not info.name.startswith("__"):
        try:
            importlib.import_module(package + "." + info.name)
        except ImportError:
            pass  # an optional extra that is not installed
print(json.dumps([name for name in module.__all__ if isinstance(getattr(module, name), types.ModuleType)]))
"""


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_an_exported_name_is_never_replaced_by_its_submodule(package):
    # Given a fresh interpreter that imported every submodule of the package (importing a submodule
    # sets it as an attribute of its package, over a name exported lazily under the same name, such
    # as orchestrator.engine's ``fold``)
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _EXPORTED_MODULES, package], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # Then no exported name is a module, but those exported as modules by decision
    assert set(json.loads(done.stdout)) == MODULE_EXPORTS.get(package, set())


def test_the_root_does_not_pull_in_the_agent_layer_or_the_report():
    # Given a fresh interpreter that imports only what most users need
    import subprocess
    import sys

    code = ("import sys, orchestrator; heavy = [m for m in ('jinja2', 'httpx', 'orchestrator.agents', "
            "'orchestrator.scale', 'orchestrator.cli') if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)")
    # When it imports orchestrator
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    # Then none of the agent layer, the HTTP client, the templating, the workers or the CLI was loaded
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_error_a_program_imports_from_orchestrator_is_documented():
    # Given the errors the root package exports (what `from orchestrator import ...` offers)
    import orchestrator
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    docs = "\n".join(p.read_text(encoding="utf-8") for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    errors = [n for n in orchestrator.__all__
              if isinstance(getattr(orchestrator, n), type) and issubclass(getattr(orchestrator, n), BaseException)]
    # Then each is named in the documentation, where a user looking up what a step may catch finds it
    assert errors and [n for n in errors if f"{n}" not in docs] == []


def test_orchestrator_errors_exports_every_error_it_defines():
    # Given the engine's error module
    import inspect

    import orchestrator.errors as errors

    defined = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__}
    # Then its __all__ is exactly the errors it defines, and its docstring's tree draws each of them
    assert set(errors.__all__) == defined
    assert [name for name in defined if f" {name} " not in errors.__doc__] == []
