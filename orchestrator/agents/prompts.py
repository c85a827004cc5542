"""Prompts as jinja2 templates: from strings, files or a directory, strict about their variables.

    plan = Prompt("Plan research on {{ question }} in {{ city }}.", name="plan")
    text = plan.render(question="venues", city="Lisbon")        # a str that knows its template
    llm.chat(ctx, [{"role": "user", "content": text}])           # journaled with the template name

    prompts = Prompts("prompts/")                                # {% include %} works between files
    prompts["answer.j2"].message(role="system", facts=facts)     # {"role": "system", "content": ...}

Decisions:

* ``StrictUndefined``: a missing variable is a ``PromptError`` naming every variable the template
  needs but was not given, raised by ``render`` (so before any model call is made and before
  anything is journaled). A template may still test ``{% if x is defined %}`` and render without
  x; an attribute missing inside a given variable is named too.
* No autoescaping: a prompt is text for a model, not HTML. Whitespace control (``trim_blocks``,
  ``lstrip_blocks``) is on, so block tags do not leave blank lines in the prompt.
* ``render`` returns ``RenderedPrompt``, a ``str`` carrying the template's name and a hash of its
  source. The LLM client journals both with the request, so the audit shows which template (and
  which version of it) produced each message, while the message itself stays a plain string.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from orchestrator.errors import PromptError

__all__ = ["Prompt", "Prompts", "RenderedPrompt", "PromptError"]

_MAX_MISSING = 100  # names reported at most (each costs a trial render)
_UNDEFINED_NAME = re.compile(r"^'([A-Za-z_][A-Za-z0-9_]*)' is undefined$")


class RenderedPrompt(str):
    """A rendered prompt: a ``str`` with ``.template`` (its name) and ``.sha256`` (of the template source)."""

    template: str
    sha256: str

    def __new__(cls, text: str, *, template: str, sha256: str) -> RenderedPrompt:
        self = super().__new__(cls, text)
        self.template = template
        self.sha256 = sha256
        return self

    def describe(self) -> dict[str, str]:
        return {"template": self.template, "sha256": self.sha256}


def _environment(loader: jinja2.BaseLoader | None = None) -> jinja2.Environment:
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, autoescape=False,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)


class Prompt:
    """One template. ``role`` is used by ``message()``; ``name`` is what the journal shows."""

    def __init__(self, source: str, *, name: str = "<string>", role: str = "user",
                 environment: jinja2.Environment | None = None) -> None:
        if not isinstance(source, str):
            raise PromptError(f"prompt {name!r}: the template source must be a string, got {type(source).__name__}")
        self.name = name
        self.role = role
        self.source = source
        self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
        self._env = environment or _environment()
        try:
            parsed = self._env.parse(source, name=name)
            self._template = self._env.from_string(parsed) if environment is None else \
                self._env.get_template(name)
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(f"prompt {name!r}, line {exc.lineno}: template syntax error: {exc.message}") from None
        except jinja2.TemplateNotFound as exc:
            raise PromptError(f"prompt {name!r} includes {exc.name!r}, which does not exist") from None
        #: the variables the template itself reads (not those of templates it includes)
        self.variables = frozenset(jinja2.meta.find_undeclared_variables(parsed))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, name: str | None = None, role: str = "user") -> Prompt:
        """A template file (its file name is the journaled name unless ``name`` is given)."""
        p = Path(path)
        try:
            source = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise PromptError(f"prompt file {str(p)!r} cannot be read: {exc.strerror or exc}") from None
        return cls(source, name=name or p.name, role=role)

    def render(self, **variables: Any) -> RenderedPrompt:
        """The prompt text; a missing variable is a ``PromptError`` naming every missing one."""
        try:
            text = self._template.render(**variables)
        except jinja2.UndefinedError as exc:
            raise PromptError(f"prompt {self.name!r}: {self._explain(variables, exc)}") from None
        except jinja2.TemplateError as exc:
            raise PromptError(f"prompt {self.name!r}: {type(exc).__name__}: {exc}") from None
        return RenderedPrompt(text, template=self.name, sha256=self.sha256)

    def _explain(self, variables: dict[str, Any], exc: jinja2.UndefinedError) -> str:
        """Name every missing variable, not just the first one jinja2 tripped on.

        Only names the render actually needed: a template may test ``{% if x is defined %}`` and
        be fine without x. Each missing name is stood in for by a lenient undefined and the render
        tried again, until it fails for another reason or succeeds."""
        trial, missing = dict(variables), []
        error: jinja2.UndefinedError | None = exc
        while error is not None and len(missing) < _MAX_MISSING:
            found = _UNDEFINED_NAME.match(error.message or "")
            name = found.group(1) if found else None
            if name is None or name in trial:
                break
            missing.append(name)
            trial[name] = jinja2.ChainableUndefined(name=name)
            try:
                self._template.render(**trial)
                error = None
            except jinja2.UndefinedError as again:
                error = again
            except jinja2.TemplateError:
                error = None
        if not missing:
            return exc.message or "undefined value"
        given = ", ".join(sorted(variables)) or "none"
        return f"missing variable(s) {', '.join(repr(m) for m in missing)} (given: {given})"

    def message(self, *, role: str | None = None, **variables: Any) -> dict[str, Any]:
        """A chat message ``{"role", "content"}`` with the rendered prompt as content."""
        return {"role": role or self.role, "content": self.render(**variables)}

    def __repr__(self) -> str:
        return f"<Prompt {self.name!r} vars={sorted(self.variables)}>"


class Prompts:
    """Templates in a directory, by file name: ``prompts["plan.j2"]``; includes resolve in it."""

    def __init__(self, directory: str | os.PathLike[str], *, role: str = "user") -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise PromptError(f"prompt directory {str(self.directory)!r} does not exist")
        self.role = role
        self._env = _environment(jinja2.FileSystemLoader(str(self.directory)))
        self._cache: dict[str, Prompt] = {}

    def __getitem__(self, name: str) -> Prompt:
        prompt = self._cache.get(name)
        if prompt is None:
            try:
                source, _, _ = self._env.loader.get_source(self._env, name)  # type: ignore[union-attr]
            except jinja2.TemplateNotFound:
                known = ", ".join(self.names()) or "none"
                raise PromptError(f"no prompt {name!r} in {str(self.directory)!r} (there are: {known})") from None
            prompt = self._cache[name] = Prompt(source, name=name, role=self.role, environment=self._env)
        return prompt

    def names(self) -> list[str]:
        return sorted(p.relative_to(self.directory).as_posix() for p in self.directory.rglob("*") if p.is_file())
