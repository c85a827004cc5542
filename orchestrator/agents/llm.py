"""An OpenAI-compatible chat client whose calls are durable: ``LLM`` (sync steps), ``AsyncLLM`` (async).

    llm = LLM(model="gpt-4o-mini")   # base URL, model, key: OPENAI_BASE_URL, OPENAI_MODEL, OPENAI_API_KEY
    result = llm.chat(ctx, [{"role": "user", "content": prompt.render(q=q)}], tools=tools, temperature=0)
    result.content, result.tool_calls, result.usage, result.finish_reason

What is not given is read from those variables when each call is made, not when the client is
built (a module-level client uses the environment a test or a notebook sets up later). A call
without a key fails naming ``OPENAI_API_KEY``: before sending, when it would go to OpenAI's API;
for another server (which may need none) when it answers 401/403.

``chat`` goes through ``ctx.durable_call("llm", request, perform)``: the request and the response
are journaled as a ``CallCompleted`` event the moment the model answers, so a step that runs again
(a retry, a crash recovery, a wake-up after a wait) gets the journaled answer back without a
second request: a model call is paid for once. Under replay the response comes from the cassette.

What is journaled:

* request: ``{"model", "messages", "tools"?, "params", "prompts"?}``; ``messages`` as rendered, and
  for every message whose content came from a ``Prompt``, ``prompts`` says which template (name and
  source hash). The base URL and the API key are not part of it: the key never reaches the journal,
  and a cassette recorded against one endpoint replays against any.
* response: ``{"body", "finish_reason", "usage", "ms", "retries", "failures"?, "size", "truncated",
  "provider"}``: ``body`` is the provider's JSON; when it is bigger than ``max_response_bytes`` it
  is redacted (the journal's rules) and then its longest strings are cut, each ending in
  ``…[truncated: N chars]``, ``truncated`` is true and ``size`` is the full size in bytes. The step
  sees what the journal holds, on the first run as on a resumed one, so behaviour does not depend
  on whether the answer was replayed.

The key is not journaled or raised even when the provider echoes it, in an error ("Incorrect API
key provided: KEY") or in a reply: what this client sends in its ``Authorization`` header (and any
sensitive header of ``headers=``) is replaced (by the Redactor's ``[REDACTED]``) in the response it
journals and in every error it raises. On the hot path that costs one bytes search per form of
the key in the body; only a body holding one (or a JSON ``u`` or ``/`` escape, which could spell
one) is rebuilt. A 2xx that is not a chat completion is quoted in its error redacted, then cut.

Retries happen inside the call (a plain loop, the sleep injectable: building a tenacity retrier
cost more per call than the rest of the client's own work): connect errors, timeouts, 429 and
5xx, up to ``max_attempts``, waiting exactly ``Retry-After`` when the server sends one and
exponential backoff with jitter otherwise. A ``Retry-After`` longer than ``max_retry_after`` is not
waited out in-process: the error is raised (retryable, carrying ``retry_after``) for the step's own
``Retry`` policy, which honours it. 401/403 fail at once with a message about the API key; other
4xx fail at once. The HTTP layer and its error mapping are ``orchestrator.tools.http.HttpTool``'s.

Circuit breaker: one per provider, named ``llm:<host[:port]>`` unless ``breaker=`` names one or
passes a ``BreakerConfig`` (``breaker=False``: none). Its state is the engine's store-backed
breaker state (shared by all workers); its settings come from the Orchestrator's breaker registry
(``declare_breaker("llm:api.openai.com", ...)``) or the defaults. Every attempt counts, so a dead
provider opens the breaker and later calls fail fast with ``CircuitOpenError`` without a request.
Transitions are journaled on the step's event, like ``ctx.http``'s. ``AsyncLLM`` decides on a read
of the breaker's state at most ``BREAKER_MAX_AGE`` (0.5 s) old, shared by the calls in flight: a
breaker another worker opened is honoured within that time; one this process trips, at once.
Outside an Orchestrator (``llm.complete(request)``) pass ``breakers=StoreBreakers(...)`` to get one.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httpx

from compensations import BreakerConfig
from orchestrator.payload.truncate import bound_json, json_size
from orchestrator.tools.breakers import StoreBreakers
from orchestrator.tools.clients import LoopClients, client_options
from orchestrator.tools.http import AsyncHttpTool, HttpTool
from orchestrator.agents.prompts import RenderedPrompt
from orchestrator.payload.redact import Redactor
from orchestrator.errors import ConfigurationError, PermanentToolError, RetryableToolError

__all__ = ["LLM", "AsyncLLM", "ChatResult", "ToolCall", "DEFAULT_BASE_URL"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RESERVED = frozenset({"model", "messages", "tools", "stream"})  # not settable through **params
_SNIPPET = 300
#: An async call's breaker may be decided on a read of its state that began this long ago (seconds):
#: under load a healthy breaker then costs a few reads a second, not two per call. Not less: with a
#: thousand calls in flight one turn of the event loop (and a full garbage collection) takes up to
#: a tenth of a second, so at 0.1 s (the first value) six calls in ten found the read too old when
#: they asked and each waited for a new one, a wake-up more per call, even with reads begun ahead
#: (``_SharedRead.known``). A breaker another worker opens is honoured within this time.
BREAKER_MAX_AGE = 0.5
#: How much longer a parsed JSON body can be when encoded again compactly than the text it came
#: from. Only numbers grow ("1e15" is 18 characters as 1000000000000000.0); whitespace, escapes such
#: as \u00e9 or \/ and everything else stay the same or shrink.
_MAX_GROWTH = 5


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for; ``arguments`` is the model's raw JSON text."""

    id: str
    name: str
    arguments: str

    def parse(self) -> dict[str, Any]:
        """The arguments as a JSON object; ``ValueError`` saying what is wrong otherwise."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError as exc:
            raise ValueError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
        if not isinstance(value, dict):
            raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
        return value


@dataclass(frozen=True, slots=True)
class ChatResult:
    """A chat completion as journaled (``response``), with accessors for the first choice."""

    response: dict[str, Any]

    @property
    def body(self) -> dict[str, Any]:
        return self.response.get("body") or {}

    @property
    def _choice(self) -> dict[str, Any]:
        choices = self.body.get("choices") or [{}]
        return choices[0] if isinstance(choices[0], dict) else {}

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message, ready to append to the conversation."""
        raw = self._choice.get("message") or {}
        msg: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
        if raw.get("tool_calls"):
            msg["tool_calls"] = raw["tool_calls"]
        return msg

    @property
    def content(self) -> str | None:
        return self.message["content"]

    @property
    def tool_calls(self) -> list[ToolCall]:
        calls = []
        for i, tc in enumerate(self.message.get("tool_calls") or []):
            if not isinstance(tc, dict):
                tc = {}
            fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
            args = fn.get("arguments")
            if not isinstance(args, str):  # some servers send an object; the protocol says a string
                args = "" if args is None else json.dumps(args)
            calls.append(ToolCall(id=str(tc.get("id") or f"call_{i}"), name=str(fn.get("name") or ""), arguments=args))
        return calls

    @property
    def finish_reason(self) -> str | None:
        return self.response.get("finish_reason")

    @property
    def usage(self) -> dict[str, Any]:
        return self.response.get("usage") or {}

    @property
    def truncated(self) -> bool:
        return bool(self.response.get("truncated"))


