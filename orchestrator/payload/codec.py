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

**Keys.** JSON keys are strings, and ``json`` writes ``{1: "a"}`` as ``{"1": "a"}``: the value
would come back different from what the step returned, and ``{1: "a", "1": "b"}`` would lose an
entry without a word. So a dict whose keys are all of other kinds is written as a tagged list of
pairs and comes back with the same keys::

    {1: "a", 2: "b"}  ->  {"$map": [[1, "a"], [2, "b"]]}  ->  {1: "a", 2: "b"}

A key may be an int, float, bool, None, Decimal, UUID, bytes, date, time, datetime or timedelta
(each comes back equal to itself). A dict that mixes string keys with other keys, or holds a key
that would not come back as itself (a tuple would come back as a list, an enum as its value), is an
``EncodingError`` naming the dict's path and the key. Detecting such a dict costs little: only a
text holding a key that looks like one JSON made from a number, ``true``, ``false`` or ``null``
(``"1":``) is searched for it, and a string key such as ``"404"`` is then simply found to be a string.
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


def _default(value: Any, sort: bool = False) -> Any:
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
        return _escape(value.model_dump(), sort)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _escape({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, sort)
    raise TypeError(f"unencodable:{type(value).__module__}.{type(value).__qualname__}")


def _default_sorted(value: Any) -> Any:
    return _default(value, True)


#: key types whose JSON comes back equal to the key (and hashable): a dict of them is a ``$map``
_MAP_KEYS = (int, float, type(None), decimal.Decimal, uuid.UUID, bytes, _dt.date, _dt.time, _dt.timedelta)


def _key_problem(value: dict[Any, Any]) -> tuple[Any, str] | None:
    """The first key of ``value`` the codec cannot write so that it comes back, and why ("kind":
    it would not come back as itself; "mixed": a non-str key among str keys), or None."""
    has_str = False
    other = _ABSENT
    for key in value:
        if isinstance(key, str):
            has_str = True
        elif (not isinstance(key, _MAP_KEYS) or (isinstance(key, enum.Enum) and not isinstance(key, int))
              or (isinstance(key, float) and not math.isfinite(key))
              or (isinstance(key, decimal.Decimal) and not key.is_finite())):
            return key, "kind"
        elif other is _ABSENT:
            other = key
    if has_str and other is not _ABSENT:
        return other, "mixed"
    return None


def _escape(value: Any, sort: bool = False) -> Any:
    """A copy of ``value`` in which every user dict whose only key starts with ``$`` has one more
    ``$``, and every dict whose keys are not strings is a ``{"$map": [[key, value], ...]}`` (its
    pairs ordered by the key's JSON text when ``sort``, as a canonical text needs).

    Only dicts, lists and tuples are walked (and copied only where something changes); other values
    are left for ``_default``, which escapes the dicts it makes from models and dataclasses."""
    if isinstance(value, dict):
        changed = False
        out = {}
        for k, v in value.items():
            new = _escape(v, sort)
            changed = changed or new is not v
            out[k] = new
        if not _STR.issuperset(map(type, out)) and not all(isinstance(k, str) for k in out):
            if _key_problem(out) is not None:
                raise TypeError("unencodable-key")  # _explain finds it and says which
            pairs = [[k, v] for k, v in out.items()]
            if sort:
                pairs.sort(key=lambda pair: _canonical.encode(pair[0]))
            return {"$map": pairs}
        if len(out) == 1:
            key = next(iter(out))
            if key[:1] == "$":
                return {"$" + key: out[key]}
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [_escape(v, sort) for v in value]
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
    "$map": lambda pairs: {key: value for key, value in pairs},
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
    default=_default_sorted, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
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

#: a key as JSON writes one made from an int, a float, True, False or None (``"1":``, ``"-2.5":``,
#: ``"true":``): a text without one cannot hold a key that was not a string. (Inside a JSON string a
#: quote is escaped, so a match is a key, or at worst an escaped quote in a string: then the walk decides.)
_COERCED_KEY = re.compile(r'"(?:[-0-9][^"]*+|true|false|null)":')


def _encode(encode: Callable[[Any], str], value: Any, what: str, sort: bool = False) -> str:
    try:
        try:
            text = encode(value)
        except TypeError:
            # Perhaps keys json cannot write (a date) or sort (None among ints): written as pairs,
            # they can be. A value that cannot be encoded at all raises again.
            text = encode(_escape(value, sort))
        else:
            if _MAYBE_TAGGED in text or (_COERCED_KEY.search(text) is not None and _has_non_str_key(value)):
                # A tag, a dict that looks like one, or keys json turned into strings: encode again
                # from a copy with user dicts escaped and non-str keys written as pairs.
                text = encode(_escape(value, sort))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _explain(value, what, exc) from None
    if not text.isascii() and not _utf8(text):
        # A lone surrogate (from a JSON "\ud800" escape, or bytes decoded with surrogateescape) is
        # not text: no database stores it as UTF-8, so the write would fail after the step was done.
        try:
            path, culprit = _find_surrogate(value, "$", set())
        except RecursionError:
            path, culprit = _deep_path(value) or "$", "\ud800"
        raise EncodingError(f"{what} cannot be journaled: the text at {path} holds a lone surrogate "
                            f"({culprit!a}), which is not valid Unicode (decode bytes with errors='replace', "
                            "or drop the character)", path=path, type_name="str")
    return text


_PLAIN = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})


