"""Tool calls over HTTP on httpx: idempotency keys, a journal record per request, error mapping,
and the circuit breaker, for sync (``HttpTool``) and async (``AsyncHttpTool``) steps.

Per request, in this order:

1. build the request; ``idempotency_key()`` is asked for a key and, when it gives one, it is sent
   as ``Idempotency-Key`` (an explicit header from the caller wins);
2. ``before(name)`` on the breaker, which may raise ``CircuitOpenError`` (the call then never
   leaves the process; it is still journaled, with ``"sent": false``);
3. send, then map the outcome at this boundary. Nothing from httpx leaks except the ``Response``
   on success (the error is raised ``from None``: a traceback chained to httpx's exception could
   carry the raw URL, with its secrets, into a log);

   - connect error, timeout, connection dropped: ``RetryableToolError``
   - 429: ``RetryableToolError`` with ``retry_after`` from ``Retry-After`` (seconds or HTTP date)
   - 5xx: ``RetryableToolError`` (with ``retry_after`` if the server sent one)
   - 401 / 403: ``PermanentToolError`` whose message says authentication failed
   - other 4xx, an invalid URL, too many redirects: ``PermanentToolError``

4. ``after(name, ok)`` on the breaker: a retryable failure counts against it; a success *and* a
   permanent error count as successes, because the server answered and the fault is the
   caller's (a 404 must not trip the breaker for everybody);
5. ``journal(record)`` with the redacted record (always, even when step 4 raised).

The journal record (JSON-able; every string in it has been through the ``Redactor``)::

    {"type": "http", "tool": breaker name, "method", "url", "status": int | None, "ms", "attempt",
     "idempotency_key", "sent": bool, "request": {"headers", "body"}, "response": {"headers", "body"} | None,
     "error": {"type", "message", "retry_after"?} | None}

where a body is ``None`` (empty) or ``{"text", "size": full bytes, "truncated": bool}``, its text
cut to ``max_body`` bytes and ending in ``…[truncated: N bytes total]`` when cut. ``attempt`` is
``attempt()`` if given, else how many times this tool has sent that idempotency key.

A credential the request sent never comes back in the record, a durable call's journaled
response or an error's message, even where the server echoes it ("bad key KEY", in a body, a
header or a redirect's URL): the values of the request's sensitive headers
(``Redactor.credentials``: ``Bearer KEY`` gives ``KEY`` too) and the tool's own ``secrets=`` (a
model client's API key) are replaced exactly, before the text is redacted and before it is cut.
This is asked only on the way to an error or a record, never on a plain success.

The breaker is named per host (``host`` or ``host:port``) unless the tool or the call names one
(``breaker="payments"``). It is given as a pair ``(before, after)`` of callables taking the name;
``StoreBreakers.hooks(...)`` builds that pair over the shared store.
"""

from __future__ import annotations

import email.utils
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterable
from datetime import timezone
from typing import TYPE_CHECKING, Any

import httpx

from orchestrator.engine.services import NotJournaled
from orchestrator.payload.redact import MIN_SCRUB, Redactor
from orchestrator.tools.clients import DEFAULT_TIMEOUT, client_options
from orchestrator.errors import CircuitOpenError, PermanentToolError, RetryableToolError, ToolError

if TYPE_CHECKING:
    from orchestrator.tools.breakers import AsyncGate

__all__ = ["HttpTool", "AsyncHttpTool", "DirectReply", "HttpVerbs", "parse_retry_after"]

BreakerHooks = tuple[Callable[[str], Any], Callable[[str, bool], Any]]
_SEND_OPTIONS = ("auth", "follow_redirects")  # client.send() options; the rest build the request
_SNIPPET = 200  # characters of a failed response's body quoted in the error message


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds or an HTTP date (None if neither)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)  # HTTP dates are GMT
    return max(0.0, when.timestamp() - now)


def _raw(headers: httpx.Headers) -> list[tuple[str, str]]:
    # As sent and received (httpx's items() lower-cases names; the audit should show them as they were).
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.raw]


def _breaker_name(url: httpx.URL) -> str:
    return f"{url.host}:{url.port}" if url.port else url.host


