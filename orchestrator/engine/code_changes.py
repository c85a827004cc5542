"""Knowing when a step's code changed under a run, and upgrading a run to a new workflow version.

Each step's code is hashed (``step_code``: the sha256 of its source, dedented; of its bytecode when
the source cannot be read) and journaled in the ``StepCompleted`` of its first execution in a run,
so what is recorded is the code that actually ran. On resume, ``changed_steps`` compares the
recorded hashes with the registered code; the workflow's ``on_code_change`` says what happens: a
visible ``CodeChanged`` event and the run continues (``"journal"``, the default), or the resume is
refused with ``CodeChangedError`` (``"refuse"``). Old and new results are never mixed silently.

A run started under another version of its workflow resumes under the registered one only through
declared migrations (``@wf.migrate(from_version="1")``): ``migrate_state`` applies them in a
chain, each a function ``state -> state``; the result is journaled (``Migrated``) with the run
row's version and fingerprint set in the same transaction. Without a migration path the
graph-change error stays.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
import types
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.errors import EncodingError, MigrationError
from orchestrator.payload import codec
from workflows import Workflow

__all__ = ["step_code", "changed_steps", "migration_path", "migrate_state"]

_cache: dict[int, tuple[Callable[..., Any], str]] = {}


def _bytecode_text(code: types.CodeType) -> str:
    parts = [code.co_code.hex(), repr(code.co_names), repr(code.co_varnames)]
    for const in code.co_consts:
        parts.append(_bytecode_text(const) if isinstance(const, types.CodeType) else repr(const))
    return "\n".join(parts)


def step_code(fn: Callable[..., Any]) -> str:
    """A short hash of a step function's code: its source, else its bytecode, else its name."""
    cached = _cache.get(id(fn))
    if cached is not None and cached[0] is fn:
        return cached[1]
    target = inspect.unwrap(fn)
    try:
        text = textwrap.dedent(inspect.getsource(target))
    except Exception:  # noqa: BLE001 - no source (OSError, TypeError) or a file that no longer matches the code
        # (tokenize.TokenError, IndexError, SyntaxError: exec'd code named after another file): use the bytecode
        code = getattr(target, "__code__", None) or getattr(getattr(type(target), "__call__", None), "__code__", None)
        text = _bytecode_text(code) if code is not None else getattr(target, "__qualname__", repr(type(target)))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    _cache[id(fn)] = (fn, digest)
    return digest


def changed_steps(recorded: Mapping[str, str], wf: Workflow) -> dict[str, dict[str, str]]:
    """Steps whose registered code differs from the code that ran: ``{step: {"recorded", "now"}}``."""
    out: dict[str, dict[str, str]] = {}
    for name, was in sorted(recorded.items()):
        step = wf.steps.get(name)
        if step is None:
            continue  # a removed step is the graph check's finding
        now = step_code(step.fn)
        if now != was:
            out[name] = {"recorded": was, "now": now}
    return out


def migration_path(wf: Workflow, from_version: str) -> list[tuple[str, str, Callable[..., Any]]] | None:
    """The declared migrations from ``from_version`` to ``wf.version``, in order; None if there is none."""
    path: list[tuple[str, str, Callable[..., Any]]] = []
    version = from_version
    seen = {version}
    while version != wf.version:
        found = wf.migrations.get(version)
        if found is None:
            return None
        to, fn = found
        path.append((version, to, fn))
        if to in seen:
            return None  # a cycle never reaches the current version
        seen.add(to)
        version = to
    return path


def migrate_state(run_id: str, wf: Workflow, state: dict[str, Any], from_version: str) -> tuple[dict[str, Any], list[str]]:
    """Apply the migration path to a copy of ``state``: (new state, migration names).
    ``MigrationError`` names the migration that raised or returned a state that is not a JSON
    object, does not encode, or does not validate against the workflow's state model."""
    path = migration_path(wf, from_version)
    assert path is not None
    current: Any = codec.loads(codec.dumps(state))
    names = []
    for source, target, fn in path:
        name = getattr(fn, "__qualname__", repr(fn))
        where = f"migration {name!r} of workflow {wf.name!r} (version {source!r} -> {target!r}) on run {run_id!r}"
        try:
            current = fn(current)
        except Exception as exc:  # whatever the user's function raises, it is this migration's failure
            raise MigrationError(f"{where} raised {type(exc).__name__}: {exc}; nothing was written") from exc
        if not isinstance(current, dict):
            raise MigrationError(f"{where} returned a {type(current).__name__}, not a state (a dict)")
        try:
            current = codec.loads(codec.dumps(current, what=f"state returned by {where}"))
        except EncodingError as exc:
            raise MigrationError(f"{exc}; nothing was written") from None
        names.append(name)
    if wf.state_model is not None:
        try:
            wf.view(current)
        except Exception as exc:  # pydantic's ValidationError, or whatever the model raises
            raise MigrationError(f"the state migrated for run {run_id!r} does not validate as workflow {wf.name!r}'s "
                                 f"state: {exc}") from None
    return current, names
