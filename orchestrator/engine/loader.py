"""Importing the workflows a person named: on the command line, in ``AGENTSAGA_APP`` or in a project
config. Never what a database row names (invariant 11).

A stored run names its workflow (name, version, graph fingerprint), never a file or a module: a
row anyone with write access to the database can change must not decide what code a worker
imports and runs. So this module has no "where did this run's code come from" function; it only
loads what it is told to, and the registry (``engine/registry.py``) matches stored runs to
workflows by name.

Two shapes of spec:

- ``load_target("pkg.mod:attr")`` / ``load_target("path/to/file.py:attr")``: one workflow (``agentsaga
  run`` and ``enqueue``);
- ``load_app("pkg.mod")`` / ``load_app("path/to/file.py")`` (or either with ``:attr``): the workflows
  an application holds (``agentsaga worker``, ``--app``, ``AGENTSAGA_APP``, ``app = ...`` in the
  config). A module's workflows are the ``Workflow`` objects at its top level, in definition
  order; ``:attr`` names one workflow or a list of them.

An app supplies its compensations too: ``load_app_code`` returns the workflows and the
``compensations.Compensations`` registries at the module's top level (with ``:attr`` as well: the
attribute picks workflows, and the registries of the module they are defined beside still undo
their effects), and ``AppCode.registry()`` makes one registry of them for the Orchestrator. A
module of an app may hold only registries; ``load_registries`` gives those of a ``run`` target's
module.

``base`` is the directory relative paths and modules are resolved in (a config file's directory;
the working directory by default): a file path is joined to it, and it is put first on
``sys.path`` while a module is imported, as ``python -m`` puts the working directory there. So
``--app mypkg.agents`` (or ``AGENTSAGA_APP``, ``agentsaga worker mypkg.agents``) finds the package
in the directory the command runs in, whether the CLI was started as the ``agentsaga`` script
(whose ``sys.path`` holds its own directory, not the working directory) or as ``python -m``; and
``app = "agents.flows"`` next to ``agentsaga.toml`` works from any sub-directory. The directory
is always one a person chose (where they ran the command, where their config is), never one a
run names.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compensations import Compensations
from orchestrator.errors import WorkflowNotFoundError
from workflows import Workflow

__all__ = ["AppCode", "load_target", "load_app", "load_app_code", "load_registries", "split_spec"]


@dataclass(frozen=True, slots=True)
class AppCode:
    """What an app supplies: its workflows, and the compensation registries defined beside them."""

    workflows: tuple[Workflow, ...] = ()
    compensations: tuple[Compensations, ...] = ()

    def __add__(self, other: AppCode) -> AppCode:
        """Both apps' code, each object once (a module imported under two specs is one module)."""
        return AppCode(tuple(_unique((*self.workflows, *other.workflows))),
                       tuple(_unique((*self.compensations, *other.compensations))))

    def registry(self) -> Compensations | None:
        """The app's compensations as one registry for ``Orchestrator(compensations=...)``: None
        without any, the one registry it has, else ``Compensations.combine`` of them (one name with
        two different functions is a ``CompensationDefinitionError`` naming both)."""
        found: list[Compensations] = _unique(self.compensations)
        if not found:
            return None
        return found[0] if len(found) == 1 else Compensations.combine(*found)


def split_spec(spec: str) -> tuple[str, str | None]:
    """``("pkg.mod", "attr")`` for ``pkg.mod:attr``; ``(spec, None)`` when no attribute is named
    (what follows the last ``:`` is not a name, as in a Windows path ``C:\\flows.py``)."""
    where, colon, attr = spec.strip().rpartition(":")
    if colon and where and attr.isidentifier():
        return where, attr
    return spec.strip(), None


def _split(spec: str, what: str) -> tuple[str, str | None]:
    if not isinstance(spec, str) or not spec.strip():
        raise WorkflowNotFoundError(f"{what} must be a module, a file.py, or either with ':attr'; got {spec!r}")
    return split_spec(spec)