class HttpVerbs:
    """``get``/``post``/``put``/``patch``/``delete`` over ``self.request``, as in httpx. For an async
    tool they return ``request``'s awaitable, so ``await tool.get(url)`` works the same."""

    request: Any

    def get(self, url: Any, **kwargs: Any) -> Any:
        return self.request("GET", url, **kwargs)

    def post(self, url: Any, **kwargs: Any) -> Any:
        return self.request("POST", url, **kwargs)

    def put(self, url: Any, **kwargs: Any) -> Any:
        return self.request("PUT", url, **kwargs)

    def patch(self, url: Any, **kwargs: Any) -> Any:
        return self.request("PATCH", url, **kwargs)

    def delete(self, url: Any, **kwargs: Any) -> Any:
        return self.request("DELETE", url, **kwargs)


class _Base:
    def __init__(self, *, journal: Callable[[dict[str, Any]], Any] | None = None,
                 idempotency_key: Callable[[], str | None] | None = None,
                 breaker: BreakerHooks | None = None, breaker_name: str | None = None,
                 redactor: Redactor | None = None, max_body: int = 8192,
                 attempt: Callable[[], int] | None = None, clock: Callable[[], float] = time.time,
                 durable: Any = None, before_send: Callable[[], None] | None = None,
                 secrets: Iterable[str] = ()) -> None:
        if breaker is not None and not (isinstance(breaker, tuple) and len(breaker) == 2
                                        and all(callable(f) for f in breaker)):
            raise TypeError(f"breaker must be a (before(name), after(name, ok)) pair of callables, got {breaker!r}")
        if not isinstance(max_body, int) or max_body < 0:
            raise ValueError(f"max_body must be an integer >= 0 (bytes), got {max_body!r}")
        self._journal = journal
        self._key = idempotency_key
        self._breaker = breaker
        self.breaker_name = breaker_name
        self.redactor = redactor or Redactor()
        self.max_body = max_body
        self._attempt = attempt
        self._clock = clock
        self._durable = durable
        self._before_send = before_send  # raises to stop a request from leaving (an abandoned attempt)
        # Values this tool sends that must never come back in what it journals or raises (a model
        # client's API key); the request's own sensitive header values are added per request.
        self._secrets = tuple(v for v in secrets if isinstance(v, str) and len(v) >= MIN_SCRUB)
        self._sends: dict[str, int] = {}  # sends per idempotency key: the attempt number by default
        self._lock = threading.Lock()

    # -- before sending ---------------------------------------------------------------------------

    def _build(self, client: httpx.Client | httpx.AsyncClient, method: str, url: Any,
               kwargs: dict[str, Any], breaker: str | None) -> tuple[httpx.Request, dict[str, Any], str, str | None]:
        send = {k: kwargs.pop(k) for k in _SEND_OPTIONS if k in kwargs}
        try:
            request = client.build_request(method, url, **kwargs)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            shown = self.redactor.url(str(url))
            raise PermanentToolError(f"{method.upper()} {shown}: invalid URL ({self.redactor.text(str(exc))})",
                                     tool=breaker or self.breaker_name) from None
        if request.url.scheme not in ("http", "https") or not request.url.host:
            # Refused here, before the breaker: a malformed URL says nothing about any server's health.
            raise PermanentToolError(f"{method.upper()} {self.redactor.url(str(url))}: not an http(s) URL with a host",
                                     tool=breaker or self.breaker_name)
        key = self._key() if self._key is not None else None
        if key and "idempotency-key" not in request.headers:
            request.headers["Idempotency-Key"] = key
        name = breaker or self.breaker_name or _breaker_name(request.url)
        return request, send, name, key

    def _attempt_number(self, key: str | None) -> int:
        if self._attempt is not None:
            return self._attempt()
        if key is None:
            return 1
        with self._lock:
            self._sends[key] = self._sends.get(key, 0) + 1
            return self._sends[key]

    # -- mapping the outcome ------------------------------------------------------------------

    def _where(self, request: httpx.Request) -> str:
        return f"{request.method} {self.redactor.url(str(request.url))}"

    def _sent(self, request: httpx.Request) -> tuple[str, ...]:
        """The secrets ``request`` carries (its sensitive headers' values, this tool's own), which a
        server may echo: scrubbed from anything made of what it answered. (Asked only on the way to
        an error or a journal record.)"""
        sent = self.redactor.credentials(_raw(request.headers))
        return tuple(sorted({*sent, *self._secrets}, key=len, reverse=True)) if self._secrets else sent

    def _error_for_exception(self, exc: Exception, request: httpx.Request, name: str) -> ToolError:
        where = self._where(request)
        cause = self.redactor.text(self.redactor.scrub(str(exc), self._sent(request))) or type(exc).__name__
        timeouts = request.extensions.get("timeout", {})
        if isinstance(exc, httpx.ConnectTimeout):
            return RetryableToolError(f"{where}: connecting timed out after {timeouts.get('connect')}s", tool=name)
        if isinstance(exc, httpx.ReadTimeout):
            return RetryableToolError(f"{where}: no response within {timeouts.get('read')}s (read timeout)", tool=name)
        if isinstance(exc, httpx.TimeoutException):
            return RetryableToolError(f"{where}: timed out ({type(exc).__name__}: {cause})", tool=name)
        if isinstance(exc, httpx.ConnectError):
            return RetryableToolError(f"{where}: cannot connect to {request.url.netloc.decode()} ({cause})", tool=name)
        if isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError)):
            # The request may have reached the server: retrying is safe only with the idempotency key.
            return RetryableToolError(f"{where}: connection failed mid-request ({type(exc).__name__}: {cause})",
                                      tool=name)
        if isinstance(exc, httpx.TooManyRedirects):
            return PermanentToolError(f"{where}: too many redirects", tool=name)
        return PermanentToolError(f"{where}: {type(exc).__name__}: {cause}", tool=name)

    def _error_for_response(self, response: httpx.Response, request: httpx.Request, name: str) -> ToolError | None:
        status = response.status_code
        if status < 400:
            return None
        where = self._where(request)
        phrase = f"{status} {response.reason_phrase}".strip()
        # What the server said, without what was sent (a key it echoes: "bad key KEY"), redacted,
        # and only then cut: a secret cut short of its pattern would leak its prefix.
        said = self.redactor.scrub(self._decode(response.content) or "", self._sent(request))
        snippet = self.redactor.body(said, response.headers.get("content-type"))
        detail = f": {snippet[:_SNIPPET]}" if snippet else ""
        if status == 429 or status >= 500:
            retry_after = parse_retry_after(response.headers.get("retry-after"), self._clock())
            wait = f" (retry after {retry_after:g}s)" if retry_after is not None else ""
            return RetryableToolError(f"{where} -> {phrase}{wait}{detail}", tool=name, status=status,
                                      retry_after=retry_after)
        if status in (401, 403):
            what = "authentication failed" if status == 401 else "not authorised (forbidden)"
            return PermanentToolError(
                f"{where} -> {phrase}: {what}; check the credentials for {request.url.host}{detail}",
                tool=name, status=status)
        return PermanentToolError(f"{where} -> {phrase}{detail}", tool=name, status=status)

    # -- the journal record -------------------------------------------------------------------

    @staticmethod
    def _decode(content: bytes) -> str | None:
        try:
            return content.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _body(self, content: bytes | None, content_type: str | None,
              sent: tuple[str, ...] = ()) -> dict[str, Any] | None:
        if not content:
            return None
        size = len(content)
        text = self._decode(content)
        if text is None:
            return {"text": f"[binary: {size} bytes]", "size": size, "truncated": False}
        # Scrub and redact first, then cut: a secret cut short of its pattern would leak its prefix.
        clean = self.redactor.body(self.redactor.scrub(text, sent), content_type).encode("utf-8")
        if len(clean) <= self.max_body:
            return {"text": clean.decode("utf-8"), "size": size, "truncated": False}
        cut = clean[: self.max_body].decode("utf-8", errors="ignore")
        return {"text": f"{cut}…[truncated: {size} bytes total]", "size": size, "truncated": True}

    def _request_body(self, request: httpx.Request, secrets: tuple[str, ...]) -> dict[str, Any] | None:
        try:
            content = request.content
        except httpx.RequestNotRead:
            return {"text": "[streamed body not recorded]", "size": None, "truncated": False}
        return self._body(content, request.headers.get("content-type"), secrets)

    def _record(self, request: httpx.Request, name: str, key: str | None, attempt: int, started: float,
                response: httpx.Response | None, error: BaseException | None, sent: bool) -> dict[str, Any]:
        secrets = self._sent(request)
        record: dict[str, Any] = {
            "type": "http",
            "tool": name,
            "method": request.method,
            "url": self.redactor.url(str(request.url)),
            "status": response.status_code if response is not None else None,
            "ms": round((time.perf_counter() - started) * 1000, 2),
            "attempt": attempt,
            # the key the request carried: the caller's own header when it gave one (it wins), else ours
            "idempotency_key": request.headers.get("idempotency-key", key),
            "sent": sent,
            "request": {"headers": self.redactor.headers(_raw(request.headers)),
                        "body": self._request_body(request, secrets)},
            "response": None,
            "error": None,
        }
        if response is not None:
            headers = _raw(response.headers)
            if secrets:
                headers = [(k, self.redactor.scrub(v, secrets)) for k, v in headers]
            record["response"] = {
                "headers": self.redactor.headers(headers),
                "body": self._body(response.content, response.headers.get("content-type"), secrets),
            }
        if error is not None:
            record["error"] = {"type": type(error).__name__,
                               "message": self.redactor.text(self.redactor.scrub(str(error), secrets))}
            if isinstance(error, RetryableToolError) and error.retry_after is not None:
                record["error"]["retry_after"] = error.retry_after
        return record


