"""Redaction: secrets never reach the journal (invariant 9). Pure and fast.

What is redacted (replaced by ``"[REDACTED]"``):

* headers ``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``Set-Cookie``, ``X-Api-Key``,
  ``Api-Key``, and any header whose name looks sensitive (below), case-insensitively;
* JSON object fields, at any depth, whose key looks sensitive: the whole value goes, whatever it is
  (JSON nested inside a string value, like an LLM tool call's ``arguments``, is parsed and redacted too);
* query parameters and form fields whose name looks sensitive, and a URL's userinfo password;
* configured regex patterns anywhere in text (header values, bodies, URLs, error messages), plus
  two defaults: ``Bearer <token>`` and OpenAI-style ``sk-...`` keys.

A name "looks sensitive" when one of its words is password, secret, token, api key or
authorization (``access_token``, ``clientSecret``, ``X-Api-Key``, ``apiKey``). Matching whole
words rather than substrings is deliberate: an LLM response's ``prompt_tokens`` or
``max_tokens`` is audit data, not a secret, and must stay readable.

Bodies are redacted *before* they are truncated for the journal; truncating first could cut a
secret short of its pattern and let its prefix through.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["Redactor", "JournalRedactor", "REDACTED", "DEFAULT_PATTERNS"]

REDACTED = "[REDACTED]"

_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"})
# Matched after camelCase and separators are normalised to "_": one of these words must stand
# alone between separators (or the ends). "tokens" is left out on purpose (prompt_tokens).
_SENSITIVE_NAME = re.compile(r"(?:^|_)(?:password|passwd|secrets?|token|api_?keys?|authorization)(?:_|$)")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")

_NESTED_JSON_LIMIT = 1 << 20  # bytes of a JSON-looking string worth parsing to redact its fields

DEFAULT_PATTERNS: tuple[str, ...] = (
    r"\b(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}",
    r"\bsk-[A-Za-z0-9_-]{20,}",
)


def _normalise(name: str) -> str:
    return _SEPARATORS.sub("_", _CAMEL.sub("_", name)).lower()


class Redactor:
    """Redacts headers, URLs, JSON values and text. Instances are immutable and thread-safe.

    ``patterns``: extra regexes (strings or compiled) redacted anywhere in text.
    ``fields``: extra field/parameter/header names to redact (exact, case-insensitive).
    ``defaults=False`` drops ``DEFAULT_PATTERNS`` (the header and name rules always apply).
    """

    def __init__(self, *, patterns: Iterable[str | re.Pattern[str]] = (), fields: Iterable[str] = (),
                 defaults: bool = True, replacement: str = REDACTED) -> None:
        sources = [*(DEFAULT_PATTERNS if defaults else ()), *patterns]
        compiled = []
        for p in sources:
            try:
                compiled.append(p if isinstance(p, re.Pattern) else re.compile(p))
            except re.error as exc:
                raise ValueError(f"Redactor: pattern {p!r} is not a valid regex: {exc}") from None
        # One alternation: a single pass over the text whatever the number of patterns. Patterns
        # compiled with flags, or with global inline flags, cannot share it and are run one by one.
        self._each = tuple(compiled)
        self._text: re.Pattern[str] | None = None
        if compiled and all(p.flags & ~re.UNICODE == 0 for p in compiled):
            try:
                self._text = re.compile("|".join(f"(?:{p.pattern})" for p in compiled))
            except re.error:
                self._text = None
        self._fields = frozenset(f.lower() for f in fields)
        self.replacement = replacement

    # -- names -----------------------------------------------------------------------------------

    def is_sensitive(self, name: str) -> bool:
        """Whether a field, parameter or header called ``name`` holds a secret."""
        low = name.lower()
        return low in _HEADERS or low in self._fields or bool(_SENSITIVE_NAME.search(_normalise(name)))

    # -- values ----------------------------------------------------------------------------------

    def text(self, text: str) -> str:
        """``text`` with every configured pattern replaced."""
        if not text:
            return text
        if self._text is not None:
            return self._text.sub(self.replacement, text)
        for pattern in self._each:
            text = pattern.sub(self.replacement, text)
        return text

    def headers(self, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
        """Headers as a dict, sensitive ones replaced, the rest pattern-redacted (repeats joined)."""
        items = headers.items() if isinstance(headers, Mapping) else headers
        out: dict[str, str] = {}
        for name, value in items:
            clean = self.replacement if self.is_sensitive(name) else self.text(value)
            out[name] = f"{out[name]}, {clean}" if name in out else clean
        return out

    def json(self, value: Any) -> Any:
        """A copy of a JSON value with sensitive fields replaced and patterns redacted in strings."""
        if isinstance(value, dict):
            return {k: self.replacement if isinstance(k, str) and self.is_sensitive(k) else self.json(v)
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.json(v) for v in value]
        if isinstance(value, str):
            return self._json_string(value)
        return value

    def _json_string(self, value: str) -> str:
        # JSON nested as a string is common (an LLM's tool-call "arguments", an echoed request body);
        # its fields must be redacted as fields, not only by pattern.
        if value[:1] in "{[" and len(value) <= _NESTED_JSON_LIMIT:
            try:
                nested = json.loads(value)
            except ValueError:
                nested = None
            if isinstance(nested, (dict, list)):
                return json.dumps(self.json(nested), ensure_ascii=False, separators=(",", ":"))
        return self.text(value)

    def query(self, query: str) -> str:
        """A query string or form body with sensitive parameters replaced."""
        if not query:
            return query
        pairs = parse_qsl(query, keep_blank_values=True)
        if not pairs:
            return self.text(query)
        cleaned = [(k, self.replacement if self.is_sensitive(k) else v) for k, v in pairs]
        return self.text(urlencode(cleaned, safe="[]"))

    def url(self, url: str) -> str:
        """The URL with its userinfo password, sensitive query parameters and patterns redacted."""
        try:
            parts = urlsplit(str(url))
        except ValueError:
            return self.text(str(url))
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":" + self.replacement
            netloc = f"{userinfo}@{host}"
        return self.text(urlunsplit((parts.scheme, netloc, parts.path, self.query(parts.query), parts.fragment)))

    def body(self, content: bytes | str, content_type: str | None = None) -> str:
        """A request or response body as redacted text (JSON and form bodies by field)."""
        text = content.decode("utf-8", errors="replace") if isinstance(content, bytes) else content
        kind = (content_type or "").split(";", 1)[0].strip().lower()
        if kind == "application/x-www-form-urlencoded":
            return self.query(text)
        if kind.endswith("json") or (not kind and text[:1] in "{["):
            try:
                parsed = json.loads(text)
            except ValueError:
                return self.text(text)
            return json.dumps(self.json(parsed), ensure_ascii=False, separators=(",", ":"))
        return self.text(text)


#: words that may stand in a secret's field name or value; only texts holding one pay for a full pass
_SECRET_HINT = re.compile(r"password|passwd|secret|token|api_?key|authori[sz]ation|bearer|cookie|sk-")


class JournalRedactor:
    """Redacts the JSON text of an event before it is written (invariant 9).

    A cheap pre-filter (under a microsecond for a small event) lets only texts that could hold a
    secret pay for a full redaction; the redactor's own extra patterns, if any, are searched as
    given. Redaction is idempotent, so a text may safely pass twice.
    """

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        defaults = {p.pattern for p in Redactor()._each}
        custom = [p for p in redactor._each if p.pattern not in defaults]
        self._custom = re.compile("|".join(f"(?:{p.pattern})" for p in custom)) if custom else None

    def __call__(self, text: str, *, force: bool = False) -> str:
        """``text`` (a JSON document) with secrets replaced; ``force`` skips the pre-filter (to compare
        with a journal text that went through it)."""
        if not force and _SECRET_HINT.search(text.lower()) is None and (
                self._custom is None or self._custom.search(text) is None):
            return text
        # Plain json, not the codec: tagged values stay tagged and only strings are touched.
        cleaned = json.dumps(self.redactor.json(json.loads(text)), ensure_ascii=False, separators=(",", ":"))
        return self.redactor.text(cleaned)
