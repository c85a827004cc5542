"""Reducers: how a step's update to one state field is merged into the state.

A reducer is ``(current, update) -> new``; ``current`` is ``MISSING`` when the field is not yet in
the state. The journal stores updates, not whole states, so a reducer must be deterministic: the
same history always folds to the same state (invariant 2). Replace is the default.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

from workflows.errors import DefinitionError

__all__ = ["MISSING", "Reducer", "replace", "append", "extend", "add", "merge", "reducers_of_model"]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()

Reducer = Callable[[Any, Any], Any]


def replace(current: Any, update: Any) -> Any:
    """The update replaces the field (the default)."""
    return update


def append(current: Any, update: Any) -> list[Any]:
    """Append to a list; a list or tuple update appends each of its items."""
    base = [] if current is MISSING or current is None else list(current)
    if isinstance(update, (list, tuple)):
        base.extend(update)
    else:
        base.append(update)
    return base


def extend(current: Any, update: Any) -> list[Any]:
    """Extend a list by an iterable update (a single value is an error)."""
    if not isinstance(update, (list, tuple)):
        raise TypeError(f"extend reducer needs a list update, got {type(update).__name__}")
    base = [] if current is MISSING or current is None else list(current)
    base.extend(update)
    return base


def add(current: Any, update: Any) -> Any:
    """Add numbers (a counter)."""
    return update if current is MISSING or current is None else current + update


def merge(current: Any, update: Any) -> dict[Any, Any]:
    """Shallow-merge a dict update into a dict field."""
    if not isinstance(update, Mapping):
        raise TypeError(f"merge reducer needs a dict update, got {type(update).__name__}")
    base = {} if current is MISSING or current is None else dict(current)
    base.update(update)
    return base


def check_reducer(name: str, reducer: object, *, workflow: str) -> Reducer:
    if not callable(reducer):
        raise DefinitionError(f"reducer for field {name!r} is not callable: {reducer!r}", workflow=workflow)
    return reducer  # type: ignore[return-value]


def reducers_of_model(model: type, *, workflow: str) -> dict[str, Reducer]:
    """Reducers declared on a pydantic model as ``Annotated[list[str], append]``."""
    found: dict[str, Reducer] = {}
    fields = getattr(model, "model_fields", {})
    for field_name, info in fields.items():
        for meta in getattr(info, "metadata", ()):
            if _is_reducer(meta):
                found[field_name] = check_reducer(field_name, meta, workflow=workflow)
    # Annotated metadata can also be lost by some field types; read raw hints as a fallback.
    try:
        hints = typing.get_type_hints(model, include_extras=True)
    except Exception:  # unresolved forward references: the metadata path above is enough
        hints = {}
    for field_name, hint in hints.items():
        if field_name in found or typing.get_origin(hint) is not typing.Annotated:
            continue
        for meta in hint.__metadata__:
            if _is_reducer(meta):
                found[field_name] = check_reducer(field_name, meta, workflow=workflow)
    return found


def _is_reducer(meta: object) -> bool:
    # Only plain functions count: pydantic puts constraint objects (which may be callable) in metadata.
    return callable(meta) and getattr(meta, "__module__", None) is not None and (
        meta in (replace, append, extend, add, merge) or getattr(meta, "__agentsaga_reducer__", False)
        or type(meta).__name__ == "function"
    )