_OPENAI_HOST = httpx.URL(DEFAULT_BASE_URL).host  # answers every call without a key with 401


class _Endpoint:
    """Where a call goes and what it sends: the base URL, model and key of one moment (each as
    given to the client, else from the environment), and what is derived from them once."""

    __slots__ = ("inputs", "base_url", "model", "api_key", "url", "endpoint", "provider", "headers", "secrets",
                 "secret_bytes", "wire_headers", "wire_head")

    def __init__(self, inputs: tuple[str | None, str | None, str | None], extra_headers: Mapping[str, str], *,
                 given_url: bool) -> None:
        self.inputs = inputs
        base_url, self.model, self.api_key = inputs
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.url = self.parse(self.base_url, "base_url" if given_url else "OPENAI_BASE_URL")
        self.endpoint = str(self.url)  # parsed once: httpx takes a URL as it is, a string per request
        self.provider = f"{self.url.host}:{self.url.port}" if self.url.port else self.url.host
        self.headers = {"Accept": "application/json", **extra_headers}
        if self.api_key:
            self.headers["Authorization"] = f"Bearer {self.api_key}"
        # What this client sends that must never come back in what it journals or raises: the API
        # key (alone and as "Bearer KEY"), sensitive headers of its own. A provider echoes them
        # ("Incorrect API key provided: KEY") in a form no redaction rule knows.
        self.secrets = Redactor().credentials(self.headers)
        # ... and how each may appear in a raw JSON body (as it is, or escaped as JSON escapes it)
        self.secret_bytes = tuple({form.encode() for secret in self.secrets
                                   for form in (secret, json.dumps(secret)[1:-1],
                                                json.dumps(secret, ensure_ascii=False)[1:-1])})
        # AsyncLLM's direct path: the request's headers as sent and its head, built at its first call
        self.wire_headers: list[tuple[bytes, bytes]] | None = None
        self.wire_head: bytes | None = None

    @staticmethod
    def parse(base_url: str, source: str) -> httpx.URL:
        """``base_url``'s chat completions URL; ``ConfigurationError`` naming ``source`` if it is none."""
        try:
            url = httpx.URL(str(base_url).rstrip("/") + "/chat/completions")
        except (httpx.InvalidURL, TypeError, ValueError):
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ConfigurationError(f"LLM {source} must be an http(s) URL, got {Redactor().url(str(base_url))!r}")
        return url


