"""The command line's project configuration: which code is the app, and what else to redact.

Where the command line finds the workflows it may drive, first match wins:

1. modules named on the command line: ``agentsaga worker mypkg.agents``, ``--app mypkg.agents``
   (repeatable) on every verb that drives runs;
2. ``AGENTSAGA_APP`` (comma-separated);
3. a project config, found by walking up from the working directory: ``agentsaga.toml``, or
   ``pyproject.toml`` with a ``[tool.agentsaga]`` table (in one directory ``agentsaga.toml`` wins).
   Relative paths and modules in it are resolved relative to that file's directory.

Modules and relative paths of 1 and 2 are resolved in the working directory: a module is looked
for there first, as ``python -m`` does (``engine/loader.py``), whether the CLI runs as the
``agentsaga`` script or as ``python -m orchestrator.cli``.

The config file (every key optional; an unknown key or a wrong type is an error naming the file)::

    app = "mypkg.agents"            # or a list: ["mypkg.agents", "flows/billing.py"]
    [redact]
    fields = ["ssn", "iban"]        # field / header / parameter names redacted from the journal
    patterns = ["ACME-[0-9]{8}"]    # regexes redacted anywhere in journaled text

(in pyproject.toml the same keys go under ``[tool.agentsaga]`` and ``[tool.agentsaga.redact]``).

The redaction settings apply to every verb that writes (run, enqueue, signal, resume, worker, ...).
Reading verbs (runs, show, history, verify, report, stats, gc) never import the app, whatever is
configured: reading a run must not run code (invariant 11).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.payload.redact import Redactor

__all__ = ["ProjectConfig", "AppSource", "ConfigError", "find_config", "load_config", "app_source", "ENV_APP"]

ENV_APP = "AGENTSAGA_APP"
CONFIG_NAME = "agentsaga.toml"
_KEYS = {"app", "redact"}
_REDACT_KEYS = {"fields", "patterns"}


class ConfigError(Exception):
    """The project config (or ``AGENTSAGA_APP``) is malformed; the message names the file and key."""


@dataclass(frozen=True, slots=True)
class ProjectConfig:
    """What a config file says; ``path`` is the file, ``base`` the directory specs resolve in."""

    path: Path | None = None
    app: tuple[str, ...] = ()
    redact_fields: tuple[str, ...] = ()
    redact_patterns: tuple[str, ...] = ()

    @property
    def base(self) -> Path | None:
        return None if self.path is None else self.path.parent


@dataclass(frozen=True, slots=True)
class AppSource:
    """The app specs to load, where they came from (for messages) and the directory they resolve in."""

    specs: tuple[str, ...]
    origin: str  #: "the command line", "AGENTSAGA_APP" or the config file's path
    base: Path | None = None


def find_config(start: Path | None = None) -> Path | None:
    """The nearest ``agentsaga.toml``, or ``pyproject.toml`` with ``[tool.agentsaga]``, from ``start`` up."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / CONFIG_NAME
        if candidate.is_file():
            return candidate
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _tool_table(pyproject) is not None:
            return pyproject
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def _tool_table(path: Path) -> dict[str, Any] | None:
    try:
        data = _read(path)
    except ConfigError:
        return None  # a broken pyproject.toml that is not ours is not our business
    table = data.get("tool", {}).get("agentsaga") if isinstance(data.get("tool"), dict) else None
    return table if isinstance(table, dict) else None


def load_config(start: Path | None = None) -> ProjectConfig:
    """The project config in effect from ``start`` (the working directory); empty when there is none."""
    path = find_config(start)
    if path is None:
        return ProjectConfig()
    if path.name == CONFIG_NAME:
        table, where = _read(path), str(path)
    else:
        table, where = _tool_table(path) or {}, f"{path} [tool.agentsaga]"
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: app, redact")
    app = _strings(table.get("app"), f"{where}: app")
    redact = table.get("redact", {})
    if not isinstance(redact, dict):
        raise ConfigError(f"{where}: redact must be a table with fields and/or patterns, got {redact!r}")
    unknown = sorted(set(redact) - _REDACT_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} in redact; known: fields, "
                          "patterns")
    fields = _strings(redact.get("fields"), f"{where}: redact.fields")
    patterns = _strings(redact.get("patterns"), f"{where}: redact.patterns")
    try:
        Redactor(fields=fields, patterns=patterns)
    except ValueError as exc:
        raise ConfigError(f"{where}: redact: {exc}") from None
    return ProjectConfig(path=path, app=app, redact_fields=fields, redact_patterns=patterns)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{what} must be a string or a list of non-empty strings, got {value!r}")
    return tuple(v.strip() for v in value)


def app_source(named: list[str] | tuple[str, ...] | None, config: ProjectConfig,
               environ: Mapping[str, str] | None = None) -> AppSource | None:
    """The app to load: named on the command line, else ``AGENTSAGA_APP``, else the config; None if none."""
    if named:
        return AppSource(tuple(named), "the command line")
    env = (os.environ if environ is None else environ).get(ENV_APP, "").strip()
    if env:
        specs = tuple(s.strip() for s in env.split(",") if s.strip())
        if not specs:
            raise ConfigError(f"{ENV_APP}={env!r} names no module")
        return AppSource(specs, ENV_APP)
    if config.app:
        return AppSource(config.app, str(config.path), config.base)
    return None
