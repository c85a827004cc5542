"""Which of a user's redaction patterns may be searched over a whole JSON document, and how.

Used by ``redact.Redactor`` for the journal's redaction of user patterns (``JournalRedactor``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["document_screen", "search_any"]


# A user's pattern is applied to each string by itself (``Redactor.text``), so "^\d{3}-\d{2}-\d{4}$"
# redacts a value that is exactly an SSN. Searched over a whole JSON document it would not even find
# one: there ^ and $ stand at the document's ends, a string's newline is the two characters \n, and
# so on. The journal therefore asks, per pattern, one of two exact questions:
#
# * a *screen* (``document_screen``): the pattern without its zero-width assertions (anchors, word
#   boundaries, lookarounds), which only drops conditions, searched over the whole document. Exact
#   when the pattern cannot match a character that JSON escapes (a quote, a backslash, a control
#   character): any match inside a string is then written in the document as it is. (An escape
#   that may stand for any character, \u or \/, is a built-in hint of its own.) One regex pass.
# * otherwise (``.``, ``\s``, ``[^...]``, ...) each string of the document is decoded and searched
#   by itself, as ``text()`` would, and JSON inside a string by its own strings.
try:  # re's own parser and compiler: private, so any trouble here means "no screen", never a wrong one
    from re import _compiler as _re_compiler
    from re import _constants as _re_constants
    from re import _parser as _re_parser
except ImportError:  # pragma: no cover
    _re_compiler = _re_constants = _re_parser = None  # type: ignore[assignment]


def _escaped(char: int) -> bool:
    """Whether JSON text writes this character as an escape (a quote, a backslash, a control character)."""
    return char < 0x20 or char in (0x22, 0x5C)


def _relax(sub: Any, refs: list[Any]) -> bool:
    """Drop the zero-width assertions of a parsed pattern, in place; False when it can match a
    character JSON escapes (or holds something not known here). Back references go in ``refs``."""
    c = _re_constants
    kept = []
    for op, av in sub.data:
        if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            continue
        if op is c.LITERAL:
            if _escaped(av):
                return False
        elif op is c.IN:
            for item, value in av:
                if item is c.LITERAL:
                    if _escaped(value):
                        return False
                elif item is c.RANGE:
                    low, high = value
                    if low < 0x20 or low <= 0x22 <= high or low <= 0x5C <= high:
                        return False
                elif item is not c.CATEGORY or value not in (c.CATEGORY_DIGIT, c.CATEGORY_WORD):
                    return False  # (a negated class, \s, \S, \W, \D)
        elif op is c.SUBPATTERN:
            if not _relax(av[-1], refs):
                return False
        elif op is c.BRANCH:
            if not all(_relax(branch, refs) for branch in av[1]):
                return False
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)):
            if not _relax(av[2], refs):
                return False
        elif op is getattr(c, "ATOMIC_GROUP", None):
            if not _relax(av, refs):
                return False
        elif op is c.GROUPREF_EXISTS:
            refs.append(av[0])
            if not _relax(av[1], refs) or (av[2] is not None and not _relax(av[2], refs)):
                return False
        elif op is c.GROUPREF:  # (a back reference matches what its group did)
            refs.append(av)
        else:
            return False  # ANY, NOT_LITERAL, ...
        kept.append((op, av))
    sub.data[:] = kept
    sub.width = None  # (computed again from what is left)
    return True


def document_screen(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """``pattern`` without its zero-width assertions, to search a whole JSON document for the places
    where it could match one of its strings; None when that would not be exact (see above)."""
    if _re_parser is None or not isinstance(pattern.pattern, str):
        return None
    try:
        parsed = _re_parser.parse(pattern.pattern, pattern.flags)
        refs: list[Any] = []
        if not _relax(parsed, refs):
            return None
        # What follows its first literal is a screen too (it matches inside any match of the whole),
        # and a literal first is searched for fast: "^\d{3}-\d{2}-\d{4}$" screens with "-\d{2}-\d{4}",
        # 6 us over a 20 KB event where a leading \d{3} (tried at every position) took 230 us; so
        # does "\bEMP-\d{6}\b" with "EMP-\d{6}" (290 us searched as written). Not past a group a
        # back reference needs.
        first = next((i for i, (op, _) in enumerate(parsed.data) if op is _re_constants.LITERAL), 0)
        if first and not refs:
            parsed.data[:] = parsed.data[first:]
            parsed.width = None
        screen = _re_compiler.compile(parsed, pattern.flags)
    except Exception:  # noqa: BLE001 (a parser that changed: no screen, the pattern is searched per string)
        return None
    return screen if screen.search("") is None else None


def search_any(patterns: tuple[re.Pattern[str], ...]) -> Any:
    """One ``search(text)`` for several patterns (a match of any of them, or None)."""
    if len(patterns) == 1:
        return patterns[0].search
    if patterns and all(p.flags & ~re.UNICODE == 0 and p.groups == 0 for p in patterns):  # (\1 would shift)
        try:
            return re.compile("|".join(f"(?:{p.pattern})" for p in patterns)).search
        except re.error:
            pass
    return lambda text: next((m for p in patterns if (m := p.search(text)) is not None), None)