class _Base:
    kind = "llm"

    def __init__(self, *, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0, max_attempts: int = 4, backoff: float = 0.5, max_backoff: float = 20.0,
                 max_retry_after: float = 60.0, max_response_bytes: int = 256 * 1024,
                 breaker: BreakerConfig | str | bool | None = None, breakers: StoreBreakers | None = None,
                 headers: Mapping[str, str] | None = None, rng: random.Random | None = None) -> None:
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"LLM max_attempts must be an integer >= 1, got {max_attempts!r}")
        if not isinstance(max_response_bytes, int) or max_response_bytes < 256:
            raise ConfigurationError(f"LLM max_response_bytes must be an integer >= 256, got {max_response_bytes!r}")
        if breaker is not None and not isinstance(breaker, (BreakerConfig, str, bool)):
            raise ConfigurationError(f"LLM breaker must be a name, a BreakerConfig or False, got {breaker!r}")
        # What was given is fixed now (a bad base_url fails here); what was not is read from the
        # environment when a call is made (``_endpoint``), so a client built at import time (a
        # module-level ``llm = LLM()``) uses the environment a test or a notebook set up later.
        if base_url is not None:
            _Endpoint.parse(base_url, "base_url")
        self._given = (base_url, model, api_key)
        self._endpoint_now: _Endpoint | None = None
        self.timeout = httpx.Timeout(timeout, connect=min(10.0, timeout))
        self.max_attempts = max_attempts
        self.backoff, self.max_backoff, self.max_retry_after = backoff, max_backoff, max_retry_after
        self.max_response_bytes = max_response_bytes
        self._breaker = breaker
        self._breakers = breakers
        self._headers = dict(headers or {})
        self._rng = rng or random.Random()

    def _endpoint(self) -> _Endpoint:
        """Base URL, model and key as of now: each as given, else from ``OPENAI_BASE_URL``,
        ``OPENAI_MODEL`` and ``OPENAI_API_KEY`` as they are at this call. What is derived from them
        (the parsed URL, the forms of the key to keep out of the journal) is made again only when
        they change: three environment reads per call."""
        base_url, model, api_key = self._given
        env = os.environ
        inputs = (base_url if base_url is not None else env.get("OPENAI_BASE_URL") or None,
                  model or env.get("OPENAI_MODEL") or None,
                  api_key if api_key is not None else env.get("OPENAI_API_KEY") or None)
        now = self._endpoint_now
        if now is None or now.inputs != inputs:
            now = self._endpoint_now = _Endpoint(inputs, self._headers, given_url=base_url is not None)
        return now

    @property
    def base_url(self) -> str:
        return self._endpoint().base_url

    @property
    def model(self) -> str | None:
        return self._endpoint().model

    @property
    def endpoint(self) -> str:
        return self._endpoint().endpoint

    @property
    def provider(self) -> str:
        return self._endpoint().provider

    def __repr__(self) -> str:  # never the key, nor a password or key the base URL carries
        try:
            now = self._endpoint()
        except ConfigurationError:  # OPENAI_BASE_URL is no URL: the call will say so
            return f"<{type(self).__name__} with an invalid OPENAI_BASE_URL>"
        return f"<{type(self).__name__} {now.model!r} at {Redactor().url(now.base_url)}>"

    # -- the journaled request ------------------------------------------------------------------
    def request(self, messages: str | Sequence[Any], *, tools: Any = None, **params: Any) -> dict[str, Any]:
        """The request as journaled (and compared on resume and replay): no URL, no key."""
        model = self.model
        if model is None:
            raise ConfigurationError("LLM has no model: pass LLM(model=...) or set OPENAI_MODEL")
        bad = sorted(_RESERVED & params.keys())
        if bad:
            raise TypeError(f"llm.chat: {', '.join(bad)} cannot be passed as parameters"
                            + (" (streaming is not supported)" if "stream" in bad else ""))
        rendered, prompts = _messages(messages)
        request: dict[str, Any] = {"model": model, "messages": rendered}
        schemas = tools.schemas() if hasattr(tools, "schemas") else tools
        if schemas:
            request["tools"] = list(schemas)
        request["params"] = dict(params)
        if prompts:
            request["prompts"] = prompts
        return request

    def _body(self, request: Mapping[str, Any]) -> dict[str, Any]:
        body = {"model": request["model"], "messages": request["messages"], **request.get("params", {})}
        if request.get("tools"):
            body["tools"] = request["tools"]
        return body

    def _ready(self) -> _Endpoint:
        """The endpoint a call about to leave goes to. Refuses, before anything is sent, a call to
        OpenAI's own API without a key (it answers every one with 401); other servers (a local
        model, a gateway) may need none, and their 401 says to set the key (``_explain``)."""
        now = self._endpoint()
        if now.api_key is None and now.url.host == _OPENAI_HOST:
            raise PermanentToolError(
                f"LLM provider {now.provider}: no API key to send; set OPENAI_API_KEY (read when a call "
                "is made) or give the key to LLM as its api_key argument; not sent", tool=self._breaker_name(now) or "llm")
        return now

    # -- breaker, retries, errors -----------------------------------------------------------------
    def _breaker_name(self, now: _Endpoint | None = None) -> str | None:
        if self._breaker is False:
            return None
        if isinstance(self._breaker, BreakerConfig):
            return self._breaker.name
        if isinstance(self._breaker, str):
            return self._breaker
        return f"llm:{(now or self._endpoint()).provider}"

    def _tool_options(self, ctx: Any, now: _Endpoint) -> dict[str, Any]:
        """HttpTool options for a sync call: the breaker hooks (the step's store-backed breakers) and redactor."""
        step_tools = _step_tools(ctx)
        options: dict[str, Any] = {"redactor": step_tools.redactor if step_tools else Redactor(),
                                   "breaker_name": self._breaker_name(now) or "llm", "secrets": now.secrets}
        breaker = self._breaker_parts(step_tools, now)
        if breaker is not None:
            breakers, config_for, on_transition = breaker
            options["breaker"] = breakers.hooks(config_for, on_transition)
        return options

    def _breaker_parts(self, step_tools: Any, now: _Endpoint) -> tuple[StoreBreakers, Callable[[str], BreakerConfig],
                                                                        Callable[[Any], Any] | None] | None:
        """The call's breaker: the store-backed breakers, how a name finds its settings, and where
        its transitions are journaled (the step's event); None without one."""
        if self._breaker_name(now) is None:
            return None
        breakers = self._breakers or (step_tools.box.breakers if step_tools else None)
        if breakers is None:
            return None
        if isinstance(self._breaker, BreakerConfig):
            config_for: Any = self._breaker_config
        elif step_tools is not None:
            config_for = step_tools.box.breaker_settings.config_for
        else:
            config_for = _default_config
        return breakers, config_for, step_tools.transitions.append if step_tools else None

    def _breaker_config(self, _name: str) -> BreakerConfig:
        return self._breaker  # type: ignore[return-value]  # (a BreakerConfig: see _breaker_parts)

    def _next_wait(self, error: RetryableToolError, attempts: int) -> float | None:
        """Seconds to wait after ``attempts`` attempts, the last failing with ``error``; None: give up."""
        if (error.retry_after or 0) > self.max_retry_after:
            return None  # too long to hold the step here: the step's Retry policy can wait it out
        if attempts >= self.max_attempts:
            return None
        if error.retry_after is not None:
            return error.retry_after  # the server said when; no sooner, and no need to wait longer
        base = min(self.max_backoff, self.backoff * 2 ** (attempts - 1))
        return base * (0.5 + self._rng.random() / 2)

    def _explain(self, error: Exception, attempts: int, now: _Endpoint) -> Exception:
        """The error a call raises: every one from the provider starts ``LLM provider HOST``, says the
        status it answered (or that it did not answer) and whether it was retried, then the tool's
        own words (the request line and the provider's message, redacted: never the API key)."""
        where = f"LLM provider {now.provider}"
        if isinstance(error, RetryableToolError):
            answered = f"the last answered {_status(error.status)}" if error.status else "no answer"
            return RetryableToolError(f"{where} failed after {attempts} attempt(s), {answered}: {error}",
                                      tool=error.tool, status=error.status, retry_after=error.retry_after)
        if not isinstance(error, PermanentToolError) or str(error).startswith(where):
            return error  # an open breaker is not the provider's answer; a message of ours already says it
        if error.status in (401, 403) and now.api_key is None:
            advice = ("no API key was sent: set OPENAI_API_KEY (read when a call is made) or give "
                      "the key to LLM as its api_key argument")
        elif error.status in (401, 403):
            advice = "check OPENAI_API_KEY or the api_key given to LLM"
        elif error.status == 404:
            advice = f"check base_url and the model name ({now.model!r}): the provider does not know them"
        elif error.status is not None:
            advice = "retrying the same request would not help"
        else:
            return PermanentToolError(f"{where} failed: {error}", tool=error.tool, status=error.status)
        return PermanentToolError(f"{where} answered {_status(error.status)}: {advice}; not retried. {error}",
                                  tool=error.tool, status=error.status)

    def _shape(self, response: Any, failures: list[dict[str, Any]], ms: float, redactor: Redactor,
               now: _Endpoint) -> dict[str, Any]:
        """The journaled response; refuses a 2xx that is not a chat completion. ``redactor``: the
        call's (the journal's rules), for what is cut here before the journal sees it."""
        content = response.content
        try:
            body = json.loads(content)
        except ValueError:
            body = None
        # A secret this client sent, echoed back (one bytes search per form on the hot path; \u or
        # \/ escapes could spell one in any form, so a body holding them is searched when parsed).
        echoed = bool(now.secret_bytes) and (any(form in content for form in now.secret_bytes)
                                               or b"\\u" in content or b"\\/" in content)
        if echoed and body is not None:
            body = redactor.scrub(body, now.secrets)
        choices = body.get("choices") if isinstance(body, dict) else None
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)
                and isinstance(choices[0].get("message"), dict)
                # content is text, null (tool calls only) or a list of parts; a number or an object
                # would reach the step as ChatResult.content and fail there, far from its cause
                and isinstance(choices[0]["message"].get("content"), (str, list, type(None)))):
            # Scrubbed and redacted before it is cut: a cut could leave a secret short of its pattern.
            text = content.decode("utf-8", errors="replace")
            if echoed:
                text = redactor.scrub(text, now.secrets)
            snippet = redactor.body(text)[:_SNIPPET]
            raise PermanentToolError(f"LLM provider {now.provider} answered {response.status_code} with something "
                                     f"that is not a chat completion: {snippet!r}", tool=self._breaker_name(now))
        if len(content) * _MAX_GROWTH <= self.max_response_bytes:
            bounded, truncated = body, False  # fits: no need to encode it again to measure it
        else:
            # Too big: redacted with the journal's rules before its longest strings are cut, for
            # the same reason (a key cut to "sk-ABC…[truncated]" no longer matches its pattern).
            bounded = redactor.json(body) if json_size(body) > self.max_response_bytes else body
            bounded, truncated = bound_json(bounded, self.max_response_bytes)
        shaped: dict[str, Any] = {
            "body": bounded, "finish_reason": choices[0].get("finish_reason"), "usage": body.get("usage"),
            "ms": round(ms, 2), "retries": len(failures), "size": len(content), "truncated": truncated,
            "provider": now.provider,
        }
        if failures:
            shaped["failures"] = failures
        return shaped

    @staticmethod
    def _failure(error: BaseException, started: float) -> dict[str, Any]:
        entry: dict[str, Any] = {"error": type(error).__name__, "message": str(error)[:_SNIPPET],
                                 "ms": round((time.perf_counter() - started) * 1000, 2)}
        if isinstance(error, RetryableToolError):
            entry["status"] = error.status
            if error.retry_after is not None:
                entry["retry_after"] = error.retry_after
        return entry

