"""What a durable call's journaled failure is raised again as, so that a step that runs again takes
the path it took.

A call that raised is journaled (``CallFailed``) with its error's type, message and fields. When the
same attempt runs again (after a crash, or woken for a later wait) the call is not performed: its
error is raised again, and the ``except`` that caught it the first time must catch it again:

- the project's tool errors and ``WaitTimeoutError``: themselves, with their fields;
- a builtin error (``KeyError``, ``ValueError``...): a ``CallFailedError`` that is also that type;
- an exception class of the user's (``billing.Declined``): that class, with the arguments and the
  attributes it was raised with (those the journal could hold), when the class is found among the
  modules already imported, by its module's and its classes' own namespaces. Nothing is imported
  to find it and none of its code runs to make it: the instance is made by the builtin exception
  constructor, without the class's ``__init__`` (a class that defines its own ``__new__`` is not
  made at all). The database names the class; the user's code, already loaded, is what it names
  (invariant 11: a stored path never makes code load or run). Its note says it was raised again;
- anything else (a class not imported in this process, one defined in ``__main__`` by a process
  that is not the one running now): a ``CallFailedError`` whose ``type_name`` names it.
"""

from __future__ import annotations

import builtins
import functools
import sys
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import (
    CallFailedError,
    CircuitOpenError,
    EncodingError,
    PermanentToolError,
    RetryableToolError,
    ToolError,
    WaitTimeoutError,
)
from orchestrator.payload import codec

__all__ = ["failure_fields", "recorded_error"]

#: the project's errors a journaled call failure is raised again as, with their fields
_RAISED_AGAIN = {cls.__name__: cls for cls in (PermanentToolError, RetryableToolError, CircuitOpenError, ToolError,
                                                WaitTimeoutError)}
#: fields of the project's errors, journaled by name
_FIELDS = ("tool", "status", "retry_after", "signal", "timeout_at")
#: the packages whose errors are raised again only as listed above: an error class of the engine's
#: own (its control flow among them) is never made from what a journal names
_OURS = frozenset({"orchestrator", "workflows", "compensations", "store"})
#: at most this many characters of a failure's arguments and attributes are journaled (each is
#: dropped whole when it would not fit: the message is always there)
_FIELDS_LIMIT = 4096


def failure_fields(exc: BaseException) -> dict[str, Any]:
    """What a ``CallFailed`` event keeps of ``exc`` beside its type and message: the project's error
    fields, and for any other error its arguments (``args``) and instance attributes (``attrs``),
    each only when the journal can hold it (JSON through the codec) in ``_FIELDS_LIMIT`` characters."""
    fields: dict[str, Any] = {}
    for name in _FIELDS:
        try:
            value = getattr(exc, name, None)
        except Exception:  # noqa: BLE001 (a property of the user's that raises: the failure is what counts)
            value = None
        if value is not None:
            fields[name] = value
    if type(exc).__module__.partition(".")[0] in _OURS:
        return fields
    budget = _FIELDS_LIMIT
    args = list(exc.args) if isinstance(exc.args, tuple) else []
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 (as error_record: its own __str__ must not lose the failure)
        message = None
    if args and args != [message]:  # one message argument is the message itself
        size = _size(args)
        if size is not None and size <= budget:
            fields["args"], budget = args, budget - size
    attrs: dict[str, Any] = {}
    for name, value in _instance_dict(exc).items():
        if not isinstance(name, str) or name.startswith("__") or name in _FIELDS:
            continue
        size = _size(value)
        if size is not None and size + len(name) <= budget:
            attrs[name], budget = value, budget - size - len(name)
    if attrs:
        fields["attrs"] = attrs
    return fields


def _instance_dict(exc: BaseException) -> dict[str, Any]:
    try:
        found = object.__getattribute__(exc, "__dict__")
    except AttributeError:
        return {}
    return dict(found) if isinstance(found, dict) else {}


def _size(value: Any) -> int | None:
    try:
        return len(codec.dumps(value, what="a call failure's field"))
    except (EncodingError, TypeError, ValueError, RecursionError):
        return None


