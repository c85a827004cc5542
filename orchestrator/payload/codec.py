"""The journal's JSON codec (invariant 8: no pickle).

Plain JSON values pass through. A few common Python types are written as single-key tagged objects
and restored on decode:

    datetime -> {"$datetime": ISO-8601}     date -> {"$date": ...}     time -> {"$time": ...}
    timedelta -> {"$timedelta": seconds}    bytes -> {"$bytes": base64}
    Decimal -> {"$decimal": "1.10"}         UUID -> {"$uuid": "..."}   set/frozenset -> {"$set": [...]}

Pydantic / SQLModel models and dataclasses are written as their fields (a dict) and come back as a
dict; a typed workflow state re-validates them into its model. Enums are written as their value,
tuples as lists. Anything else (and NaN/infinity, which are not JSON) is an ``EncodingError``
naming the path of the value and its type. A dict whose only key starts with ``$`` is reserved for
these tags.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import json
import math
import uuid
from typing import Any

from orchestrator.errors import EncodingError

__all__ = ["dumps", "loads", "canonical_dumps"]


def _default(value: Any) -> Any:
    # Called by the C encoder only for values it cannot write itself, so plain payloads stay fast.
    if isinstance(value, _dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, _dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, _dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, _dt.timedelta):
        return {"$timedelta": value.total_seconds()}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, (set, frozenset)):
        items = list(value)
        try:
            items.sort()
        except TypeError:  # mixed types: keep a stable order by their JSON text instead
            items.sort(key=lambda v: json.dumps(v, default=_default, sort_keys=True))
        return {"$set": items}
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "model_dump") and not isinstance(value, type):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"unencodable:{type(value).__module__}.{type(value).__qualname__}")


_DECODERS = {
    "$datetime": _dt.datetime.fromisoformat,
    "$date": _dt.date.fromisoformat,
    "$time": _dt.time.fromisoformat,
    "$timedelta": lambda v: _dt.timedelta(seconds=v),
    "$bytes": lambda v: base64.b64decode(v),
    "$decimal": decimal.Decimal,
    "$uuid": uuid.UUID,
    "$set": set,
}


def _hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        key = next(iter(obj))
        if key[:1] == "$":
            decoder = _DECODERS.get(key)
            if decoder is not None:
                return decoder(obj[key])
    return obj


_encoder = json.JSONEncoder(default=_default, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_canonical = json.JSONEncoder(
    default=_default, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
)
_decoder = json.JSONDecoder(object_hook=_hook)


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode for the journal; ``what`` names the value in the error (e.g. "output of step 'plan'")."""
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(value, what, exc) from None


def canonical_dumps(value: Any, *, what: str = "value") -> str:
    """Key-sorted encoding: the same value always gives the same text (snapshot hashes rely on it)."""
    try:
        return _canonical.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(value, what, exc) from None


def loads(text: str) -> Any:
    return _decoder.decode(text)


def _explain(value: Any, what: str, exc: BaseException) -> EncodingError:
    """Find the first value that cannot be encoded and say where it is."""
    path, culprit = _find_culprit(value, "$", set())
    if culprit is _CYCLE:
        return EncodingError(f"{what} cannot be journaled: it contains a reference cycle at {path}", path=path)
    if culprit is not _NONE:
        kind = type(culprit)
        if isinstance(culprit, float):
            detail = f"{culprit!r} is not valid JSON"
        else:
            detail = f"value of type {kind.__module__}.{kind.__qualname__} is not JSON-encodable"
        return EncodingError(
            f"{what} cannot be journaled: {detail} at {path} (return JSON data, or a datetime, bytes, "
            "Decimal, UUID, set, dataclass or pydantic model)",
            path=path,
            type_name=f"{kind.__module__}.{kind.__qualname__}",
        )
    return EncodingError(f"{what} cannot be journaled: {exc}")


class _Sentinel:
    pass


_NONE = _Sentinel()
_CYCLE = _Sentinel()


def _find_culprit(value: Any, path: str, seen: set[int]) -> tuple[str, Any]:
    if value is None or isinstance(value, (str, bool, int)):
        return path, _NONE
    if isinstance(value, float):
        return (path, value) if not math.isfinite(value) else (path, _NONE)
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return path, _CYCLE
        seen = seen | {id(value)}
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    return f"{path}[{k!r}] (key)", k
                found = _find_culprit(v, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k!r}]", seen)
                if found[1] is not _NONE:
                    return found
            return path, _NONE
        for i, v in enumerate(value):
            found = _find_culprit(v, f"{path}[{i}]", seen)
            if found[1] is not _NONE:
                return found
        return path, _NONE
    try:
        replacement = _default(value)
    except TypeError:
        return path, value
    if replacement is value:
        return path, value
    return _find_culprit(replacement, path, seen)