def _is_path(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def _import(where: str, spec: str, what: str, base: Path | None) -> Any:
    try:
        if _is_path(where):
            return _load_file(where, base)
        return _import_module(where, base)
    except WorkflowNotFoundError:
        raise
    except Exception as exc:  # an import error inside user code: say which spec and why
        raise WorkflowNotFoundError(f"cannot import {what} {spec!r}: {type(exc).__name__}: {exc}") from exc
    except SystemExit as exc:  # a script's own exit on import: not ours to obey silently
        raise WorkflowNotFoundError(
            f"cannot import {what} {spec!r}: importing it called sys.exit({exc.code!r}); an app module "
            "must define its workflows without running a program (put that under "
            "`if __name__ == \"__main__\":`)") from exc


def load_target(spec: str, *, base: str | os.PathLike[str] | None = None) -> Workflow:
    """Import ``module:attr`` or ``file.py:attr`` and return the Workflow it names."""
    where, attr = _split(spec, "workflow target")
    if attr is None:
        raise WorkflowNotFoundError(f"workflow target {spec!r} must look like 'module:attr' or 'file.py:attr'")
    module = _import(where, spec, "workflow target", _base(base))
    value: Any = getattr(module, attr, None)
    if value is None:
        raise WorkflowNotFoundError(f"workflow target {spec!r}: {where!r} has no attribute {attr!r}")
    if not isinstance(value, Workflow):
        raise WorkflowNotFoundError(f"workflow target {spec!r} is a {type(value).__name__}, not a Workflow")
    return value


def load_app(spec: str, *, base: str | os.PathLike[str] | None = None) -> list[Workflow]:
    """The workflows of an application: every top-level Workflow of a module or file, or what
    ``:attr`` names (a Workflow or a list of them). An app without any is an error."""
    where, attr = _split(spec, "app")
    module = _import(where, spec, "app", _base(base))
    found = _workflows(module, spec, where, attr)
    if not found:
        raise WorkflowNotFoundError(f"app {spec!r} defines no Workflow at its top level; name one with "
                                    f"'{where}:attr'")
    return found


def load_app_code(spec: str, *, base: str | os.PathLike[str] | None = None) -> AppCode:
    """The workflows of an application (as ``load_app``) and the ``Compensations`` registries at its
    module's top level, also when ``:attr`` picks the workflows. A module may hold only registries
    (the compensations of workflows defined in another module of the app); one with neither is an
    error."""
    where, attr = _split(spec, "app")
    module = _import(where, spec, "app", _base(base))
    code = AppCode(tuple(_workflows(module, spec, where, attr)), tuple(_registries(module)))
    if not code.workflows and not code.compensations:
        raise WorkflowNotFoundError(f"app {spec!r} defines no Workflow (and no Compensations registry) at its "
                                    f"top level; name a workflow with '{where}:attr'")
    return code


def load_registries(spec: str, *, base: str | os.PathLike[str] | None = None) -> list[Compensations]:
    """The ``Compensations`` registries at the top level of the module or file ``spec`` names (its
    ``:attr``, if any, is not looked at): those of a workflow ``run`` was given as code."""
    where, _ = _split(spec, "workflow target")
    return _registries(_import(where, spec, "workflow target", _base(base)))


def _registries(module: Any) -> list[Compensations]:
    return _unique(v for v in vars(module).values() if isinstance(v, Compensations))


def _workflows(module: Any, spec: str, where: str, attr: str | None) -> list[Workflow]:
    """A module's top-level workflows (possibly none), or the one(s) ``attr`` names (then required)."""
    if attr is None:
        return _unique(v for v in vars(module).values() if isinstance(v, Workflow))
    value: Any = getattr(module, attr, None)
    if value is None:
        raise WorkflowNotFoundError(f"app {spec!r}: {where!r} has no attribute {attr!r}")
    if isinstance(value, Workflow):
        return [value]
    if isinstance(value, (list, tuple, set, frozenset)) and value and all(isinstance(v, Workflow) for v in value):
        return _unique(value)
    raise WorkflowNotFoundError(f"app {spec!r} is a {type(value).__name__}, not a Workflow or a list of Workflows")


def _unique(values: Iterable[Any]) -> list[Any]:
    """``values`` in order, each object once (by identity)."""
    out: list[Any] = []
    for value in values:
        if not any(value is seen for seen in out):
            out.append(value)
    return out


def _base(base: str | os.PathLike[str] | None) -> Path | None:
    return None if base is None else Path(base)


def _import_module(name: str, base: Path | None) -> Any:
    """Import ``name`` with ``base`` (default: the working directory) first on ``sys.path`` for the
    time of the import; a module that is not found is an error naming where it was looked for."""
    entry = str((base or Path.cwd()).resolve())
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _is_part_of(exc.name, name):
            raise  # a module the app itself imports is missing: Python's message says which
        where = f"{entry!r}, the working directory," if base is None else repr(entry)
        raise ModuleNotFoundError(f"No module named {exc.name!r} (looked in {where} and on sys.path)",
                                  name=exc.name) from None
    finally:
        if added:
            try:
                sys.path.remove(entry)
            except ValueError:
                pass


def _is_part_of(missing: str, name: str) -> bool:
    """Whether the module Python did not find is ``name`` or one of its parent packages."""
    return name == missing or name.startswith(missing + ".")


def _load_file(path: str, base: Path | None) -> Any:
    p = Path(path)
    if base is not None and not p.is_absolute():
        p = base / p
    if not p.is_file():
        where = f"relative to {str(base)!r}" if base is not None else f"working directory {os.getcwd()!r}"
        raise WorkflowNotFoundError(f"workflow file {path!r} does not exist ({where})")
    resolved = p.resolve()
    # A stable module name per file, so loading twice gives the same module (and Workflow objects).
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