def _has_non_str_key(value: Any) -> bool:
    """Whether a dict anywhere in ``value`` (an encodable value: no cycles) has a key that is not a str.

    Asked only of a text that holds a key looking like one JSON made from a number, true, false or
    null (string keys such as ``"404"`` are common): a walk without paths or recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN:
            continue
        if kind is dict:
            if not _STR.issuperset(map(type, item)) and not all(isinstance(k, str) for k in item):
                return True
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                return True
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            try:
                expanded = _expand(item)
            except TypeError:
                continue
            if expanded is not item:
                stack.append(expanded)
    return False


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
    return _encode(_encode_canonical, value, what, sort=True)


def loads(text: str) -> Any:
    # A tag (and an escaped user dict) is a key that starts with "$". A text with no string that
    # starts with "$" (written out or as the \u0024 escape) holds none, and then the hook, called
    # for every object, would change nothing: decode without it.
    if '"$' in text or "\\u0024" in text:
        return _decoder.decode(text)
    return _plain_decoder.decode(text)


def _explain(value: Any, what: str, exc: BaseException) -> EncodingError:
    """Find the first value that cannot be encoded and say where it is."""
    try:
        path, culprit = _find_culprit(value, "$", set())
    except RecursionError:  # the search is as deep as the value: too deep for it too
        path = _deep_path(value)
        where = f" (more than {_DEEP} levels at {path})" if path is not None else ""
        return EncodingError(f"{what} cannot be journaled: it is nested too deeply to be written as JSON{where}; "
                             "flatten it, or journal it as a string", path=path)
    if type(culprit) is _Key:
        return _key_error(what, path, culprit)
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


#: how deep ``_deep_path`` looks: a value this deep is past what the error is about (json's limit
#: is the interpreter's recursion limit, less the frames already in use)
_DEEP = 500


def _deep_path(value: Any) -> str | None:
    """The path of the first value nested more than ``_DEEP`` levels down (a list or dict in each),
    shortened to its first and last levels, or None; found without recursion."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, parts = stack.pop()
        if depth > _DEEP:
            shown = [f".{k}" if isinstance(k, str) else f"[{k!r}]" for k in parts]
            if len(shown) > 12:
                shown = shown[:6] + [f"…{len(shown) - 12} levels…"] + shown[-6:]
            return "$" + "".join(shown)
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, (list, tuple)):
            children = enumerate(item)
        else:
            continue
        # The parts are shared by siblings: each level adds one key, so memory grows with the depth only.
        stack.extend((child, depth + 1, parts + (key,)) for key, child in reversed(list(children)))
    return None


class _Sentinel:
    pass


_NONE = _Sentinel()
_CYCLE = _Sentinel()
_ABSENT = _Sentinel()


def _expand(value: Any) -> Any:
    """What ``_default`` writes for ``value``, but a model's or dataclass's fields as they are (not
    escaped), for the searches that look for what is wrong in them."""
    if hasattr(value, "model_dump") and not isinstance(value, type):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return _default(value)


@dataclasses.dataclass(frozen=True)
class _Key:
    """A dict key the codec cannot write so that it comes back, the dict holding it, and why (see
    ``_key_problem``)."""

    key: Any
    holder: dict[Any, Any]
    reason: str


def _key_error(what: str, path: str, found: _Key) -> EncodingError:
    key = found.key
    kind = type(key)
    type_name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    shown = repr(key)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    where = f"the dict at {path}" if path != "$" else "the top-level dict"
    if found.reason == "mixed":
        text = json.dumps(key, default=repr)
        fate = (f", a key the dict already has, and one entry would be lost" if text in found.holder
                else " and come back as that string")
        detail = (f"{where} mixes string keys with the key {shown} ({type_name}); JSON keys are strings, so it "
                  f"would be written as {text!r}{fate} (use one kind of key in a dict: all strings, e.g. "
                  "{str(k): v for k, v in d.items()}, or none)")
    elif isinstance(key, (float, decimal.Decimal)):
        detail = f"{where} has the key {shown} ({type_name}), which is not valid JSON"
    else:
        detail = (f"{where} has the key {shown} ({type_name}), which would not come back as itself (a key may "
                  "be a str, int, float, bool, None, Decimal, UUID, bytes, date, time, datetime or timedelta; "
                  "for others use str keys or a list of [key, value] pairs)")
    return EncodingError(f"{what} cannot be journaled: {detail}", path=f"{path}[{shown}]", type_name=type_name)


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
            problem = _key_problem(value)
            if problem is not None:
                return path, _Key(problem[0], value, problem[1])
            for k, v in value.items():
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
        replacement = _expand(value)
    except TypeError:
        return path, value
    if replacement is value:
        return path, value
    return _find_culprit(replacement, path, seen)