def _status(code: int | None) -> str:
    """``404 Not Found``: a status with its reason phrase (just the number for one HTTP does not name)."""
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


class LLM(_Base):
    """The synchronous client, for sync steps. ``sleep`` is used between retries (inject it in tests)."""

    def __init__(self, *, sleep: Callable[[float], Any] = time.sleep, client: httpx.Client | None = None,
                 **options: Any) -> None:
        super().__init__(**options)
        self._sleep = sleep
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()  # parallel branches may make the first call at once

    @property
    def client(self) -> httpx.Client:
        """One pooled client for calls outside an Orchestrator (made on first use: importing a workflow
        stays cheap). Inside a step, calls use the Orchestrator's shared client instead."""
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(**client_options(self.timeout))
            return self._client

    def _client_for(self, ctx: Any) -> httpx.Client:
        box = _box(ctx)
        return box.client if box is not None and self._owns_client else self.client

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None

    def chat(self, ctx: Any, messages: str | Sequence[Any], *, tools: Any = None, **params: Any) -> ChatResult:
        """One durable chat completion (see the module docstring)."""
        request = self.request(messages, tools=tools, **params)
        return ChatResult(ctx.durable_call(self.kind, request, lambda: self.complete(request, ctx=ctx)))

    def complete(self, request: Mapping[str, Any], *, ctx: Any = None) -> dict[str, Any]:
        """Perform ``request`` now (with retries and the breaker), not journaled: what ``chat`` journals."""
        now = self._ready()
        tool = HttpTool(client=self._client_for(ctx), **self._tool_options(ctx, now))
        body, headers, failures = self._body(request), now.headers, []
        attempts = 0

        def attempt() -> dict[str, Any]:
            nonlocal attempts
            attempts += 1
            started = time.perf_counter()
            try:
                response = tool.post(now.url, json=body, headers=headers, timeout=self.timeout)
            except RetryableToolError as exc:
                failures.append(self._failure(exc, started))
                raise
            return self._shape(response, failures, (time.perf_counter() - started) * 1000, tool.redactor, now)

        try:
            while True:
                try:
                    return attempt()
                except RetryableToolError as exc:
                    wait = self._next_wait(exc, attempts)
                    if wait is None:
                        raise
                    failures[-1]["waited"] = round(wait, 3)
                    self._sleep(wait)
        except (RetryableToolError, PermanentToolError) as exc:
            raise self._explain(exc, attempts, now) from None


