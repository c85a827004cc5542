"""What every CLI verb module shares: its two error kinds, argument parsing and opening the engine.

Kept apart from ``main.py`` so the verb modules (``main.py`` for running, ``audit.py`` for
reading, ``ops.py`` for workers and queues) can all import it without importing each other.

Two ways to open the engine, one per kind of verb:

- ``open_orchestrator(args, app=True)`` for verbs that drive runs: the app (``--app``,
  ``AGENTSAGA_APP`` or the project config, see ``config.py``) is imported and its workflows
  registered, its top-level ``Compensations`` registries (combined into one when there are several)
  undo their effects, and the config's redaction settings apply;
- ``open_reader(args)`` for verbs that only read: nothing is imported, and a SQLite file that does
  not exist is an error instead of a new empty database.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from compensations import CompensationDefinitionError, Compensations
from orchestrator._orchestrator import Orchestrator
from orchestrator.cli.config import ConfigError, ProjectConfig, app_source, load_config
from orchestrator.cli.progress import Progress
from orchestrator.engine.loader import AppCode, load_app, load_app_code, load_registries, load_target, split_spec
from orchestrator.errors import WorkflowNotFoundError
from store import LeaseHeldError, default_url
from workflows import Workflow

__all__ = ["UsageError", "CommandError", "parse_time", "parse_json", "parse_duration", "parse_object",
           "open_orchestrator",
           "open_reader", "add_progress_flag", "add_app_flag", "app_code", "app_workflows", "app_compensations",
           "project_config", "resolve_target", "Target", "follow_up", "held_message", "parse_size"]


class UsageError(Exception):
    """Bad command-line input (exit 2)."""


class CommandError(Exception):
    """The operation could not be done, for a reason outside the engine (exit 1), e.g. a file."""


def parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"invalid time {text!r}: use ISO 8601, e.g. 2026-11-22 or 2026-11-22T10:00:00") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return value.timestamp()


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text, parse_constant=_not_json, object_pairs_hook=_no_repeated_keys)
    except _RepeatedKey as repeated:
        raise UsageError(f"{what} gives the key {repeated.key!r} twice in one object; JSON would keep only the "
                         "last value: give it once") from None
    except ValueError as exc:  # json.JSONDecodeError, or a constant JSON does not have
        raise UsageError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"{what} is nested too deeply to be read as JSON") from None


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # {"n": 1, "n": 2} is JSON that json reads as {"n": 2}: what was typed would be lost without a word.
    made = dict(pairs)
    if len(made) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return made


def _not_json(constant: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON has not: the journal would refuse them later.
    raise ValueError(f"{constant} is not a JSON value (JSON has no NaN or Infinity)")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str | None, what: str) -> float | None:
    """``45s``, ``90m``, ``12h``, ``30d``, ``2w`` -> seconds. The unit is required: a bare ``30``
    could mean seconds or days, and reading it the wrong way deletes runs (``gc``)."""
    if text is None:
        return None
    found = _DURATION.match(text)
    if not found:
        bare = re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text) is not None
        why = "needs a unit" if bare else "is not a duration"
        raise UsageError(f"{what} {text!r} {why}: use a number with s, m, h, d or w (e.g. 30d, 12h, 90m, 45s)")
    return float(found.group(1)) * _UNIT[found.group(2)]


_SIZE = re.compile(r"^\s*(\d+)\s*(?:([kmgt])(?:i?b)?|b)?\s*$", re.IGNORECASE)


def parse_size(text: str, what: str) -> int:
    """``1048576``, ``512k``, ``256M``, ``2GiB`` -> bytes (K, M, G, T are powers of 1024)."""
    found = _SIZE.match(text)
    if not found or int(found.group(1)) < 1:
        raise UsageError(f"{what} {text!r} is not a size: use a positive number of bytes, or one with K, M, G or T "
                         "(e.g. 512M, 2G)")
    return int(found.group(1)) * 1024 ** (" kmgt".index(found.group(2).lower()) if found.group(2) else 0)


def parse_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object given on the command line (``--input``): bad JSON and a non-object are both usage errors."""
    value = parse_json(text, what)
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object like '{{\"question\": \"...\"}}', "
                         f"got a JSON {_json_kind(value)}")
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return {list: "array", str: "string", int: "number", float: "number"}.get(type(value), type(value).__name__)


def project_config(args: argparse.Namespace) -> ProjectConfig:
    """The project config in effect (read once per command; it is only TOML, never code)."""
    config = getattr(args, "_config", None)
    if config is None:
        config = load_config()
        args._config = config
    return config


def app_code(args: argparse.Namespace) -> AppCode:
    """The workflows and compensation registries of the app named by ``--app`` (or positional app
    specs), ``AGENTSAGA_APP`` or the project config; empty when none is named anywhere. Imported
    once per command."""
    code = getattr(args, "_app_code", None)
    if code is not None:
        return code
    config = project_config(args)
    source = app_source(getattr(args, "app", None), config)
    code = AppCode()
    for spec in source.specs if source is not None else ():
        try:
            code += load_app_code(spec, base=source.base)
        except WorkflowNotFoundError as exc:
            raise WorkflowNotFoundError(f"{exc} (app named by {source.origin})") from exc
    args._app_code = code
    args._app_origin = source.origin if source is not None else None
    return code


