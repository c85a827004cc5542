"""Finding workflows: the ``module:attribute`` target a run records, and loading it back.

A target is ``package.module:attr`` or ``path/to/file.py:attr``. A workflow defined in a script run
as ``__main__`` is recorded by its file path (relative to the working directory when it is below
it), so ``agentsaga resume RUN`` can load it without running the script's main block.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from orchestrator.errors import WorkflowNotFoundError
from workflows import Workflow

__all__ = ["target_of", "load_target"]


def target_of(wf: Workflow) -> str | None:
    """Where ``wf`` can be imported from, or None when it cannot be found again."""
    module_name = wf.module
    module = sys.modules.get(module_name or "")
    attr = None
    if module is not None:
        for name, value in vars(module).items():
            if value is wf:
                attr = name
                break
    if attr is None:
        return None
    if module_name == "__main__" or (module_name or "").startswith("agentsaga_target_"):
        path = wf.module_file or getattr(module, "__file__", None)
        if not path:
            return None
        p = Path(path).resolve()
        try:
            shown = str(p.relative_to(Path.cwd()))
        except ValueError:
            shown = str(p)
        return f"{shown}:{attr}"
    return f"{module_name}:{attr}"


def load_target(target: str) -> Workflow:
    """Import ``module:attr`` or ``file.py:attr`` and return the Workflow it names."""
    if ":" not in target:
        raise WorkflowNotFoundError(f"workflow target {target!r} must look like 'module:attr' or 'file.py:attr'")
    where, _, attr = target.rpartition(":")
    try:
        if where.endswith(".py") or os.sep in where or "/" in where:
            module = _load_file(where)
        else:
            module = importlib.import_module(where)
    except WorkflowNotFoundError:
        raise
    except Exception as exc:  # an import error inside user code: say which target and why
        raise WorkflowNotFoundError(f"cannot import workflow target {target!r}: {type(exc).__name__}: {exc}") from exc
    value: Any = getattr(module, attr, None)
    if value is None:
        raise WorkflowNotFoundError(f"workflow target {target!r}: {where!r} has no attribute {attr!r}")
    if not isinstance(value, Workflow):
        raise WorkflowNotFoundError(f"workflow target {target!r} is a {type(value).__name__}, not a Workflow")
    return value


def _load_file(path: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise WorkflowNotFoundError(f"workflow file {path!r} does not exist (working directory {os.getcwd()!r})")
    resolved = p.resolve()
    # A stable module name per file, so loading twice gives the same module (and Workflow object).
    name = "agentsaga_target_" + "".join(c if c.isalnum() else "_" for c in str(resolved))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise WorkflowNotFoundError(f"cannot load workflow file {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(resolved.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        try:
            sys.path.remove(str(resolved.parent))
        except ValueError:
            pass
    return module
