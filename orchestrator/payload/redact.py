"""Redaction: secrets never reach the journal (invariant 9). Pure and fast.

What is redacted (replaced by ``"[REDACTED]"``), in every event, signal, run input and error record
before it is written:

**By name.** JSON object fields at any depth, headers, query parameters and form fields whose
name is sensitive lose their whole value, whatever it is. Names are compared after camelCase and
separators are normalised to ``_`` and lower-cased (``clientSecret``, ``X-Api-Key`` and
``api-key`` read ``client_secret``, ``x_api_key``, ``api_key``). A name is sensitive when

* one of its words is ``password``, ``passwd``, ``passphrase``, ``secret(s)``, ``authorization``,
  ``cookie(s)``, ``credential(s)``, or it holds ``api_key`` / ``apikey`` / ``private_key`` /
  ``secret_key`` / ``access_key`` (``db_password``, ``client_secret``, ``openai_api_key``,
  ``set_cookie``);
* it is ``token`` itself, or *ends* in a token of a kind that is a credential: ``access_token``,
  ``refresh_token``, ``id_token``, ``auth_token``, ``bearer_token``, ``session_token``,
  ``api_token``, ``csrf_token``/``xsrf_token``, ``oauth_token``, ``security_token``,
  ``client_token``, ``private_token``, ``secret_token``, ``jwt_token``, ``bot_token``,
  ``app_token``, ``user_token``, ``service_token``, ``personal_token``, ``github_token``,
  ``slack_token``, ``npm_token``, ``pypi_token`` (with or without the separator: ``csrftoken``);
* it is one of the names the user configured (``Redactor(fields=[...])``,
  ``Orchestrator(redact_fields=[...])``, ``[redact] fields`` in agentsaga.toml), compared the same
  normalised way.

Everything else with "token" in its name is ordinary state and stays readable: ``token_count``,
``next_token`` and ``page_token`` (pagination cursors), ``max_tokens``, ``prompt_tokens``,
``completion_tokens``, ``tokenizer``, ``access_token_expires_in``. Query parameters also count
``key``, ``sig`` and ``signature`` (``?key=`` is how many APIs take their key; a signed URL's
signature is a credential), and headers any name ending in ``-Key``, ``-Token`` or ``-Secret``
(``X-Functions-Key``, ``Ocp-Apim-Subscription-Key``) but ``Idempotency-Key``, which is ours. So
is a field or parameter whose name is written as a header's (``X-...`` or ``Title-Case-Words``: a
dict of headers a step returns, ``{"X-Functions-Key": ...}``); ``sort_key``, ``cache-key`` or
``next_token`` stay ordinary. A query parameter's name is judged percent-decoded
(``?api%5Fkey=`` is ``api_key``).

In free text (an exception message, a traceback, a log line a step returned) a sensitive name
followed by ``=`` or ``:`` loses its value too, and keeps its name (the bare word ``token`` is left
out here: "token: 5 used" is prose; so is "the password field is required", where no separator
follows the name). What the value is: a quoted value, to its closing quote (``password: 'two
words'``, ``'api_key': 'abc'``); after ``Authorization``, ``Cookie`` and the like (a header's line),
the rest of the line, spaces, commas and semicolons included (``Authorization: Token abc``,
``Authorization: Digest ..., response="..."``, ``Cookie: a=1; session=...``); otherwise one word
(``password=hunter2``, ``client_secret: xyz``).

**By value**, anywhere in any string (field values, header values, URLs, bodies, error messages,
tracebacks, model output): ``DEFAULT_PATTERNS`` below (``Bearer`` and ``Basic`` credentials, OpenAI
``sk-...``, Stripe ``sk_live_...``, AWS ``AKIA...``/``ASIA...`` key ids, GitHub ``ghp_...`` and
``github_pat_...``, Slack ``xoxb-...``, Google ``AIza...``, JWTs, PEM private key blocks), the
password of a URL's userinfo (``https://bob:[REDACTED]@host``), the value of a sensitive query
parameter in any URL (``?api_key=[REDACTED]``), and the user's own patterns
(``Redactor(patterns=[...])``, ``Orchestrator(redact=[...])``). A ``Basic`` credential is redacted
only when it decodes to ``user:password``, so "Basic settings" stays.

Every rule, the user's patterns included, applies to each string by itself (a field's value, a
key, a line of a traceback): ``^\\d{3}-\\d{2}-\\d{4}$`` redacts a value that is exactly an SSN.

JSON nested inside a string (an LLM tool call's ``arguments``, an echoed request body) is parsed
and redacted by field too, and so is JSON encoded twice (a string holding a JSON string literal,
``json.dumps(json.dumps({...}))``). Bodies are redacted *before* they are truncated for the
journal; truncating first could cut a secret short of its pattern and let its prefix through.

**What was sent, echoed back.** A server may quote a credential it was sent ("Incorrect API key
provided: KEY") in a form no rule knows. ``Redactor.credentials(headers)`` lists the secret values
a request's headers carry (a sensitive header's value, without its scheme too, a ``Basic``
password, each cookie's value; from ``MIN_SCRUB`` characters) and ``Redactor.scrub`` replaces them
exactly: the HTTP tool and the model client scrub what they journal and the errors they raise
(``orchestrator.tools.http``, ``orchestrator.agents.llm``).

**The pre-filter.** Every event passes here, so ``JournalRedactor`` first asks two cheap regexes
whether the text could hold a secret at all. A text it flags is not parsed whole: the JSON strings
the hints point at are redacted where they stand (``JournalRedactor._in_place``; a sensitive key's
whole value is replaced) and the rest of the text is kept as it is; a property test holds the
in-place path to give exactly the text of the whole-document pass. The pre-filter is a superset of
the rules above built from the same word lists (a property test holds it to that, JSON escapes
and JSON-in-a-string at any depth included), and it does not fire on ordinary words:
``"token_count"``, ``"max_tokens"`` or a trace saying "token" cost nothing extra.

The user's own patterns point at strings too (``Redactor._pattern_hints``), exactly: a pattern
that, without its anchors, word boundaries and lookarounds, cannot match a character JSON escapes
is searched over the document that way (and from its first literal: one fast regex pass);
another (``.``, ``\\s``, ``[^...]``, a quote) is searched in each string, decoded.

Measured per event (``min`` of CPU-time repeats, on a machine shared with other work): a
150-byte ``StepCompleted`` 2.2 us; a model call whose request says ``max_tokens`` and whose usage
says ``prompt_tokens``, 1.1 KB, 15 us (20 KB: 235 us; the whole-document pass costs 160 us and
1.4 ms); 3 KB of prose 39 us; a 1 KB event holding a password 35 us. With the user's pattern
``^\\d{3}-\\d{2}-\\d{4}$``: 16 us and 241 us (1.1 KB, 20 KB); with ``PIN:\\s\\d+``, searched per
string: 41 us and 472 us.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from json.decoder import scanstring
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from orchestrator.payload._screens import document_screen, search_any

__all__ = ["Redactor", "JournalRedactor", "REDACTED", "DEFAULT_PATTERNS"]

REDACTED = "[REDACTED]"

# -- names ----------------------------------------------------------------------------------------
#: words that make any name holding them sensitive (matched between separators of the normalised name)
_STRONG_WORDS = ("password", "passwd", "passphrase", "secret", "secrets", "authorization", "cookie", "cookies",
                 "credential", "credentials", "api_key", "api_keys", "apikey", "apikeys", "private_key",
                 "secret_key", "access_key")
#: kinds of token that are credentials: ``<kind>_token`` at the end of a name (``token`` alone too)
_TOKEN_KINDS = ("access", "refresh", "id", "auth", "bearer", "session", "api", "csrf", "xsrf", "oauth", "security",
                "client", "private", "secret", "jwt", "bot", "app", "user", "service", "personal", "github", "slack",
                "npm", "pypi")
_SENSITIVE_NAME = re.compile(
    r"(?:^|_)(?:" + "|".join(_STRONG_WORDS) + r")(?:_|$)"
    r"|(?:^|_)(?:" + "|".join(_TOKEN_KINDS) + r")_?token$"
    r"|^token$"
)
#: extra names that are sensitive as query parameters only (``?key=...``, a signed URL's signature)
_SENSITIVE_QUERY = re.compile(r"^(?:key|sig|signature)$|_signature$")
_HEADERS = frozenset({"authorization", "proxy_authorization", "cookie", "set_cookie", "x_api_key", "api_key"})
_SENSITIVE_HEADER = re.compile(r"_(?:key|token|secret)$")
_NOT_SECRET_HEADERS = frozenset({"idempotency_key"})
#: a name written the way HTTP headers are (``X-Functions-Key``, ``x-goog-api-key``,
#: ``Ocp-Apim-Subscription-Key``): judged by the header rule wherever it is (a JSON field too)
_HEADER_STYLE = re.compile(r"[Xx](?:-[A-Za-z0-9]+)+|[A-Z][A-Za-z0-9]*(?:-[A-Z][A-Za-z0-9]*)+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # one string token of a JSON text
#: a credential a request sends is scrubbed from what comes back only from this many characters
#: (replacing a shorter value everywhere would cut ordinary words)
MIN_SCRUB = 6
_DECODER = json.JSONDecoder()
_NESTED_JSON_LIMIT = 1 << 20  # bytes of a JSON-looking string worth parsing to redact its fields


def _normalise(name: str) -> str:
    return _SEPARATORS.sub("_", _CAMEL.sub("_", name)).strip("_").lower()


# -- values -----------------------------------------------------------------------------------------
def _word(first: str, rest: str) -> str:
    """``\bfirst+rest`` written with the literal first: the regex engine can then skip straight to
    the positions holding one of the patterns' first characters (12x faster over prose than with
    ``\b`` in front, measured), and the lookbehind keeps the word boundary."""
    return f"{re.escape(first)}(?<![A-Za-z0-9_]{re.escape(first)}){rest}"


_TOKEN_CHARS = r"\s+[A-Za-z0-9._~+/=-]{8,}"
#: Key and credential formats redacted anywhere in text (each one whole).
DEFAULT_PATTERNS: tuple[str, ...] = (
    _word("B", "earer" + _TOKEN_CHARS), _word("b", "earer" + _TOKEN_CHARS), _word("B", "EARER" + _TOKEN_CHARS),
    _word("s", r"k-[A-Za-z0-9_-]{20,}"),                                   # OpenAI / Anthropic style keys
    _word("s", r"k_(?:live|test)_[A-Za-z0-9]{16,}"),                       # Stripe secret keys
    _word("r", r"k_(?:live|test)_[A-Za-z0-9]{16,}"),                       # Stripe restricted keys
    _word("A", r"(?:KIA|SIA)[0-9A-Z]{16}\b"),                              # AWS access key ids
    _word("g", r"h[pousr]_[A-Za-z0-9]{30,}"),                              # GitHub tokens
    _word("g", r"ithub_pat_[A-Za-z0-9_]{22,}"),                            # GitHub fine-grained tokens
    _word("x", r"ox[abposr]-[A-Za-z0-9-]{10,}"),                           # Slack tokens
    _word("A", r"Iza[0-9A-Za-z_-]{35}"),                                   # Google API keys
    _word("e", r"yJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),  # JWTs
    # PEM private keys: to their END line, or (a block cut short) through the rest of its base64
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[^\"]*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s\\]*)",
)
# Rules that keep part of what they match or must look before judging, as named groups; one
# alternation with the default patterns, every alternative starting with a literal, so text is
# scanned once and fast.
_BASIC_VALUE = r"\s+(?P<{}>[A-Za-z0-9+/]{{4,}}={{0,2}})(?![A-Za-z0-9+/=])"
_RULES = (
    _word("B", "asic" + _BASIC_VALUE.format("basic1")), _word("b", "asic" + _BASIC_VALUE.format("basic2")),
    _word("B", "ASIC" + _BASIC_VALUE.format("basic3")),
    r"://(?P<ui_user>[^\s/?#@:\"'<>\\]*):(?P<ui_pw>[^\s/?#@\"'<>\\]+)@",
    *(f"{re.escape(c)}(?P<q{i}n>[A-Za-z0-9_.%\\-\\[\\]]{{1,64}})=(?P<q{i}v>[^&#\\s\"'<>\\\\]+)"
      for i, c in enumerate("?&;")),
)
_DEFAULT_TEXT = re.compile("|".join([*DEFAULT_PATTERNS, *_RULES]))
_QUERY_GROUPS = {"q0v": "q0n", "q1v": "q1n", "q2v": "q2n"}

# name=value / name: value / 'name': 'value' in free text, for names holding a sensitive word (the
# callback then judges the whole name); a second pass, so that "Authorization: Bearer xyz" has lost
# its token to the Bearer pattern before its name is seen.
# (each alternative starts with a literal, for the same reason as in DEFAULT_PATTERNS)
_PAIR_WORDS = ("passw", "passphrase", "secret", "authori[sz]ation", "cookie", "credential", r"api[_-]?key", "apikey",
               r"private[_-]?key", r"access[_-]?key", *(kind + r"[_-]?token" for kind in _TOKEN_KINDS))
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_PAIR_SEP = re.compile(r"['\"]?[ \t]*[:=][ \t]*(['\"]?)")  # (group 1: the value's opening quote)
#: an unquoted value: one word
_PAIR_VALUE = re.compile(r"[^\s'\"&,;{}\[\]()<>\\]+")
#: a quoted value: to its closing quote (a backslash escapes one), else to the end of its line
_QUOTED_VALUE = {q: re.compile(rf"(?:[^{q}\\\r\n]|\\.)*") for q in "'\""}
#: names whose value is a whole header line, spaces, commas and semicolons included
#: (``Authorization: Token abc``, ``Authorization: Digest ..., response="..."``, ``Cookie: a=1; sid=...``)
_LINE_NAME = re.compile(r"(?:^|_)(?:authorization|cookies?)$")
_LINE_VALUE = re.compile(r"[^\r\n]*")


# The pre-filter: a superset of every rule above, in two small regexes. Names, and the schemes
# that are case-insensitive, are searched in the lower-cased text; key formats, which are
# case-sensitive, in the text as it is. Every alternative starts with a literal that is rare in
# JSON (a lookbehind then checks what comes before it: "passw" is found at its "w"), so the regex
# engine skips straight to the few positions holding one; this keeps the filter near the old
# one-word filter's cost with five times the rules. "token" is only a hint where it is a field
# named exactly token, or a credential kind's token ending a name: "token_count", "max_tokens"
# and a trace that says "token" cost nothing.
#
# The text searched is JSON, and strings inside it may be JSON again (a tool call's arguments, a
# body encoded twice), each level escaping the one inside it: a quote is \" or \\\" and so on, a
# newline \n or \\n. The hints that span such characters allow any number of backslashes
# (``_ESCAPED_SPACE``, ``\\*"``), and any \u escape or escaped slash (``\\u``, ``\\/``; JSON may
# write any character so, "p\u0061ssword" is "password" to a parser) is a hint by itself: the
# string that holds it is redacted as the full pass would, never skipped.
_ESCAPED_SPACE = r"(?:\s|\\+[nrtf])"  # whitespace, or its escape at any depth of JSON-in-a-string
_KIND_TOKEN = "|".join(f"(?<={k}token)|(?<={k}_token)|(?<={k}-token)" for k in _TOKEN_KINDS)
_NAME_HINT = re.compile("|".join([
    r"w(?<=passw)",
    r"h(?:(?<=passph)rase|(?<=auth)ori[sz]ation)",
    r"c(?<=sec)ret(?!ar)",
    r"d(?<=cred)ential",
    "k(?:" + "|".join([
        r"(?<=cook)ie",
        *(f"(?<={w}k)ey" for w in ("api_", "api-", "api", "private_", "private-", "private", "access_", "access-",
                                   "access")),
        r"(?<=[?&;]k)ey=",
        r'(?<=-k)ey(?<!idempotency-key)(?=\\*")',  # a field named as a header: X-Functions-Key
        r"(?<=tok)en(?:(?<=[\"?&;]token)(?=\\*\"" + _ESCAPED_SPACE + r"*:|=)|(?<=-token)(?=\\*\")"
        r"|(?![a-z0-9_-])(?:" + _KIND_TOKEN + "))",
    ]) + ")",
    "g(?:" + "|".join([r"(?<=[?&;]sig)(?:=|nature=)", r"(?<=[_-]sig)nature="]) + ")",
    r"b(?:earer|asic)" + _ESCAPED_SPACE,
    r"/(?<=:/)/[^\s/\"@]*@",
    r"%[0-9a-f]{2}[a-z0-9_.%\-\[\]]{0,62}=",  # a percent-encoded query name: ?api%5Fkey=
]))
_FORMAT_HINT = re.compile("|".join([
    "k(?:" + "|".join([r"(?<=sk)-[A-Za-z0-9_-]{20}", r"(?<=[rs]k)_(?:live|test)_"]) + ")",
    "K" + r"(?<=AK)IA[0-9A-Z]{16}",
    "S" + r"(?<=AS)IA[0-9A-Z]{16}",
    "z" + r"(?<=AIz)a",
    "h(?:" + "|".join([r"(?<=gh)[pousr]_[A-Za-z0-9]{30}", r"(?<=gith)ub_pat_"]) + ")",
    r"xox[abposr]-",
    "J" + r"(?<=eyJ)[A-Za-z0-9_-]{8,}\.",
    "G" + r"(?<=-----BEG)IN ",
    r"\\[u/]",  # an escape that may stand for any character (see above)
]))
#: "Basic" is an ordinary word too: a hint only when base64 with a case change, digit or padding follows
_BASIC_HINT = re.compile(r"(?i:basic)" + _ESCAPED_SPACE + r"+[A-Za-z0-9+/]*(?:[a-z0-9+/][A-Z0-9+/=]|=)")


class Redactor:
    """Redacts headers, URLs, JSON values and text. Instances are immutable and thread-safe.

    ``patterns``: extra regexes (strings or compiled) redacted anywhere in text.
    ``fields``: extra field/parameter/header names to redact (compared normalised, so ``"ssn"``
    also matches ``SSN`` and ``bankAccount`` matches ``bank_account``).
    ``defaults=False`` drops ``DEFAULT_PATTERNS`` and the URL rules (the name rules always apply).
    """

    def __init__(self, *, patterns: Iterable[str | re.Pattern[str]] = (), fields: Iterable[str] = (),
                 defaults: bool = True, replacement: str = REDACTED) -> None:
        if isinstance(patterns, (str, re.Pattern)):
            raise ValueError(f"Redactor: patterns must be a list of regexes, got the single pattern {patterns!r}")
        if isinstance(fields, str):
            raise ValueError(f"Redactor: fields must be a list of names, got the single name {fields!r}")
        compiled = []
        for p in patterns:
            try:
                compiled.append(p if isinstance(p, re.Pattern) else re.compile(p))
            except (re.error, TypeError) as exc:
                raise ValueError(f"Redactor: pattern {p!r} is not a valid regex: {exc}") from None
            if compiled[-1].search(""):
                raise ValueError(f"Redactor: pattern {p!r} matches the empty string (it would redact everywhere)")
        self.defaults = defaults
        self.patterns = tuple(compiled)
        # How the journal finds the strings these patterns may change (see _screens.document_screen).
        screens = [(p, document_screen(p)) for p in compiled]
        self._screens = tuple(screen for _, screen in screens if screen is not None)
        self._per_string = tuple(p for p, screen in screens if screen is None)
        self._string_search = search_any(self._per_string)
        # One alternation: a single pass over the text whatever the number of patterns. Patterns
        # compiled with flags, or with global inline flags, cannot share it and are run one by one.
        self._custom: re.Pattern[str] | None = None
        if compiled and all(p.flags & ~re.UNICODE == 0 for p in compiled) and (
                len(compiled) == 1 or all(p.groups == 0 for p in compiled)):  # (a \1 would shift)
            try:
                self._custom = re.compile("|".join(f"(?:{p.pattern})" for p in compiled))
            except re.error:
                self._custom = None
        names = []
        for f in fields:
            if not isinstance(f, str) or not _normalise(f):
                raise ValueError(f"Redactor: field names must be non-empty strings, got {f!r}")
            names.append(f)
        self.fields = tuple(names)
        self._fields = frozenset(_normalise(f) for f in names)
        self.replacement = replacement
        self._header_names: dict[str, bool] = {}  # is_sensitive_header, by name (see credentials)
        field_words = [re.escape(f).replace("_", "[_-]?") for f in sorted(self._fields)]
        self._field_hint = re.compile("|".join(field_words)) if field_words else None
        self._pair_words = re.compile("|".join([*_PAIR_WORDS, *field_words]))

    # -- names -----------------------------------------------------------------------------------

    def is_sensitive(self, name: str) -> bool:
        """Whether a field, parameter or header called ``name`` holds a secret."""
        norm = _normalise(name)
        if norm in _HEADERS or norm in self._fields or _SENSITIVE_NAME.search(norm) is not None:
            return True
        # A field named as a header (``"X-Functions-Key"`` in a dict of headers a step returns) is
        # judged as a header; ``sort_key`` or ``next_token`` stay ordinary fields.
        return ("-" in name and _HEADER_STYLE.fullmatch(name) is not None and norm not in _NOT_SECRET_HEADERS
                and _SENSITIVE_HEADER.search(norm) is not None)

    def is_sensitive_header(self, name: str) -> bool:
        """Whether a header called ``name`` holds a secret (names ending in -Key, -Token, -Secret too)."""
        if self.is_sensitive(name):
            return True
        norm = _normalise(name)
        return norm not in _NOT_SECRET_HEADERS and _SENSITIVE_HEADER.search(norm) is not None

    def is_sensitive_query(self, name: str) -> bool:
        """Whether a query parameter or form field called ``name`` holds a secret."""
        return self.is_sensitive(name) or _SENSITIVE_QUERY.search(_normalise(name)) is not None

    # -- what a request sends, echoed back ----------------------------------------------------------

    def credentials(self, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[str, ...]:
        """The secret values ``headers`` send, longest first: each sensitive header's value, its
        credential without the scheme (``Bearer KEY`` gives ``KEY`` too), the password a ``Basic``
        credential decodes to, each cookie's value. A server may echo any of them ("Incorrect API
        key provided: KEY"), in a form no rule knows: ``scrub`` replaces them in what it answered.
        Values shorter than ``MIN_SCRUB`` characters are left out."""
        items = headers.items() if isinstance(headers, Mapping) else headers
        found: set[str] = set()
        for name, value in items:
            value = value.strip() if isinstance(value, str) else ""
            if len(value) < MIN_SCRUB or not self._sensitive_header(name):
                continue
            found.add(value)
            scheme, _, credential = value.partition(" ")
            credential = credential.strip()
            if credential:
                found.add(credential)
                if scheme.lower() == "basic":
                    try:
                        found.add(base64.b64decode(credential, validate=True).decode("utf-8").partition(":")[2])
                    except (binascii.Error, ValueError):
                        pass
            if "=" in value:  # cookies: each one's value
                found.update(part.partition("=")[2].strip() for part in value.split(";"))
        return tuple(sorted((v for v in found if len(v) >= MIN_SCRUB), key=len, reverse=True))

    def _sensitive_header(self, name: str) -> bool:
        known = self._header_names.get(name)
        if known is None:
            known = self.is_sensitive_header(name)
            if len(self._header_names) < 1024:  # (the same few names, request after request)
                self._header_names[name] = known
        return known

    def scrub(self, value: Any, secrets: Iterable[str]) -> Any:
        """``value`` (a text, or a JSON value: its strings and keys) with every exact occurrence of
        ``secrets`` replaced (a text in which none occurs comes back as it is)."""
        secrets = tuple(secrets)
        if not secrets:
            return value
        if isinstance(value, str):
            for secret in secrets:
                if secret in value:
                    value = value.replace(secret, self.replacement)
            return value
        if isinstance(value, dict):
            return {self.scrub(k, secrets): self.scrub(v, secrets) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v, secrets) for v in value]
        return value

    # -- the pre-filter ----------------------------------------------------------------------------

    def may_hold_secret(self, text: str) -> bool:
        """False only when ``text`` certainly holds nothing ``text()`` would change (cheap). (A
        JSON document's strings are redacted one by one: ``JournalRedactor`` asks each of them.)"""
        if self._may_match(text):
            return True
        if self._custom is not None:
            return self._custom.search(text) is not None
        return any(p.search(text) for p in self.patterns)

    # -- values ----------------------------------------------------------------------------------

    def _judge(self, m: re.Match[str]) -> str:
        group = m.lastgroup
        if group in _QUERY_GROUPS:
            name = m.group(_QUERY_GROUPS[group])
            if self.is_sensitive_query(unquote(name) if "%" in name else name):  # (?api%5Fkey= too)
                return m.group(0)[: m.start(group) - m.start()] + self.replacement
            return m.group(0)
        if group == "ui_pw":
            return f"://{m.group('ui_user')}:{self.replacement}@"
        if group in ("basic1", "basic2", "basic3"):
            try:
                decoded = base64.b64decode(m.group(group), validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                return m.group(0)
            return self.replacement if ":" in decoded else m.group(0)
        return self.replacement

    def _pairs(self, text: str) -> str:
        """``name=value`` / ``name: value`` in free text with a sensitive name: the value goes.
        Found from the sensitive words outwards (a regex that tried every name would cost ~100x)."""
        low = text.lower()
        if len(low) != len(text):  # lower() changed lengths (rare scripts): no positions to share
            low = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
        out: list[str] = []
        done = 0
        for found in self._pair_words.finditer(low):
            if found.start() < done:
                continue
            start, end = found.start(), found.end()
            while start > done and text[start - 1] in _NAME_CHARS:
                start -= 1
            while end < len(text) and text[end] in _NAME_CHARS:
                end += 1
            sep = _PAIR_SEP.match(text, end)
            if sep is None:
                continue
            name = text[start:end]
            norm = _normalise(name)
            if norm == "token" or not self.is_sensitive(name):
                continue
            begin = sep.end()
            if sep.group(1):  # 'a quoted value', to its closing quote
                stop = _QUOTED_VALUE[sep.group(1)].match(text, begin).end()
            elif _LINE_NAME.search(norm) is not None and (start == 0 or text[start - 1] not in "?&"):
                stop = _LINE_VALUE.match(text, begin).end()  # a header's line (not a URL's ?cookie=...)
            else:
                value = _PAIR_VALUE.match(text, begin)
                stop = value.end() if value is not None else begin
            if stop == begin:
                continue
            out += [text[done:begin], self.replacement]
            done = stop
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)

    def _hint_positions(self, text: str) -> list[int] | None:
        """Where in the JSON ``text`` the pre-filter finds something, in order (empty: nothing to
        redact); None when positions cannot stand for the rules (a lower-cased text of another
        length)."""
        low = text.lower()
        if len(low) != len(text):
            return None
        found = [m.start() for m in _FORMAT_HINT.finditer(text)]
        for m in _NAME_HINT.finditer(low):
            if not m.group().startswith("basic") or _BASIC_HINT.match(text, m.start()) is not None:
                found.append(m.start())
        if self._field_hint is not None:
            found += [m.start() for m in self._field_hint.finditer(low)]
        if self.patterns:
            found += self._pattern_hints(text)
        found.sort()
        return found

    def _pattern_hints(self, text: str) -> list[int]:
        """Where the user's own patterns could change a string of the JSON ``text`` as ``json()``
        redacts it (each string by itself, JSON inside a string by its own strings): a position
        inside each such string (see ``_screens.document_screen``)."""
        found: list[int] = []
        for screen in self._screens:
            for m in screen.finditer(text):
                start, end = m.span()
                found.append(start)
                quote = text.find('"', start + 1, end)
                while quote >= 0:  # (a match across strings: each of them)
                    found.append(quote)
                    quote = text.find('"', quote + 1, end)
        if self._per_string:
            found += self._string_hints(text)
        return found

    def _string_hints(self, text: str) -> list[int]:
        """The start of each string of the JSON ``text`` the per-string patterns could change."""
        found = []
        find, search = text.find, self._string_search
        pos = 0
        while True:
            start = find('"', pos)  # (only strings hold quotes: each one found starts a string)
            if start < 0:
                return found
            try:
                value, pos = scanstring(text, start + 1)
            except ValueError:  # not JSON (nested text that is not): the caller searched it whole
                return found
            if search(value) is not None or (value.startswith(("{", "[", '"')) and len(value) <= _NESTED_JSON_LIMIT
                                             and self._string_hints(value)):
                found.append(start)

    def _may_match(self, text: str) -> bool:
        """The pre-filter for one string: False only when no built-in rule or field name applies."""
        if _FORMAT_HINT.search(text) is not None:
            return True
        low = text.lower()
        for found in _NAME_HINT.finditer(low):
            if not found.group().startswith("basic") or len(low) != len(text):  # (lower() may change lengths)
                return True
            if _BASIC_HINT.match(text, found.start()) is not None:
                return True
        return self._field_hint is not None and self._field_hint.search(low) is not None

    def text(self, text: str) -> str:
        """``text`` with every pattern (defaults, URL credentials, the user's) replaced."""
        if not text:
            return text
        if self._may_match(text):
            if self.defaults:
                text = _DEFAULT_TEXT.sub(self._judge, text)
            text = self._pairs(text)
        if self._custom is not None:
            return self._custom.sub(self.replacement, text)
        for pattern in self.patterns:
            text = pattern.sub(self.replacement, text)
        return text

    def headers(self, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
        """Headers as a dict, sensitive ones replaced, the rest pattern-redacted (repeats joined)."""
        items = headers.items() if isinstance(headers, Mapping) else headers
        out: dict[str, str] = {}
        for name, value in items:
            clean = self.replacement if self.is_sensitive_header(name) else self.text(value)
            out[name] = f"{out[name]}, {clean}" if name in out else clean
        return out

    def json(self, value: Any) -> Any:
        """A copy of a JSON value with sensitive fields replaced and patterns redacted in strings."""
        if isinstance(value, dict):
            # A key is judged as a name, and redacted as text (a secret used as a key goes too).
            return {(self.text(k) if isinstance(k, str) else k):
                    self.replacement if isinstance(k, str) and self.is_sensitive(k) else self.json(v)
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.json(v) for v in value]
        if isinstance(value, str):
            return self._json_string(value)
        return value

    def _json_string(self, value: str) -> str:
        # JSON nested as a string is common (an LLM's tool-call "arguments", an echoed request body);
        # its fields must be redacted as fields, not only by pattern. So is JSON encoded twice (a
        # string that is a JSON string literal: json.dumps(json.dumps({...}))): its text is redacted
        # as what it stands for.
        first = value[:1]
        if first in ("{", "[", '"') and len(value) <= _NESTED_JSON_LIMIT:
            try:
                nested = json.loads(value)
            except ValueError:
                nested = None
            if isinstance(nested, (dict, list)):
                clean = self.json(nested)
                # Re-encoded only when something went: redaction changes nothing but secrets, so a
                # text redacted twice, or in parts (``JournalRedactor``), is the same text.
                return value if clean == nested else json.dumps(clean, ensure_ascii=False, separators=(",", ":"))
            if isinstance(nested, str):
                inner = self._json_string(nested)
                if inner != nested:  # (and the literal's own text as text, as it would be otherwise)
                    return self.text(json.dumps(inner, ensure_ascii=False))
        return self.text(value)

    def query(self, query: str) -> str:
        """A query string or form body with sensitive parameters replaced."""
        if not query:
            return query
        pairs = parse_qsl(query, keep_blank_values=True)
        if not pairs:
            return self.text(query)
        cleaned = [(k, self.replacement if self.is_sensitive_query(k) else v) for k, v in pairs]
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


class JournalRedactor:
    """Redacts the JSON text of an event (or a signal, a run's input, an error record) before it is
    written (invariant 9).

    The pre-filter (``Redactor._hint_positions``, 2-3 microseconds for a small event) lets only
    the strings that could hold a secret pay for their redaction. Redaction is idempotent, so a
    text may safely pass twice.
    """

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor

    def __call__(self, text: str, *, force: bool = False) -> str:
        """``text`` (a JSON document, compact as the codec writes it) with secrets replaced; ``force``
        skips the pre-filter and redacts the whole parsed document (the reference the fast way is
        held to: both give the same text)."""
        if force:
            return self._whole(text)
        r = self.redactor
        hints = r._hint_positions(text)
        if hints is None:  # (rare scripts: lower-casing changed the length) the whole document
            changes = r._may_match(text) or (r.patterns and r._pattern_hints(text))
            return self._whole(text) if changes else text
        if not hints:
            return text
        return self._in_place(text, hints)

    def _whole(self, text: str) -> str:
        # Plain json, not the codec: tagged values stay tagged and only strings (and keys) are touched.
        return json.dumps(self.redactor.json(json.loads(text)), ensure_ascii=False, separators=(",", ":"))

    def _in_place(self, text: str, hints: list[int]) -> str:
        """Only the JSON strings the pre-filter found something in are looked at: a value is redacted
        as text (or as nested JSON), a key is judged as a name and, when sensitive, its whole value
        is replaced. Nothing else is parsed; the rest of the text is kept as it is.

        Every hint lies inside one string token (no hint pattern spans a quote) or between them (a
        user pattern's screen may match there: nothing to do), and strings are the only tokens that
        hold quotes, so scanning string tokens from the start is exact."""
        r = self.redactor
        out: list[str] = []
        done = 0  # text[:done] is settled
        pos = 0
        h = 0  # hints before it are settled
        n = len(hints)
        while h < n:
            m = _JSON_STRING.search(text, pos)
            if m is None:
                break
            start, end = m.span()
            while h < n and hints[h] < start:
                h += 1  # (a hint outside any string: nothing there to redact)
            if h == n:
                break
            if hints[h] >= end:
                pos = end
                continue
            while h < n and hints[h] < end:
                h += 1
            value = json.loads(m.group())
            after = end
            while after < len(text) and text[after] in " \t\r\n":
                after += 1
            if after < len(text) and text[after] == ":":  # a key: judged as a name, redacted as text
                shown = r.text(value)
                if shown != value:
                    out += [text[done:start], json.dumps(shown, ensure_ascii=False)]
                    done = end
                pos = end
                if r.is_sensitive(value):
                    begin = after + 1
                    while begin < len(text) and text[begin] in " \t\r\n":
                        begin += 1
                    _, stop = _DECODER.raw_decode(text, begin)
                    out += [text[done:begin], json.dumps(r.replacement, ensure_ascii=False)]
                    done = pos = stop
                    while h < n and hints[h] < stop:
                        h += 1
                continue
            clean = r._json_string(value)
            if clean != value:
                out += [text[done:start], json.dumps(clean, ensure_ascii=False)]
                done = end
            pos = end
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)


def same_request(journaled: Any, request: Any) -> bool:
    """Whether a journaled request (a durable call's, a cassette's) is ``request``. Journals and
    cassettes written while redaction re-encoded every JSON nested in a string hold it compacted
    (``{"a": 1}`` as ``{"a":1}``) even where nothing was redacted: such a request is the same
    request, not changed code."""
    return journaled == request or _compact_nested(journaled) == _compact_nested(request)


def _compact_nested(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _compact_nested(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact_nested(v) for v in value]
    if isinstance(value, str) and value[:1] in ("{", "[") and len(value) <= _NESTED_JSON_LIMIT:
        try:
            nested = json.loads(value)
        except ValueError:
            return value
        if isinstance(nested, (dict, list)):
            return json.dumps(_compact_nested(nested), ensure_ascii=False, separators=(",", ":"))
    return value