class HttpTool(HttpVerbs, _Base):
    """Synchronous HTTP tool calls; methods mirror httpx and return the ``httpx.Response``."""

    def __init__(self, *, client: httpx.Client | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._owns_client = client is None
        self.client = client if client is not None else httpx.Client(**client_options(DEFAULT_TIMEOUT))

    def request(self, method: str, url: Any, *, breaker: str | None = None, **kwargs: Any) -> httpx.Response:
        if self._durable is None:
            return self._send(method, url, breaker, kwargs)

        def perform() -> dict[str, Any]:
            return _durable_record(self._send(method, url, breaker, dict(kwargs)), self)

        try:
            record = self._durable.durable_call("http", _request_key(method, url, kwargs, breaker, self.redactor),
                                                perform)
        except _TooBig as big:
            return big.response
        return _replayed(method, record)

    def _send(self, method: str, url: Any, breaker: str | None, kwargs: dict[str, Any]) -> httpx.Response:
        request, send, name, key = self._build(self.client, method, url, kwargs, breaker)
        attempt, started = self._attempt_number(key), time.perf_counter()
        if self._breaker is not None:
            try:
                self._breaker[0](name)
            except CircuitOpenError as exc:
                self._emit(self._record(request, name, key, attempt, started, None, exc, sent=False))
                raise
        response: httpx.Response | None = None
        if self._before_send is not None:
            self._before_send()
        try:
            response = self.client.send(request, **send)
        except httpx.HTTPError as exc:
            error: ToolError | None = self._error_for_exception(exc, request, name)
        except BaseException as exc:  # not the tool's fault (e.g. interrupted): journal, do not judge
            self._emit(self._record(request, name, key, attempt, started, None, exc, sent=True))
            raise
        else:
            error = self._error_for_response(response, request, name)
        # Without a journal (a model client's own requests) no record is made: redacting both bodies
        # and both header sets would be most of the tool's work, thrown away.
        record = self._record(request, name, key, attempt, started, response, error, sent=True) \
            if self._journal is not None else None
        try:
            if self._breaker is not None:
                self._breaker[1](name, not isinstance(error, RetryableToolError))
        finally:
            self._emit(record)
        if error is not None:
            raise error from None
        assert response is not None
        return response

    def _emit(self, record: dict[str, Any] | None) -> None:
        if self._journal is not None and record is not None:
            self._journal(record)

    def close(self) -> None:
        """Close the client if this tool created it (a client passed in belongs to the caller)."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> HttpTool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()




class AsyncHttpTool(HttpVerbs, _Base):
    """Asynchronous twin of ``HttpTool``; breaker hooks and ``journal`` may be sync or async."""

    def __init__(self, *, client: httpx.AsyncClient | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._owns_client = client is None
        self.client = client if client is not None else httpx.AsyncClient(**client_options(DEFAULT_TIMEOUT))

    async def request(self, method: str, url: Any, *, breaker: str | None = None, **kwargs: Any) -> httpx.Response:
        if self._durable is None:
            return await self._send(method, url, breaker, kwargs)

        async def perform() -> dict[str, Any]:
            return _durable_record(await self._send(method, url, breaker, dict(kwargs)), self)

        try:
            record = await self._durable.adurable_call(
                "http", _request_key(method, url, kwargs, breaker, self.redactor), perform)
        except _TooBig as big:
            return big.response
        return _replayed(method, record)

    async def _send(self, method: str, url: Any, breaker: str | None, kwargs: dict[str, Any]) -> httpx.Response:
        request, send, name, key = self._build(self.client, method, url, kwargs, breaker)
        attempt, started = self._attempt_number(key), time.perf_counter()
        if self._breaker is not None:
            try:
                admitted = self._breaker[0](name)
                if inspect.isawaitable(admitted):
                    await admitted
            except CircuitOpenError as exc:
                await self._emit(self._record(request, name, key, attempt, started, None, exc, sent=False))
                raise
        response: httpx.Response | None = None
        if self._before_send is not None:
            self._before_send()
        try:
            response = await self.client.send(request, **send)
        except httpx.HTTPError as exc:
            error: ToolError | None = self._error_for_exception(exc, request, name)
        except BaseException as exc:  # cancelled or interrupted: journal, do not judge the tool
            await self._emit(self._record(request, name, key, attempt, started, None, exc, sent=True))
            raise
        else:
            error = self._error_for_response(response, request, name)
        record = self._record(request, name, key, attempt, started, response, error, sent=True) \
            if self._journal is not None else None  # (see HttpTool._send)
        try:
            if self._breaker is not None:
                settled = self._breaker[1](name, not isinstance(error, RetryableToolError))
                if inspect.isawaitable(settled):
                    await settled
        finally:
            await self._emit(record)
        if error is not None:
            raise error from None
        assert response is not None
        return response

    async def post_direct(self, wire: Any, url: httpx.URL, headers: list[tuple[bytes, bytes]], content: bytes,
                          timeout: httpx.Timeout, *, gate: AsyncGate | None = None,
                          head: bytes | None = None) -> DirectReply:
        """POST ``content`` to ``url`` through ``wire`` (``orchestrator.tools.wire.WireTransport``)
        without the client's layer, for a tool that journals nothing and sends no key of its own
        (``AsyncLLM``'s): the breaker, ``before_send`` and the error mapping are ``request``'s.

        ``gate`` (``StoreBreakers.gate``) is this call's breaker, for a tool that many calls share:
        it stands in for the tool's own breaker hooks. ``head``: ``wire.head(b"POST", url, headers)``,
        for a caller that made it once."""
        if self._journal is not None or self._key is not None or self._durable is not None:
            raise RuntimeError("post_direct is for a tool without a journal, idempotency keys or durable calls")
        name = self.breaker_name or _breaker_name(url)
        hooks = self._breaker
        if gate is not None:
            admitted = gate.admit(name)
        elif hooks is not None:
            admitted = hooks[0](name)
        else:
            admitted = None
        if admitted is not None and inspect.isawaitable(admitted):
            await admitted
        if self._before_send is not None:
            self._before_send()
        limits = timeout.as_dict()
        reply: DirectReply | None = None
        error: ToolError | None = None
        try:
            status, reason, raw, body = await wire.exchange(b"POST", url, headers, content, limits, head)
        except httpx.HTTPError as exc:
            error = self._error_for_exception(exc, _direct_request(url, headers, content, limits), name)
        else:
            reply = DirectReply(status, reason, raw, body)
            if status >= 400:
                error = self._error_for_response(reply.response(), _direct_request(url, headers, content, limits),
                                                 name)
        ok = not isinstance(error, RetryableToolError)
        settled = gate.settle(name, ok) if gate is not None else hooks[1](name, ok) if hooks is not None else None
        if settled is not None and inspect.isawaitable(settled):
            await settled
        if error is not None:
            raise error from None
        assert reply is not None
        return reply

    async def _emit(self, record: dict[str, Any] | None) -> None:
        if self._journal is not None and record is not None:
            emitted = self._journal(record)
            if inspect.isawaitable(emitted):
                await emitted

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> AsyncHttpTool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class DirectReply:
    """A response read by ``AsyncHttpTool.post_direct``: ``status_code`` and ``content`` (decoded
    as httpx decodes it when the server compressed it); ``response()`` is it as an httpx.Response."""

    __slots__ = ("_raw", "content", "reason", "status_code")

    def __init__(self, status: int, reason: bytes, raw: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status_code, self.reason = status, reason
        if any(name.lower() == b"content-encoding" for name, _ in raw):
            self.content = httpx.Response(status, headers=raw, content=body).content  # httpx's decoders
            raw = [(n, v) for n, v in raw if n.lower() not in (b"content-encoding", b"content-length")]
        else:
            self.content = body
        self._raw = raw

    def response(self) -> httpx.Response:
        return httpx.Response(self.status_code, headers=self._raw, content=self.content,
                              extensions={"reason_phrase": self.reason, "http_version": b"HTTP/1.1"})


# -- durable requests -------------------------------------------------------------------------------
# With ``durable`` (a step's durable calls: ``ctx.http`` inside a step), request ``i`` of a step
# execution is a durable call: its response is journaled (``CallCompleted``, kind ``http``) the
# moment it arrives, and when the step runs again (a retry, a recovery) request ``i`` with the same
# method, URL and body returns the journaled response instead of being sent again. Under replay the
# responses come from the cassette. A failed request is not journaled as completed: running the
# step again sends it again, with the same idempotency key. A response body larger than
# ``MAX_DURABLE_BODY`` is returned live and not journaled at all (``NotJournaled``): a step that runs
# again sends that request again, with the same key, and the requests after it keep their numbers.
#
# Both the request key and the journaled response are redacted by the tool's redactor here (the
# journal redacts them again, with the same rules): a query value or a URL's userinfo password in
# the request key, the response's final URL (a redirect may add a token to it) and headers
# (``Set-Cookie``) never reach the journal. The step gets the journaled response, redactions and
# all, on its first run as on a resume: what it sees does not depend on whether it crashed.

MAX_DURABLE_BODY = 1 << 20  # 1 MiB of response text kept for resume and replay


def _request_key(method: str, url: Any, kwargs: dict[str, Any], breaker: str | None,
                 redactor: Redactor) -> dict[str, Any]:
    """What identifies a request for reuse: not its headers (secrets, tracing ids), its body; redacted."""
    key: dict[str, Any] = {"method": method.upper(), "url": redactor.url(str(url))}
    for name in ("params", "json", "data"):
        value = kwargs.get(name)
        if value is not None:
            if name != "json" and isinstance(value, (str, bytes)):  # a raw query string or form body
                value = redactor.query(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
            elif name != "json" and isinstance(value, (list, tuple)):  # (name, value) pairs
                value = [[k, redactor.replacement if redactor.is_sensitive_query(str(k)) else v] for k, v in value]
            elif isinstance(value, dict) and name != "json":
                value = {k: redactor.replacement if redactor.is_sensitive_query(str(k)) else v for k, v in value.items()}
            key[name] = value
    content = kwargs.get("content")
    if content is not None:
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
        key["content"] = redactor.body(text)
    if breaker:
        key["breaker"] = breaker
    return key


class _TooBig(NotJournaled):
    """Carries a response too large to journal whole out of ``perform``: the step gets it live, the
    journal holds no call for it, and a step that runs again sends the request again (same key)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response, "response too large to journal")

    @property
    def response(self) -> httpx.Response:
        return self.value


def _durable_record(response: httpx.Response, tool: _Base) -> dict[str, Any]:
    text = response.text
    if len(text) > MAX_DURABLE_BODY:
        raise _TooBig(response)
    redactor = tool.redactor
    # The body is left to the journal's redaction (fields and patterns): a response a step parses
    # must keep its shape, and that redaction keeps it. A credential the request sent and the
    # server echoed is in no form a rule knows: it is replaced here, where it is known.
    headers, url = dict(response.headers), str(response.url)
    secrets = tool._sent(response.request)
    if secrets:
        text, url = redactor.scrub(text, secrets), redactor.scrub(url, secrets)
        headers = redactor.scrub(headers, secrets)
    return {"status": response.status_code, "headers": redactor.headers(headers),
            "url": redactor.url(url), "text": text}


def _replayed(method: str, record: dict[str, Any]) -> httpx.Response:
    headers = {k: v for k, v in record.get("headers", {}).items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")}
    return httpx.Response(record["status"], headers=headers, content=record.get("text", "").encode("utf-8"),
                          request=httpx.Request(method.upper(), record.get("url") or "http://replayed.invalid/"))


def _direct_request(url: httpx.URL, headers: list[tuple[bytes, bytes]], content: bytes,
                    limits: dict[str, Any]) -> httpx.Request:
    """``post_direct``'s request as httpx would have built it, for an error's message (only a
    failure needs it)."""
    return httpx.Request("POST", url, headers=headers, content=content, extensions={"timeout": limits})
