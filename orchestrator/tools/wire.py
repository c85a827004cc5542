"""HTTP/1.1 for the shared async client: keep-alive connections on asyncio, responses parsed by httptools.

httpx's own async transport (httpcore over anyio) spends about a millisecond of CPU per request
when a thousand requests are in flight: its pool scans every connection for every request, and
each read and write goes through several layers of task-group and cancel-scope bookkeeping. An
agent service makes exactly that many model calls at once, so the shared ``httpx.AsyncClient``
(``orchestrator.tools.clients``) sends through ``WireTransport`` instead:

- one ``asyncio.Protocol`` per connection, its bytes parsed by httptools (the llhttp parser);
- per origin (scheme, host, port) a stack of idle kept-alive connections; taking one and giving
  it back are O(1), and there is no cap on connections (N calls at once make N connections);
- an idle connection the server closed is noticed when the close arrives and never handed out;
  one that stays idle longer than ``keepalive_expiry`` is closed when next looked at;
- timeouts as httpx defines them: ``connect`` for opening the connection (and TLS), ``read`` for
  the longest silence while a response is awaited or read;
- errors are httpx's (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``,
  ``RemoteProtocolError``, ``LocalProtocolError``), so everything above the transport (the
  HttpTool's error mapping, retries, breakers) reads them as it reads httpcore's;
- a response body is streamed to httpx as it arrives; reading stops while more than
  ``HIGH_WATER`` bytes wait unread, so ``client.stream()`` stays a stream.

Requests it does not send itself go to httpx's own transport (``fallback``): ``HEAD`` (the parser
cannot be told that a response to it has no body), a body of unknown length (a streamed upload,
sent chunked), a request that asks for ``Upgrade`` or ``Expect: 100-continue``, and any scheme
other than http and https. Proxies configured through the environment are httpx's mounts, above
any transport.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import ssl
from collections.abc import AsyncIterator

import httptools
import httpx

__all__ = ["WireTransport", "HIGH_WATER"]

#: unread response bytes above which a connection stops reading until the caller catches up
HIGH_WATER = 256 * 1024
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110 token)
_NO_BODY_LENGTH = frozenset({b"content-length", b"transfer-encoding"})


class _Conn(asyncio.Protocol):
    """One connection, one exchange at a time. Callbacks come from asyncio and from the parser."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.busy = False
        self.idle_since = 0.0
        self._new_exchange()

    def _new_exchange(self) -> None:
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.head_done = False
        self.interim = False
        self.complete = False
        self.reusable = False
        self.close_delimited = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.streamed = True
        self.last = 0.0
        self.read_timeout: float | None = None
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio's callbacks -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.complete:  # bytes nobody asked for: the connection cannot be trusted
            self.closed = True
            self.transport.close()  # type: ignore[union-attr]
            return
        self.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the server switched protocols, which was not asked for"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response ({exc})"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.busy or self.complete or self.error is not None:
            return
        if self.head_done and self.close_delimited and exc is None:
            self.complete = True  # a body without a length ends with the connection
            self._settle()
        elif isinstance(exc, OSError):
            self._fail(httpx.ReadError(str(exc) or type(exc).__name__))
        elif self.head_done:
            self._fail(httpx.RemoteProtocolError("peer closed connection without sending complete message body"))
        else:
            self._fail(httpx.RemoteProtocolError("Server disconnected without sending a response."))

    # -- the parser's callbacks -------------------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # an interim response (100 Continue, 103 Early Hints): the real one follows
            self.interim = True
            self.headers, self.reason = [], b""
            return
        self.status = status
        self.head_done = True
        if status not in (204, 304):
            names = {name.lower() for name, _ in self.headers}
            self.close_delimited = not (names & _NO_BODY_LENGTH) or (
                b"transfer-encoding" in names and not self._chunked())
        self._wake()

    def _chunked(self) -> bool:
        values = [v for n, v in self.headers if n.lower() == b"transfer-encoding"]
        return bool(values) and values[-1].rsplit(b",", 1)[-1].strip().lower() == b"chunked"

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.streamed and self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.complete = True
        self.reusable = self.parser.should_keep_alive() and not self.close_delimited
        self._settle()

    # -- the exchange -----------------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _settle(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._wake()

    def _fail(self, error: Exception) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self._settle()

    def _watch(self) -> None:
        """The read timeout: fires after ``read_timeout`` seconds without a byte, unless paused."""
        self.timer = None
        if self.complete or self.error is not None or self.read_timeout is None:
            return
        quiet = self.loop.time() - self.last
        if self.paused or quiet < self.read_timeout:
            wait = self.read_timeout if self.paused else self.read_timeout - quiet
            self.timer = self.loop.call_later(wait, self._watch)
            return
        self._fail(httpx.ReadTimeout(f"no data within the read timeout ({self.read_timeout}s)"))

    def send(self, head: bytes, body: bytes, read_timeout: float | None, *, streamed: bool = True) -> None:
        self._new_exchange()
        self.busy = True
        self.streamed = streamed  # a caller that reads the body as it comes: pause when it lags
        self.read_timeout = read_timeout
        self.last = self.loop.time()
        if read_timeout is not None:
            self.timer = self.loop.call_later(read_timeout, self._watch)
        self.transport.writelines((head, body))  # type: ignore[union-attr]

    async def wait(self) -> None:
        """Until something changed (head, body, end, error)."""
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    async def head(self) -> None:
        while not self.head_done and self.error is None:
            await self.wait()
        if self.error is not None:
            raise self.error

    def take(self) -> bytes:
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks, self.buffered = [], 0
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return data

    def abort(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()


class _Body(httpx.AsyncByteStream):
    """A response body as it arrives; closing it gives a finished, reusable connection back."""

    def __init__(self, conn: _Conn, owner: WireTransport, key: tuple[str, str, int]) -> None:
        self._conn: _Conn | None = conn
        self._owner = owner
        self._key = key

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                return
            await conn.wait()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._owner._release(self._key, conn)


class WireTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` over ``_Conn`` connections (see the module docstring)."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, keepalive_expiry: float = 30.0,
                 fallback: httpx.AsyncBaseTransport | None = None) -> None:
        if isinstance(verify, ssl.SSLContext):
            self._ssl = verify
        else:
            self._ssl = httpx.create_ssl_context(verify=verify)
        self._expiry = keepalive_expiry
        self._fallback = fallback if fallback is not None else httpx.AsyncHTTPTransport(verify=self._ssl)
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._closed = False

    @staticmethod
    def _ours(request: httpx.Request) -> bool:
        return (request.method != "HEAD" and request.url.scheme in ("http", "https")
                and isinstance(request.stream, httpx.ByteStream)
                and "upgrade" not in request.headers and "expect" not in request.headers)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self._ours(request):
            return await self._fallback.handle_async_request(request)
        key = _origin(request.url)
        try:
            head = _head(request.method.encode("ascii"), request.url.raw_path, request.headers.raw)
        except httpx.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from None
        conn = await self._open(key, head, request.content, request.extensions.get("timeout") or {}, streamed=True)
        try:
            await conn.head()
        except BaseException:
            self._release(key, conn, broken=True)
            raise
        return httpx.Response(conn.status, headers=conn.headers, stream=_Body(conn, self, key),
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": conn.reason})

    @staticmethod
    def head(method: bytes, url: httpx.URL, headers: list[tuple[bytes, bytes]]) -> bytes:
        """``exchange``'s request line and headers, ``Host`` added and checked, without the
        ``Content-Length`` each request adds: for a caller that sends many requests alike
        (``AsyncLLM``), which makes it once and hands it to ``exchange``."""
        return _head(method, url.raw_path, [(b"Host", url.netloc), *headers], end=False)

    async def exchange(self, method: bytes, url: httpx.URL, headers: list[tuple[bytes, bytes]], content: bytes,
                       timeout: dict[str, float | None],
                       head: bytes | None = None) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        """One request, its whole response read: ``(status, reason, headers, body)``. Without httpx's
        client layer (no cookies, auth flows, redirects or content decoding: the body is as sent),
        for callers that need none of them (``AsyncLLM``). ``headers`` are sent as given, with
        ``Host`` and ``Content-Length`` added (``head``: ``head(method, url, headers)``, made
        before). Errors are httpx's exceptions, without a request."""
        key = _origin(url)
        if head is None:
            head = self.head(method, url, headers)
        head = b"%sContent-Length: %d\r\n\r\n" % (head, len(content))
        conn = await self._open(key, head, content, timeout, streamed=False)
        try:
            while not conn.complete and conn.error is None:
                await conn.wait()
            if conn.error is not None:
                raise conn.error
            body = conn.take()
        except BaseException:
            self._release(key, conn, broken=True)
            raise
        self._release(key, conn)
        return conn.status, conn.reason, conn.headers, body

    async def _open(self, key: tuple[str, str, int], head: bytes, content: bytes,
                    timeouts: dict[str, float | None], *, streamed: bool) -> _Conn:
        """A connection to ``key`` (an idle one, else a new one) with the request written to it."""
        if self._closed:
            raise RuntimeError("the transport is closed")
        conn = await self._take(key, timeouts.get("connect"))
        self._busy.add(conn)
        try:
            conn.send(head, content, timeouts.get("read"), streamed=streamed)
        except BaseException:
            self._release(key, conn, broken=True)
            raise
        return conn

    def _release(self, key: tuple[str, str, int], conn: _Conn, *, broken: bool = False) -> None:
        """The exchange on ``conn`` is over: kept for the next one if it ended cleanly, else closed.
        ``broken``: it was cancelled or failed midway, so its state is unknown: never reused."""
        self._busy.discard(conn)
        conn.busy = False
        if broken or self._closed or conn.closed or not (conn.complete and conn.reusable) or conn.chunks:
            conn.abort()
            return
        conn.idle_since = conn.loop.time()
        self._idle.setdefault(key, []).append(conn)

    async def _take(self, key: tuple[str, str, int], connect_timeout: float | None) -> _Conn:
        idle = self._idle.get(key)
        loop = asyncio.get_running_loop()
        if idle:
            now = loop.time()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < self._expiry:
                    return conn
                conn.abort()
        scheme, host, port = key
        tls = scheme == "https"
        try:
            async with asyncio.timeout(connect_timeout):
                # Connected in an empty context of its own: the connection's callbacks keep the
                # context they were registered in for as long as it lives, and the caller's holds
                # its step (current_step(), the step's context and the run it reaches).
                _, conn = await loop.create_task(loop.create_connection(
                    lambda: _Conn(loop), host, port, ssl=self._ssl if tls else None,
                    server_hostname=host if tls else None), context=contextvars.Context())
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} took longer than {connect_timeout}s") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        return conn  # type: ignore[return-value]

    def connections(self) -> int:
        """Open connections (idle and busy): for tests and diagnostics."""
        return sum(not c.closed for idle in self._idle.values() for c in idle) + len(self._busy)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        for conn in list(self._busy):
            conn.abort()
        self._busy.clear()
        await self._fallback.aclose()


def _head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], *, end: bool = True) -> bytes:
    """The request line and headers (and, with ``end``, the blank line after them), refusing
    anything that would split the request."""
    for name, value in headers:
        if not _TOKEN.fullmatch(name):
            raise httpx.LocalProtocolError(f"invalid header name {name!r}")
        if b"\r" in value or b"\n" in value or b"\0" in value:
            raise httpx.LocalProtocolError(f"invalid value for header {name.decode('latin-1')!r} "
                                           f"(a line break or NUL)")
    if not target.startswith(b"/") or b" " in target or b"\r" in target or b"\n" in target:
        raise httpx.LocalProtocolError(f"invalid request target {target!r}")
    lines = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        lines += (name, b": ", value, b"\r\n")
    if end:
        lines.append(b"\r\n")
    return b"".join(lines)


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    scheme = url.scheme
    return scheme, url.host, url.port or (443 if scheme == "https" else 80)