def app_workflows(args: argparse.Namespace) -> list[Workflow]:
    """The workflows of the app named by ``--app`` (or positional app specs), ``AGENTSAGA_APP`` or the
    project config; empty when none is named anywhere."""
    return list(app_code(args).workflows)


def app_compensations(args: argparse.Namespace) -> Compensations | None:
    """The app's top-level ``Compensations`` registries as one registry for the Orchestrator (None
    when it has none); see ``_one_registry``."""
    return _one_registry(args, app_code(args).compensations)


def _one_registry(args: argparse.Namespace, registries: Sequence[Compensations]) -> Compensations | None:
    """``registries`` as one (``AppCode.registry``): None, the only one, or all combined. One name
    registered with two different functions is an error naming the name and both definitions (and
    where the app was named, when one was)."""
    try:
        return AppCode(compensations=tuple(registries)).registry()
    except CompensationDefinitionError as exc:
        origin = getattr(args, "_app_origin", None)
        raise CompensationDefinitionError(f"{exc} (app named by {origin})" if origin else str(exc)) from exc


class Target(NamedTuple):
    """What ``run`` / ``enqueue`` were told to start: the workflow, the app's other workflows to
    register with it, and the compensation registries of the module the workflow was named in."""

    workflow: Workflow
    others: list[Workflow]
    compensations: list[Compensations]


def resolve_target(args: argparse.Namespace) -> Target:
    """The workflow ``run`` / ``enqueue`` were told to start, and the others to register with it.

    ``module:attr`` or ``file.py:attr`` is imported as named; a bare name is first looked up among
    the app's workflows (``--app``, ``AGENTSAGA_APP``, the project config), then imported as a
    module or file that must define exactly one workflow. ``compensations``: the top-level registries
    of the module the workflow was named in, and of the app when its workflows come along."""
    spec = args.target
    if split_spec(spec)[1] is not None:
        return Target(load_target(spec), [], load_registries(spec))
    app = app_workflows(args)
    app_registries = list(app_code(args).compensations)
    for wf in app:
        if wf.name == spec:
            return Target(wf, app, app_registries)
    looks_like_code = spec.endswith(".py") or "/" in spec or "." in spec
    if not looks_like_code:
        known = ", ".join(sorted(repr(w.name) for w in app)) or "none: no app is named"
        raise UsageError(f"no workflow named {spec!r} in the app (its workflows: {known}); name it as "
                         "module:attr or file.py:attr, or name the app with --app, AGENTSAGA_APP or agentsaga.toml")
    found = load_app(spec)
    if len(found) != 1:
        names = ", ".join(repr(w.name) for w in found)
        raise UsageError(f"{spec!r} defines {len(found)} workflows ({names}); name one as '{spec}:attr'")
    return Target(found[0], app, [*load_registries(spec), *app_registries])


def open_orchestrator(args: argparse.Namespace, workflows: Sequence[Any] = (), *, app: bool = False,
                      existing: bool = False, compensations: Sequence[Compensations] = ()) -> Orchestrator:
    """The Orchestrator a verb that writes works with: ``workflows`` and ``compensations`` (registries)
    plus, with ``app``, the app's workflows and top-level registries (combined into one registry);
    the project config's redaction; progress lines on when asked or when stderr is a terminal.
    ``existing``: the verb works on a run that must already exist (resume, signal, cancel, ...), so
    a SQLite file that does not exist, and a database that holds no agentsaga journal (an empty
    file, a new Postgres schema, another application's database), are errors naming it, and nothing
    is created in it: no file, no tables (``_require_journal``)."""
    config = project_config(args)
    if existing:
        _require_database(args)
        _require_journal(args)
    registered = list(workflows)
    registries = list(compensations)
    if app:
        registered += [wf for wf in app_workflows(args) if not any(wf is w for w in registered)]
        registries += app_code(args).compensations
    registry = _one_registry(args, registries)
    progress = getattr(args, "progress", False) or (hasattr(args, "progress") and sys.stderr.isatty())
    return Orchestrator(args.db, workflows=registered, compensations=registry, redact=config.redact_patterns,
                        redact_fields=config.redact_fields, observers=[Progress(sys.stderr)] if progress else (),
                        signing_key=signing_key())


def signing_key() -> str | None:
    """The savepoint signing key from ``AGENTSAGA_SIGNING_KEY`` (never a flag: it would show in ``ps``)."""
    return os.environ.get("AGENTSAGA_SIGNING_KEY") or None


def open_reader(args: argparse.Namespace) -> Orchestrator:
    """The Orchestrator a reading verb works with: no workflow and no app imported (invariant 11),
    and a store opened with ``create=False`` (invariant 10): the database must already be an
    agentsaga database at this schema version, and nothing in it is created, migrated or stamped.
    Another application's database, an empty file, a new Postgres schema or an in-memory URL is
    refused naming the database; so is one that needs a migration (a driving verb makes it)."""
    _require_database(args)  # a missing SQLite file: the same message as every other verb's
    return Orchestrator(args.db, store_options={"create": False}, signing_key=signing_key())