def recorded_error(error: Mapping[str, Any], step: str, call: str, *, homes: tuple[str, ...] = ()) -> Exception:
    """The exception a journaled call failure (``error``: the event's record) of ``call`` (how the
    message names it: ``call 0 (lookup)``) stands for; see the module docstring. ``homes``: the
    modules a class journaled by its bare name (one of ``__main__``'s) is also looked for in, after
    ``__main__``: the step function's (a script run as ``python agent.py`` that is resumed by
    ``agentsaga resume --app agent.py`` defines its classes in module ``agent``)."""
    type_name = str(error.get("type", "Exception"))
    message = str(error.get("message", ""))
    cls = _RAISED_AGAIN.get(type_name.rsplit(".", 1)[-1]) if type_name.startswith("orchestrator.") else None
    if cls is RetryableToolError:
        return RetryableToolError(message, tool=error.get("tool"), status=error.get("status"),
                                  retry_after=error.get("retry_after"))
    if cls is CircuitOpenError:
        return CircuitOpenError(message, tool=error.get("tool"))
    if cls is WaitTimeoutError:  # a wait inside the call timed out: the step is told so again, as it was
        return WaitTimeoutError(message, step=step, signal=error.get("signal"), timeout_at=error.get("timeout_at"))
    if cls is not None:
        return cls(message, tool=error.get("tool"), status=error.get("status"))
    said = f"{call} of step {step!r} failed earlier in this attempt and is not performed again"
    text = f"{said}: {type_name}: {message}"
    builtin = getattr(builtins, type_name, None) if "." not in type_name else None
    if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin is not Exception:
        try:  # an ``except KeyError`` that caught it the first time catches it again
            return _failed_as(builtin)(text, type_name=type_name)
        except TypeError:  # (a builtin whose constructor needs more than a message)
            pass
    own = _loaded_class(type_name, homes)
    if own is not None:
        made = _made(own, error, message)
        if made is not None:
            made.add_note(f"raised again from the journal: {said}")
            return made
    return CallFailedError(text, type_name=type_name)


@functools.lru_cache(maxsize=None)
def _failed_as(builtin: type[Exception]) -> type[CallFailedError]:
    """``CallFailedError`` that is also a ``builtin`` exception (``KeyError``, ``ValueError``...):
    named as ``CallFailedError`` wherever it is recorded."""
    return type("CallFailedError", (CallFailedError, builtin), {"__module__": CallFailedError.__module__,
                                                                 "__qualname__": CallFailedError.__qualname__})


def _loaded_class(type_name: str, homes: tuple[str, ...] = ()) -> type[Exception] | None:
    """The exception class ``type_name`` (``module.Qual.Name`` as ``error_record`` writes it; a bare
    name for ``__main__``) names, if its module is already imported and is not the project's own:
    looked up in the module's and the classes' namespaces (no attribute hook runs, nothing is
    imported). It must be that class's own name (not another name bound to it), an ``Exception``,
    and made by a builtin ``__new__``."""
    parts = type_name.split(".")
    # ``module.Qual.Name``: the longest prefix that is an imported module is the module. When none
    # is, the whole name is a class of ``__main__`` (journaled without its module, ``Outer.Inner``
    # too) or, resumed from elsewhere, of the step function's module.
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        if module_name.partition(".")[0] in _OURS:
            return None
        module = sys.modules.get(module_name)
        if module is not None:
            return _own_class(module, module_name, parts[i:])
    for module_name in ("__main__", *homes):
        module = sys.modules.get(module_name)
        if module is not None and module_name.partition(".")[0] not in _OURS:
            found = _own_class(module, module_name, parts)
            if found is not None:
                return found
    return None


def _own_class(module: Any, module_name: str, names: list[str]) -> type[Exception] | None:
    """The exception class ``names`` (a qualified name's parts) of ``module``, as ``_loaded_class`` says."""
    found: Any = module
    for name in names:
        try:
            space = object.__getattribute__(found, "__dict__")
        except AttributeError:
            return None
        found = space.get(name) if isinstance(space, Mapping) else None
        if found is None:
            return None
    if not (isinstance(found, type) and issubclass(found, Exception)):
        return None
    if (found.__module__, found.__qualname__) != (module_name, ".".join(names)):
        return None
    if any("__new__" in vars(k) for k in found.__mro__ if k.__module__ != "builtins"):
        return None
    return found


def _made(cls: type[Exception], error: Mapping[str, Any], message: str) -> Exception | None:
    """An instance of ``cls`` with the journaled arguments (else the message) and attributes, made
    without running any of ``cls``'s code; None when the builtin constructor refuses them."""
    args = error.get("args")
    try:
        made = cls.__new__(cls, *(args if isinstance(args, list) else [message]))
        # the project's field names (``status``...) are journaled beside the type, the rest in attrs
        attrs = {name: error[name] for name in _FIELDS if error.get(name) is not None}
        if isinstance(error.get("attrs"), Mapping):
            attrs.update(error["attrs"])
        object.__getattribute__(made, "__dict__").update(
            {k: v for k, v in attrs.items() if isinstance(k, str) and not k.startswith("__")})
    except Exception:  # noqa: BLE001 (a builtin base that needs other arguments: raised as CallFailedError)
        return None
    return made
