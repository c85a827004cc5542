"""The journal's JSON codec (invariant 8: no pickle).

Plain JSON values pass through. A few common Python types are written as single-key tagged objects
and restored on decode:

    datetime -> {"$datetime": ISO-8601}     date -> {"$date": ...}     time -> {"$time": ...}
    timedelta -> {"$timedelta": seconds}    bytes -> {"$bytes": base64}
    Decimal -> {"$decimal": "1.10"}         UUID -> {"$uuid": "..."}   set/frozenset -> {"$set": [...]}

Pydantic / SQLModel models and dataclasses are written as their fields (a dict) and come back as a
dict; a typed workflow state re-validates them into its model. Enums are written as their value,
tuples as lists. Anything else (and NaN/infinity, which are not JSON) is an ``EncodingError``
naming the path of the value and its type.

**The escape.** Any JSON a user returns comes back exactly, including dicts that look like tags
(``{"$set": {"status": "paid"}}`` is every MongoDB update). On encode, a *user* dict whose only key
starts with ``$`` is written with one more ``$`` in front of that key; on decode, a single-key dict
whose key starts with ``$$`` loses one ``$`` and is otherwise left alone::

    {"$set": {"a": 1}}  ->  {"$$set": {"a": 1}}  ->  {"$set": {"a": 1}}
    {"$$x": 1}          ->  {"$$$x": 1}          ->  {"$$x": 1}

A single-key dict with one ``$`` is a tag when the key is a known tag and is kept as it is
otherwise. Journals written before the escape still decode as they always did (their tag-shaped
user dicts were ambiguous then and decode as tags; a ``$$``-keyed single-key dict, which the old
codec never wrote for a tag, now loses one ``$``).

Escaping costs nothing on the common path: the text is encoded first, and only a text that holds
``{"$`` at all (a tag, or a user dict to escape) is encoded a second time from an escaped copy.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import json
import math
import re
import uuid
from collections.abc import Callable
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
        for item in items:
            if isinstance(item, (tuple, frozenset)) or hasattr(item, "model_dump") or dataclasses.is_dataclass(item):
                # Written as a list or a dict, it would come back unhashable: the set could not be rebuilt.
                raise TypeError(f"unencodable-member:{type(item).__module__}.{type(item).__qualname__}")
        try:
            items.sort()
        except TypeError:  # mixed types: keep a stable order by their JSON text instead
            items.sort(key=lambda v: json.dumps(v, default=_default, sort_keys=True))
        return {"$set": items}
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "model_dump") and not isinstance(value, type):
        return _escape(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _escape({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    raise TypeError(f"unencodable:{type(value).__module__}.{type(value).__qualname__}")


def _escape(value: Any) -> Any:
    """A copy of ``value`` in which every user dict whose only key starts with ``$`` has one more ``$``.

    Only dicts, lists and tuples are walked (and copied only where something changes); other values
    are left for ``_default``, which escapes the dicts it makes from models and dataclasses."""
    if isinstance(value, dict):
        changed = False
        out = {}
        for k, v in value.items():
            new = _escape(v)
            changed = changed or new is not v
            out[k] = new
        if len(out) == 1:
            key = next(iter(out))
            if isinstance(key, str) and key[:1] == "$":
                return {"$" + key: out[key]}
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [_escape(v) for v in value]
        if any(a is not b for a, b in zip(items, value)):
            return items
        return value
    return value


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
            if key[:2] == "$$":  # an escaped user dict (see the module docstring)
                return {key[1:]: obj[key]}
            decoder = _DECODERS.get(key)
            if decoder is not None:
                return decoder(obj[key])
    return obj


_encoder = json.JSONEncoder(default=_default, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_canonical = json.JSONEncoder(
    default=_default, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
)
_decoder = json.JSONDecoder(object_hook=_hook)
_plain_decoder = json.JSONDecoder()


def _one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, with the C encoder built once instead of on every call (building it costs
    more than encoding a small event). No cycle bookkeeping: a cycle ends in ``RecursionError``,
    which ``_encode`` explains. Where the C accelerator is missing, ``encoder.encode`` itself."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.ensure_ascii or encoder.indent is not None:
        return encoder.encode
    compiled = make(None, encoder.default, json.encoder.encode_basestring, None, encoder.key_separator,
                    encoder.item_separator, encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)
    join = "".join

    def encode(value: Any) -> str:
        return join(compiled(value, 0))

    return encode


_encode_plain = _one_shot(_encoder)
_encode_canonical = _one_shot(_canonical)


_MAYBE_TAGGED = '{"$'


def _encode(encode: Callable[[Any], str], value: Any, what: str) -> str:
    try:
        text = encode(value)
        if _MAYBE_TAGGED in text:
            # A tag or a dict that looks like one: encode again from a copy with user dicts escaped.
            text = encode(_escape(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(value, what, exc) from None
    if not text.isascii() and not _utf8(text):
        # A lone surrogate (from a JSON "\ud800" escape, or bytes decoded with surrogateescape) is
        # not text: no database stores it as UTF-8, so the write would fail after the step was done.
        path, culprit = _find_surrogate(value, "$", set())
        raise EncodingError(f"{what} cannot be journaled: the text at {path} holds a lone surrogate "
                            f"({culprit!a}), which is not valid Unicode (decode bytes with errors='replace', "
                            "or drop the character)", path=path, type_name="str")
    return text


#: a UTF-16 surrogate code point on its own: str can hold one, UTF-8 cannot encode it
_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored as UTF-8 (encoding it is several times faster than a search)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _find_surrogate(value: Any, path: str, seen: set[int]) -> tuple[str, str]:
    """The path of the first string (a value or a key) holding a lone surrogate, and that character."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return (path, found.group()) if found else (path, "")
    if isinstance(value, (dict, list, tuple, set, frozenset)) and id(value) not in seen:
        seen.add(id(value))
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and _SURROGATE.search(k):
                    return f"{path}[{k!a}] (key)", _SURROGATE.search(k).group()
                where, char = _find_surrogate(v, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k!r}]", seen)
                if char:
                    return where, char
            return path, ""
        for i, v in enumerate(value):
            where, char = _find_surrogate(v, f"{path}[{i}]", seen)
            if char:
                return where, char
        return path, ""
    if hasattr(value, "model_dump") and not isinstance(value, type):
        return _find_surrogate(value.model_dump(), path, seen)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _find_surrogate({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, path, seen)
    return path, ""


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode for the journal; ``what`` names the value in the error (e.g. "output of step 'plan'")."""
    return _encode(_encode_plain, value, what)


def canonical_dumps(value: Any, *, what: str = "value") -> str:
    """Key-sorted encoding: the same value always gives the same text (snapshot hashes rely on it)."""
    return _encode(_encode_canonical, value, what)


def loads(text: str) -> Any:
    # A tag (and an escaped user dict) is a key that starts with "$". A text with no string that
    # starts with "$" (written out or as the \u0024 escape) holds none, and then the hook, called
    # for every object, would change nothing: decode without it.
    if '"$' in text or "\\u0024" in text:
        return _decoder.decode(text)
    return _plain_decoder.decode(text)


def _explain(value: Any, what: str, exc: BaseException) -> EncodingError:
    """Find the first value that cannot be encoded and say where it is."""
    path, culprit = _find_culprit(value, "$", set())
    if culprit is _CYCLE:
        return EncodingError(f"{what} cannot be journaled: it contains a reference cycle at {path}", path=path)
    if culprit is not _NONE:
        kind = type(culprit)
        if isinstance(culprit, float):
            detail = f"{culprit!r} is not valid JSON"
        elif isinstance(culprit, (set, frozenset)):
            member = next(type(m) for m in culprit if isinstance(m, (tuple, frozenset)) or hasattr(m, "model_dump")
                          or dataclasses.is_dataclass(m))
            return EncodingError(
                f"{what} cannot be journaled: the set at {path} holds a {member.__qualname__}, which would come "
                "back as a list or a dict, and a set cannot hold those (journal a list of them instead)",
                path=path, type_name=f"{kind.__module__}.{kind.__qualname__}")
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