def _require_database(args: argparse.Namespace) -> None:
    """A SQLite file that does not exist is an error naming it: reading must not create one."""
    url = args.db or default_url()
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        path = url[len("sqlite:///"):].split("?", 1)[0]
        if path and not os.path.exists(path):
            run_id = getattr(args, "run_id", None)
            subject = f"no run {run_id!r}: " if run_id else ""
            raise CommandError(f"{subject}no database at {path!r} (working directory {os.getcwd()!r}); "
                               "pass --db URL or set AGENTSAGA_DB")


def _require_journal(args: argparse.Namespace) -> None:
    """A database that holds no agentsaga tables is an error naming it, for a verb that works on a
    run that must exist: opening it to drive runs would create the schema (and, on SQLite, the
    file's WAL mode) only to report that the run is not there, leaving a mistyped ``--db`` an
    agentsaga database. It is looked at as the reading verbs look (``create=False``: nothing is
    created, migrated or stamped). A schema that needs a migration is not refused: the verb's own
    open migrates it, as every open that may write does. Any other refusal (a newer schema, a file
    that is no SQLite database, an unreachable server) is raised as the store words it."""
    from store import SchemaVersionError, open_store

    url = args.db or default_url()
    try:
        open_store(url, create=False).close()
    except SchemaVersionError as exc:
        if exc.absent:
            run_id = getattr(args, "run_id", None)
            subject = f"no run {run_id!r}: " if run_id else ""
            raise CommandError(
                f"{subject}{_without_password(url)} holds no agentsaga journal (it has no agentsaga tables: "
                "not an agentsaga database, or a mistyped --db); nothing was created in it. Pass --db URL "
                "or set AGENTSAGA_DB to the database the run is in") from None
        if exc.found is None or exc.supported is None or exc.found > exc.supported:
            raise
        # an older schema: the verb's open migrates it


def follow_up(args: argparse.Namespace, *words: str, app: bool = True, target: str | None = None) -> str:
    """A command to print as what to do next, written so that it works as printed (in the same
    working directory and environment): ``agentsaga WORDS`` plus the ``--app`` this invocation's
    code came from and the ``--db`` it was given.

    ``app``: the command drives runs, so it needs the workflows. They are named as this invocation
    named them: its ``--app`` flags, and ``target``, the workflow ``run`` was given as code (a
    ``file.py:attr`` is no app the next command would find by itself). An app found through
    ``AGENTSAGA_APP`` or the project config is found again the same way, so it is not repeated;
    with no app anywhere, ``--app MODULE`` says that one must be named. ``--db`` is repeated when it
    was given (``AGENTSAGA_DB`` and the default file are found again), its password, if any,
    shown as ``***`` rather than printed to a terminal or a CI log."""
    parts = ["agentsaga", *words]
    if app:
        apps = [*(getattr(args, "app", None) or ()), *([target] if target else [])]
        if apps:
            for spec in dict.fromkeys(apps):
                parts += ["--app", spec]
        elif not _app_configured(args):
            parts += ["--app", "MODULE"]
    if getattr(args, "db", None):
        parts += ["--db", _without_password(args.db)]
    return " ".join(part if part == "MODULE" else shlex.quote(part) for part in parts)


def held_message(args: argparse.Namespace, held: LeaseHeldError, *, target: str | None = None) -> str:
    """What the command line says when a live process holds the run's lease: the engine's message
    (who drives the run, until when), with commands that work as printed (``follow_up``: this
    invocation's ``--app``, or ``target``, and its ``--db``) instead of the library's
    ``orc.resume(ID)`` and bare ``agentsaga resume ID``, which would find no app and the wrong database."""
    run_id = held.run_id or getattr(args, "run_id", None) or "RUN"
    until = held.until(time.time())
    return (f"run {run_id!r} is being driven by {held.owner!r}{until}. If that process is gone, take the run over "
            f"now with: {follow_up(args, 'resume', run_id, target=target)} (otherwise let it finish, or wait for "
            f"its lease to expire: a worker, or {follow_up(args, 'recover', target=target)}, continues it then)")


def _app_configured(args: argparse.Namespace) -> bool:
    """Whether ``AGENTSAGA_APP`` or the project config names an app. A malformed one counts as none
    here: a hint must never fail the command that prints it (a reading verb reads no config else)."""
    try:
        return app_source(None, project_config(args)) is not None
    except ConfigError:
        return False


def _without_password(url: str) -> str:
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        url = url.replace(f":{password}@", ":***@", 1)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def add_app_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", action="append", metavar="MODULE",
                        help="import this module (or file.py, or either with :attr) and drive runs of the workflows "
                             "it defines, undoing effects with its top-level Compensations registries (repeat for "
                             "several; default: $AGENTSAGA_APP, else app in agentsaga.toml)")


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action="store_true",
                        help="print a line per finished step to stderr (the default when stderr is a terminal)")