class AsyncLLM(_Base):
    """The asynchronous client, for async steps (``await llm.chat(ctx, ...)``)."""

    def __init__(self, *, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep, **options: Any) -> None:
        super().__init__(**options)
        self._sleep = sleep
        self._clients = LoopClients(self.timeout)  # for calls outside an Orchestrator: one per event loop
        # The tool a direct call maps its errors with, one per ToolBox (its redactor): it holds
        # nothing of a call, whose breaker gate is handed to it per call.
        self._direct: weakref.WeakKeyDictionary[Any, tuple[_Endpoint, AsyncHttpTool]] = weakref.WeakKeyDictionary()
        self._direct_lock = threading.Lock()

    def close(self) -> None:
        """Close the clients this model client made for calls outside an Orchestrator."""
        self._clients.close()

    async def chat(self, ctx: Any, messages: str | Sequence[Any], *, tools: Any = None, **params: Any) -> ChatResult:
        request = self.request(messages, tools=tools, **params)
        return ChatResult(await ctx.adurable_call(self.kind, request, lambda: self.acomplete(request, ctx=ctx)))

    async def acomplete(self, request: Mapping[str, Any], *, ctx: Any = None) -> dict[str, Any]:
        # The event loop's shared client (an httpx.AsyncClient is bound to its loop): the
        # Orchestrator's inside a step, else this object's own. Building a client per call would
        # cost an SSL context and a new connection per call.
        now = self._ready()
        step_tools = _step_tools(ctx)
        box = step_tools.box if step_tools is not None else None
        client, wire = box.async_pair() if box is not None else self._clients.pair()
        breaker = self._breaker_parts(step_tools, now)
        # Decisions on a read of the breaker's state shared with the calls in flight, never blocking the loop.
        gate = breaker[0].gate(breaker[1], breaker[2], max_age=BREAKER_MAX_AGE) if breaker is not None else None
        body, failures = self._body(request), []
        if wire is not None:  # straight to the loop's connections, skipping the client's per-request work
            tool = self._direct_tool(box, client, step_tools, now)
            if now.wire_headers is None:
                # What the client sends for this JSON POST (its default headers and ours), built
                # once per endpoint; the transport adds Host and Content-Length.
                built = client.build_request("POST", now.url, headers=now.headers, json={})
                now.wire_headers = [(name, value) for name, value in built.headers.raw
                                    if name.lower() not in (b"host", b"content-length")]
                now.wire_head = wire.head(b"POST", now.url, now.wire_headers)
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        else:  # through the client: a proxy from the environment applies
            tool = AsyncHttpTool(client=client, redactor=step_tools.redactor if step_tools else Redactor(),
                                 breaker_name=self._breaker_name(now) or "llm", secrets=now.secrets,
                                 breaker=(gate.before, gate.after) if gate is not None else None)
            headers = now.headers
        # One loop, no closures: the call is held while it is out, and so is all it made.
        attempts = 0
        try:
            while True:
                attempts += 1
                started = time.perf_counter()
                try:
                    if wire is not None:
                        response = await tool.post_direct(wire, now.url, now.wire_headers, content, self.timeout,
                                                          gate=gate, head=now.wire_head)
                    else:
                        response = await tool.post(now.url, json=body, headers=headers, timeout=self.timeout)
                except RetryableToolError as exc:
                    failures.append(self._failure(exc, started))
                    wait = self._next_wait(exc, attempts)
                    if wait is None:
                        raise
                    failures[-1]["waited"] = round(wait, 3)
                    await self._sleep(wait)
                    continue
                return self._shape(response, failures, (time.perf_counter() - started) * 1000, tool.redactor, now)
        except (RetryableToolError, PermanentToolError) as exc:
            raise self._explain(exc, attempts, now) from None

    def _direct_tool(self, box: Any, client: httpx.AsyncClient, step_tools: Any, now: _Endpoint) -> AsyncHttpTool:
        """The tool direct calls through ``box`` (None: outside an Orchestrator) map their errors
        with: made once per endpoint, since a call hands it its own breaker gate."""
        key = box if box is not None else self
        made = self._direct.get(key)
        if made is None or made[0] is not now:
            with self._direct_lock:
                made = self._direct.get(key)
                if made is None or made[0] is not now:
                    made = self._direct[key] = (now, AsyncHttpTool(
                        client=client, redactor=step_tools.redactor if step_tools else Redactor(),
                        breaker_name=self._breaker_name(now) or "llm", secrets=now.secrets))
        return made[1]


