"""What a step or a router sees of the run's state: a copy-on-access view, not a deep copy.

A step may do anything to the state it is handed (append to a nested list, bump a counter in a
nested dict) and none of it may reach the run's state: only its returned update does (exactly-once
case 10). Deep-copying the whole state for every attempt (and again for the router's preview)
made the per-step cost grow with the state: on a 1,000-turn conversation, ~5x from the first to
the last 100 steps. A view copies only what the step actually reaches, one level at a time:

- ``CowDict`` is a dict holding the shared values; the first time a value is read it is replaced,
  in the view only, by a view of it (a container) or kept as is (an immutable scalar);
- ``CowList`` does the same per element; appending, inserting or assigning makes the new element
  the view's own (it is never copied behind the caller's back).

So ``len(state["messages"])`` costs a pointer copy of the list, not a copy of every message, and a
step that touches one message copies one message. Every way Python hands out an element (indexing,
slicing, iteration, ``get``, ``items``, ``values``, ``pop``, ``+``, ``*``, ``copy``, ``sort`` with a
key, ``{**view}``, ``dict(view)``, ``copy.deepcopy``) goes through the view. Read-only paths that
bypass it in C (``==``, ``repr``, ``json.dumps``) only read. The shared state is never written.

What the view cannot guard: code that reads a dict's or list's own storage in C and then changes
what it got, such as unbound ``dict.get(view, key)`` or ``list.__getitem__(view, i)``, or an
extension that walks a mapping in C and keeps its values (a model validated from the raw state with
a field typed ``Any``). Copy first (``copy.deepcopy(state)``) before handing the state to such code.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, Self

__all__ = ["CowDict", "CowList", "copy_json", "cow"]

_SCALARS = (str, int, float, bool, bytes, type(None))


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), faster than ``copy.deepcopy``."""
    try:
        return _copy(value)
    except RecursionError:
        # Nested deeper than this recursion allows (two frames a level) but not than the journal
        # does: what was journaled can always be copied.
        return _copy_deep(value)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    return copy.deepcopy(value)


def _copy_deep(value: Any) -> Any:
    """``_copy`` without recursion over dicts and lists (other values are copied with ``_copy``)."""
    root: list[Any] = [None]
    # (source, the container the copy goes in, its key there)
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, dict):
            parent[key] = made = dict.fromkeys(item)
            stack.extend((v, made, k) for k, v in item.items())
        elif isinstance(item, list):
            parent[key] = made = [None] * len(item)
            stack.extend((v, made, i) for i, v in enumerate(item))
        else:
            parent[key] = _copy(item)
    return root[0]


def cow(value: Any) -> Any:
    """A view of ``value`` that can be changed without changing ``value`` (see the module docstring)."""
    if isinstance(value, _SCALARS):
        return value
    if type(value) is dict or type(value) is CowDict:
        return CowDict(value)
    if type(value) is list or type(value) is CowList:
        return CowList(value)
    return copy_json(value)  # anything else (a tuple, a set, a decoded codec value): a plain deep copy


def _plain(value: Any) -> Any:
    """``value`` with its views turned into plain containers (for ``copy.deepcopy`` and ``__reduce__``)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


class CowDict(dict):
    """A dict over shared values, each copied on first access (see the module docstring)."""

    __slots__ = ("_own",)

    def __init__(self, shared: dict[str, Any]) -> None:
        dict.__init__(self, shared)
        self._own: set[Any] = set()

    # -- reading: every value leaves through here ----------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if key in self._own:
            return value
        mine = cow(value)
        dict.__setitem__(self, key, mine)
        self._own.add(key)
        return mine

    def _own_all(self) -> None:
        for key in dict.keys(self):
            if key not in self._own:
                self.__getitem__(key)  # takes ownership

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self.__getitem__(key)
        return default

    def __iter__(self) -> Iterator[Any]:
        # Defined so that dict(view), {**view} and dict.update(view) read values through __getitem__
        # (CPython takes a fast path that reads the raw values only for dicts that keep dict's __iter__).
        return dict.__iter__(self)

    def items(self):  # type: ignore[override]
        self._own_all()
        return dict.items(self)

    def values(self):  # type: ignore[override]
        self._own_all()
        return dict.values(self)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            value = self[key]
            dict.__delitem__(self, key)
            self._own.discard(key)
            return value
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        key = next(reversed(dict.keys(self)))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        self[key] = default
        return default

    def copy(self) -> dict[str, Any]:
        self._own_all()
        return dict(dict.items(self))

    # -- writing: what the caller puts in is its own ---------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._own.add(key)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._own.discard(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> Self:
        self.update(other)
        return self

    def __or__(self, other: Any) -> dict[str, Any]:
        merged = self.copy()
        merged.update(other)
        return merged

    def __ror__(self, other: Any) -> dict[str, Any]:
        merged = dict(other)
        merged.update(self.copy())
        return merged

    def clear(self) -> None:
        dict.clear(self)
        self._own.clear()

    # -- copying ------------------------------------------------------------------------------
    def __copy__(self) -> dict[str, Any]:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return _plain(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (dict, (_plain(self),))


class CowList(list):
    """A list over shared elements, each container copied on first access (see the module docstring)."""

    __slots__ = ("_own",)

    def __init__(self, shared: list[Any]) -> None:
        list.__init__(self, shared)
        #: ids of elements that are the view's own (copies it made, values the caller put in); they
        #: stay alive while in the list, so an id names one object for as long as it matters
        self._own: set[int] = set()

    def _at(self, index: int) -> Any:
        value = list.__getitem__(self, index)
        if isinstance(value, _SCALARS) or id(value) in self._own:
            return value
        mine = cow(value)
        list.__setitem__(self, index, mine)
        self._own.add(id(mine))
        return mine

    def _own_all(self) -> None:
        for i in range(len(self)):
            self._at(i)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self)))]
        return self._at(index)

    def __iter__(self) -> Iterator[Any]:
        i = 0
        while i < len(self):
            yield self._at(i)
            i += 1

    def __reversed__(self) -> Iterator[Any]:
        i = len(self) - 1
        while i >= 0:
            if i < len(self):
                yield self._at(i)
            i -= 1

    def pop(self, index: int = -1) -> Any:
        value = self._at(index)
        list.pop(self, index)
        return value

    def copy(self) -> list[Any]:
        self._own_all()
        return list.__getitem__(self, slice(None))

    def __add__(self, other: Any) -> list[Any]:
        return self.copy() + list(other)

    def __radd__(self, other: Any) -> list[Any]:
        return list(other) + self.copy()

    def __mul__(self, times: Any) -> list[Any]:
        return self.copy() * times

    __rmul__ = __mul__

    def __imul__(self, times: Any) -> Self:
        self._own_all()
        list.__imul__(self, times)
        return self

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._own_all()  # a key function sees the elements: they must be the view's own
        list.sort(self, *args, **kwargs)

    # -- writing: what the caller puts in is its own ---------------------------------------------
    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            value = list(value)
            self._own.update(id(v) for v in value)
        else:
            self._own.add(id(value))
        list.__setitem__(self, index, value)

    def append(self, value: Any) -> None:
        self._own.add(id(value))
        list.append(self, value)

    def insert(self, index: Any, value: Any) -> None:
        self._own.add(id(value))
        list.insert(self, index, value)

    def extend(self, values: Any) -> None:
        values = list(values)
        self._own.update(id(v) for v in values)
        list.extend(self, values)

    def __iadd__(self, values: Any) -> Self:
        self.extend(values)
        return self

    # -- copying ------------------------------------------------------------------------------
    def __copy__(self) -> list[Any]:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return _plain(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (_plain(self),))
