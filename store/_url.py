"""Database URLs: which backend a URL names, and how to show it without its password.

Everything here runs before any connection is made, so a typo in a URL is a `ConfigError`
that names the URL (password masked) instead of a driver error from deep inside a connect.
"""

from __future__ import annotations

import os
import re

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .errors import ConfigError

__all__ = ["ACCEPTED", "default_url", "mask_url", "parse_url"]

ACCEPTED = ("sqlite://", "postgresql://", "postgres://", "postgresql+psycopg://")
SQLITE_SCHEMES = frozenset({"sqlite"})
POSTGRES_SCHEMES = frozenset({"postgresql", "postgres", "postgresql+psycopg"})

# Regexes rather than a URL parser, because masking must also work on the malformed URLs
# that we are about to report as malformed.
_USERINFO_PASSWORD = re.compile(r"(://[^/?#@:]*:)([^/?#@]*)@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&#]*)", re.IGNORECASE)


def default_url() -> str:
    """`$AGENTSAGA_DB`, else a SQLite file `agentsaga.db` in the working directory."""
    return os.environ.get("AGENTSAGA_DB") or "sqlite:///agentsaga.db"


def mask_url(url: str) -> str:
    """`url` with any password replaced by `***`."""
    url = _USERINFO_PASSWORD.sub(r"\1***@", url)
    return _QUERY_PASSWORD.sub(r"\1***", url)


def config_error(url: str, reason: str) -> ConfigError:
    """The one wording of a bad-URL error, so every dialect reports it alike."""
    # `reason` may quote a parser's complaint about part of the URL; scrub the password from it.
    for match in (*_USERINFO_PASSWORD.finditer(url), *_QUERY_PASSWORD.finditer(url)):
        if match.group(2):
            reason = reason.replace(match.group(2), "***")
    return ConfigError(
        f"invalid database URL {mask_url(url)!r}: {reason}; accepted schemes: {', '.join(ACCEPTED)}"
    )


def parse_url(url: object) -> tuple[str, URL]:
    """Split `url` into ("sqlite" | "postgresql", parsed URL) or raise `ConfigError`."""
    if not isinstance(url, str) or not url.strip():
        raise config_error(str(url), "expected a non-empty URL string")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise config_error(url, f"cannot parse it ({exc})") from None
    scheme = parsed.drivername.lower()
    if scheme in SQLITE_SCHEMES:
        return "sqlite", parsed
    if scheme in POSTGRES_SCHEMES:
        return "postgresql", parsed
    raise config_error(url, f"unsupported scheme {parsed.drivername!r}")