def _default_config(name: str) -> BreakerConfig:
    return BreakerConfig(name=name)


def _step_tools(ctx: Any) -> Any:
    """The step attempt's tools behind a step context (None outside a step run by an Orchestrator)."""
    if ctx is None or not hasattr(ctx, "tools"):
        return None
    try:
        return ctx.tools
    except RuntimeError:  # a context outside an Orchestrator: no engine breakers
        return None


def _box(ctx: Any) -> Any:
    """The Orchestrator's ToolBox behind a step context (None outside a step)."""
    step_tools = _step_tools(ctx)
    return step_tools.box if step_tools is not None else None


def _messages(messages: str | Sequence[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Messages as plain JSON, and which of them came from a prompt template."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, Sequence):
        raise TypeError(f"llm.chat: messages must be a list of {{'role', 'content'}} dicts or a string, "
                        f"got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    prompts: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if isinstance(message, str):  # a bare (rendered) prompt is a user message
            message = {"role": "user", "content": message}
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise TypeError(f"llm.chat: message {i} must be a dict with a 'role', got {message!r:.200}")
        content = message.get("content")
        if isinstance(content, RenderedPrompt):
            prompts.append({"message": i, **content.describe()})
        out.append({k: (str(v) if isinstance(v, str) else v) for k, v in message.items()})
    return out, prompts
