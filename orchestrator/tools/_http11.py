"""A lean HTTP/1.1 transport for the shared async client: keep-alive connections on asyncio streams.

httpx's own transport (httpcore over h11 and anyio) costs about a millisecond of CPU per request
when a thousand are in flight: at that concurrency the event loop spends more time in it than in
the engine. This transport does the same job for the requests agents make (a body known in
advance, over http or https, HTTP/1.1 with keep-alive) with asyncio's streams and a few lines of
parsing; anything else (a streamed request body, another scheme) goes to ``fallback``.

What callers see is httpx's: the client still builds requests, follows redirects, decodes
content, and errors are httpx's exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``,
``WriteTimeout``, ``RemoteProtocolError``, ``ReadError``), so ``HttpTool``'s mapping is unchanged.
Timeouts come from the request (``connect``, ``read``, ``write``). A response is read to its end
before it is returned when it says its length and it is small; otherwise its body is streamed from
the connection, which goes back to the pool once the body has been read to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

__all__ = ["Http11Transport"]

_EAGER = 1 << 20  # bodies up to this size (with a Content-Length) are read before returning
_HEAD_LIMIT = 1 << 16  # bytes of a response's status line and headers
_NO_BODY = frozenset({204, 304})


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing() or now - self.idle_since > expiry)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a connection that cannot even be closed is gone anyway
            self.writer.close()


def _timeout(request: httpx.Request, which: str) -> float | None:
    return (request.extensions.get("timeout") or {}).get(which)


class Http11Transport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over asyncio streams (see the module docstring); ``fallback`` takes what
    this transport does not do."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, fallback: httpx.AsyncBaseTransport,
                 keepalive_expiry: float = 30.0) -> None:
        if isinstance(verify, ssl.SSLContext):
            self._ssl: ssl.SSLContext = verify
        elif verify:
            self._ssl = ssl.create_default_context()
        else:
            self._ssl = ssl.create_default_context()
            self._ssl.check_hostname = False
            self._ssl.verify_mode = ssl.CERT_NONE
        self._fallback = fallback
        self._expiry = keepalive_expiry
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._closed = False

    # -- connections ------------------------------------------------------------------------------
    async def _connect(self, request: httpx.Request, origin: tuple[str, str, int]) -> tuple[_Conn, bool]:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now, self._expiry):
                return conn, True
            conn.close()
        scheme, host, port = origin
        try:
            async with asyncio.timeout(_timeout(request, "connect")):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self._ssl if scheme == "https" else None,
                    server_hostname=host if scheme == "https" else None, limit=_HEAD_LIMIT)
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out connecting", request=request) from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
        return _Conn(reader, writer), False

    def _release(self, origin: tuple[str, str, int], conn: _Conn, reusable: bool) -> None:
        if not reusable or self._closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(origin, []).append(conn)

    # -- one request ----------------------------------------------------------------------------------
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https") or not isinstance(request.stream, httpx.ByteStream):
            return await self._fallback.handle_async_request(request)
        if self._closed:
            raise RuntimeError("the transport is closed")
        port = url.port or (443 if url.scheme == "https" else 80)
        origin = (url.scheme, url.host, port)
        body = request.content
        head = [f"{request.method} ".encode("ascii"), url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        conn, _reused = await self._connect(request, origin)
        try:
            return await self._exchange(request, origin, conn, b"".join(head) + body)
        except BaseException:
            conn.close()
            raise

    async def _exchange(self, request: httpx.Request, origin: tuple[str, str, int], conn: _Conn,
                        data: bytes) -> httpx.Response:
        try:
            conn.writer.write(data)
            async with asyncio.timeout(_timeout(request, "write")):
                await conn.writer.drain()
        except TimeoutError:
            raise httpx.WriteTimeout("timed out sending the request", request=request) from None
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from None
        read_timeout = _timeout(request, "read")
        while True:
            status, reason, headers, version = await self._read_head(request, conn, read_timeout)
            if not (100 <= status < 200) or status == 101:
                break
        keep = version == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad Content-Length {value!r}", request=request) from None
            elif lower == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif lower == b"connection":
                tokens = value.lower()
                keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
        if request.headers.get("connection", "").lower() == "close":
            keep = False
        extensions = {"http_version": version, "reason_phrase": reason}
        if request.method == "HEAD" or status in _NO_BODY or status == 101:
            self._release(origin, conn, keep and status != 101)
            return httpx.Response(status, headers=headers, stream=httpx.ByteStream(b""), extensions=extensions)
        if not chunked and length is not None and length <= _EAGER:
            try:
                async with asyncio.timeout(read_timeout):
                    content = await conn.reader.readexactly(length)
            except TimeoutError:
                raise httpx.ReadTimeout("timed out reading the response body", request=request) from None
            except (asyncio.IncompleteReadError, OSError) as exc:
                raise httpx.ReadError(f"connection lost while reading the body ({exc})", request=request) from None
            self._release(origin, conn, keep)
            return httpx.Response(status, headers=headers, stream=httpx.ByteStream(content), extensions=extensions)
        stream = _Body(self, request, origin, conn, read_timeout, length=None if chunked else length,
                       chunked=chunked, keep=keep and (chunked or length is not None))
        return httpx.Response(status, headers=headers, stream=stream, extensions=extensions)

    @staticmethod
    async def _read_head(request: httpx.Request, conn: _Conn, read_timeout: float | None,
                         ) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        try:
            async with asyncio.timeout(read_timeout):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            raise httpx.ReadTimeout("timed out waiting for the response", request=request) from None
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response." if not exc.partial
                                            else "Server disconnected mid-response.", request=request) from None
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError("response headers too long", request=request) from None
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from None
        lines = raw[:-4].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}", request=request)
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}", request=request)
            headers.append((name.strip(), value.strip()))
        return int(parts[1]), parts[2] if len(parts) > 2 else b"", headers, parts[0]

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()
        await self._fallback.aclose()


class _Body(httpx.AsyncByteStream):
    """A response body streamed from its connection (chunked, long, or delimited by the connection's
    end); the connection goes back to the pool once the body was read to its end."""

    def __init__(self, transport: Http11Transport, request: httpx.Request, origin: tuple[str, str, int],
                 conn: _Conn, read_timeout: float | None, *, length: int | None, chunked: bool, keep: bool) -> None:
        self._transport, self._request, self._origin, self._conn = transport, request, origin, conn
        self._timeout, self._length, self._chunked, self._keep = read_timeout, length, chunked, keep
        self._done = False
        self._settled = False

    async def _read(self, op: Any) -> bytes:
        try:
            async with asyncio.timeout(self._timeout):
                return await op
        except TimeoutError:
            raise httpx.ReadTimeout("timed out reading the response body", request=self._request) from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError) as exc:
            raise httpx.ReadError(f"connection lost while reading the body ({exc})", request=self._request) from None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        if self._chunked:
            while True:
                line = await self._read(reader.readuntil(b"\r\n"))
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad chunk size {line[:50]!r}", request=self._request) from None
                if size == 0:
                    while (await self._read(reader.readuntil(b"\r\n"))) != b"\r\n":
                        pass  # trailers
                    break
                chunk = await self._read(reader.readexactly(size + 2))
                yield chunk[:-2]
        elif self._length is not None:
            left = self._length
            while left:
                chunk = await self._read(reader.read(min(left, 1 << 16)))
                if not chunk:
                    raise httpx.ReadError("connection closed before the end of the body", request=self._request)
                left -= len(chunk)
                yield chunk
        else:
            while chunk := await self._read(reader.read(1 << 16)):
                yield chunk
        self._done = True
        self._settle()

    def _settle(self) -> None:
        if not self._settled:
            self._settled = True
            self._transport._release(self._origin, self._conn, self._keep and self._done)

    async def aclose(self) -> None:
        self._settle()
