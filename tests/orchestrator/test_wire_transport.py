"""The shared async client's transport (orchestrator.tools.wire) against a raw HTTP/1.1 server on
127.0.0.1 that answers with scripted bytes: keep-alive, every way a body can end, interim responses,
servers that hang up or lie, timeouts, refused connections, header injection, streaming, and a
cancelled request. Each test counts the connections the server accepted."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from orchestrator.errors import RetryableToolError
from orchestrator.tools import AsyncHttpTool
from orchestrator.tools.clients import LoopClients
from orchestrator.tools.wire import HIGH_WATER, WireTransport

HANG = 120.0  # seconds: bounds a hang, never a measure of speed
Script = Callable[[int, bytes], Any]  # (request number, request bytes) -> bytes to send, or an action


def ok(body: bytes = b"hello", *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), head.encode(), body)


class RawServer:
    """Reads whole requests (head plus Content-Length body) and writes what ``script`` returns:
    bytes; ``("close", bytes)`` to send then hang up; ``("hold", event)`` to answer nothing until
    the event is set; ``None`` to hang up without a word."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + (await reader.readexactly(length) if length else b"")
                self.requests.append(request)
                answer = self.script(len(self.requests), request)
                if isinstance(answer, tuple) and answer[0] == "hold":
                    await asyncio.wait_for(answer[1].wait(), HANG)
                    return
                if answer is None:
                    return
                close = isinstance(answer, tuple)
                writer.write(answer[1] if close else answer)
                await writer.drain()
                if close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, HANG))


async def client_for(**options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=WireTransport(**options), timeout=httpx.Timeout(HANG))


def test_sequential_requests_share_one_kept_alive_connection():
    async def main() -> tuple[list[bytes], int, list[bytes]]:
        async with RawServer(lambda n, req: ok(b"answer %d" % n)) as server:
            client = await client_for()
            # When three requests are made one after the other
            bodies = [(await client.post(server.url + "/x", json={"n": i})).content for i in range(3)]
            await client.aclose()
            return bodies, server.connections, server.requests

    bodies, connections, requests = run(main())
    # Then they were answered in order over one connection, each request whole
    assert bodies == [b"answer 1", b"answer 2", b"answer 3"] and connections == 1
    assert requests[0].startswith(b"POST /x HTTP/1.1\r\n") and requests[0].endswith(b'{"n":0}')
    assert b"\r\nHost: 127.0.0.1:" in requests[0] and b"\r\nContent-Length: 7\r\n" in requests[0]


def test_a_chunked_body_with_extensions_and_trailers_is_read_whole_and_the_connection_reused():
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n")

    async def main() -> tuple[list[bytes], int]:
        async with RawServer(lambda n, req: chunked) as server:
            client = await client_for()
            bodies = [(await client.get(server.url)).content for _ in range(2)]
            await client.aclose()
            return bodies, server.connections

    assert run(main()) == ([b"hello world"] * 2, 1)


def test_a_body_that_ends_with_the_connection_is_read_whole_and_not_reused():
    async def main() -> tuple[list[bytes], int]:
        async with RawServer(lambda n, req: ("close", b"HTTP/1.1 200 OK\r\n\r\nuntil the end %d" % n)) as server:
            client = await client_for()
            bodies = [(await client.get(server.url)).content for _ in range(2)]
            await client.aclose()
            return bodies, server.connections

    assert run(main()) == ([b"until the end 1", b"until the end 2"], 2)


def test_interim_responses_are_skipped_and_no_body_statuses_keep_the_connection():
    def script(n: int, req: bytes) -> bytes:
        if n == 1:
            return b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + ok(b"final")
        return b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n" if n == 2 else \
            b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"

    async def main() -> tuple[list[tuple[int, bytes]], int]:
        async with RawServer(script) as server:
            client = await client_for()
            out = []
            for _ in range(3):
                response = await client.get(server.url)
                out.append((response.status_code, response.content))
            await client.aclose()
            return out, server.connections

    assert run(main()) == ([(200, b"final"), (204, b""), (304, b"")], 1)


def test_connection_close_and_an_idle_connection_the_server_dropped_get_a_new_connection():
    def script(n: int, req: bytes) -> Any:
        if n == 1:
            return ok(b"one", "Connection: close")
        if n == 2:
            return ("close", ok(b"two"))  # kept-alive by its headers, then dropped while idle
        return ok(b"three")

    async def main() -> tuple[list[bytes], int]:
        async with RawServer(script) as server:
            client = await client_for()
            bodies = [(await client.get(server.url)).content]
            bodies.append((await client.get(server.url)).content)
            await asyncio.sleep(0)  # (the hang-up is delivered by the loop; the pool must not hand it out)
            for _ in range(100):
                if client._transport.connections() == 0:  # type: ignore[attr-defined]
                    break
                await asyncio.sleep(0.01)
            bodies.append((await client.get(server.url)).content)
            await client.aclose()
            return bodies, server.connections

    assert run(main()) == ([b"one", b"two", b"three"], 3)


@pytest.mark.parametrize("answer, message", [
    (None, "Server disconnected without sending a response."),
    (("close", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"), "without sending complete message body"),
    (("close", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"), "without sending complete message body"),
    (b"SMTP ready\r\n\r\n", "invalid HTTP response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", "invalid HTTP response"),
], ids=["no-response", "short-body", "cut-chunk", "not-http", "two-lengths"])
def test_a_server_that_hangs_up_or_lies_is_a_protocol_error_and_a_retryable_tool_error(answer, message):
    async def main() -> tuple[BaseException, BaseException, bytes, int]:
        async with RawServer(lambda n, req: answer if n <= 2 else ok(b"fine")) as server:
            client = await client_for()
            with pytest.raises(httpx.HTTPError) as raw:
                await client.get(server.url + "/a")
            tool = AsyncHttpTool(client=client)
            with pytest.raises(RetryableToolError) as mapped:
                await tool.get(server.url + "/b")
            after = (await client.get(server.url + "/c")).content  # the pool is still good
            await client.aclose()
            return raw.value, mapped.value, after, server.connections

    raw, mapped, after, connections = run(main())
    # Then httpx's own exception says what happened; the tool maps it to "may have been sent, retry"
    assert isinstance(raw, httpx.RemoteProtocolError) and message in str(raw)
    assert "connection failed mid-request" in str(mapped) or "invalid HTTP response" in str(mapped)
    assert after == b"fine" and connections >= 2


def test_silence_longer_than_the_read_timeout_is_a_read_timeout_and_the_connection_is_dropped():
    release = asyncio.Event

    async def main() -> tuple[BaseException, int, bytes]:
        gate = release()
        async with RawServer(lambda n, req: ("hold", gate) if n == 1 else ok(b"later")) as server:
            client = httpx.AsyncClient(transport=WireTransport(), timeout=httpx.Timeout(HANG, read=0.2))
            with pytest.raises(httpx.ReadTimeout) as timed_out:
                await client.get(server.url)
            gate.set()
            later = (await client.get(server.url)).content
            await client.aclose()
            return timed_out.value, server.connections, later

    error, connections, later = run(main())
    assert "read timeout" in str(error) and later == b"later" and connections == 2


def test_a_refused_connection_is_a_connect_error():
    async def main() -> BaseException:
        listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        listener.close()
        await listener.wait_closed()
        client = await client_for()
        with pytest.raises(httpx.ConnectError) as refused:
            await client.get(f"http://127.0.0.1:{port}/")
        await client.aclose()
        return refused.value

    assert run(main())


@pytest.mark.parametrize("headers", [{"X-Evil": "a\r\nInjected: yes"}, {"X-Evil": "a\nb"}])
def test_a_header_value_that_would_split_the_request_is_refused_before_anything_is_sent(headers):
    async def main() -> tuple[BaseException, list[bytes]]:
        async with RawServer(lambda n, req: ok()) as server:
            client = await client_for()
            with pytest.raises(httpx.LocalProtocolError) as refused:
                await client.get(server.url, headers=headers)
            await client.aclose()
            return refused.value, server.requests

    error, requests = run(main())
    assert "X-Evil" in str(error) and requests == []


def test_head_goes_through_httpx_own_transport_and_does_not_wait_for_a_body():
    async def main() -> tuple[int, str, bytes]:
        async with RawServer(lambda n, req: b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n") as server:
            client = await client_for()
            response = await client.head(server.url)
            await client.aclose()
            return response.status_code, response.headers["content-length"], response.content

    assert run(main()) == (200, "1000", b"")


def test_a_large_body_streams_in_pieces_and_the_connection_is_reused_after_it():
    big = bytes(range(256)) * (4 * HIGH_WATER // 256)

    async def main() -> tuple[int, bool, int, bytes]:
        async with RawServer(lambda n, req: ok(big) if n == 1 else ok(b"small")) as server:
            client = await client_for()
            pieces = []
            async with client.stream("GET", server.url) as response:
                async for piece in response.aiter_raw():
                    pieces.append(piece)
                    await asyncio.sleep(0)  # a slow reader: the connection pauses instead of buffering it all
            small = (await client.get(server.url)).content
            await client.aclose()
            return len(pieces), b"".join(pieces) == big, server.connections, small

    count, whole, connections, small = run(main())
    assert count > 1 and whole and connections == 1 and small == b"small"


def test_a_request_cancelled_while_waiting_leaves_no_connection_to_reuse():
    async def main() -> tuple[list[bytes], int]:
        gate = asyncio.Event()
        async with RawServer(lambda n, req: ("hold", gate) if n == 1 else ok(b"fresh")) as server:
            client = await client_for()
            waiting = asyncio.create_task(client.get(server.url))
            while not server.requests:
                await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            fresh = (await client.get(server.url)).content
            gate.set()
            await client.aclose()
            return [fresh], server.connections

    assert run(main()) == ([b"fresh"], 2)


def test_the_direct_exchange_decodes_a_compressed_body_and_maps_errors_like_the_client():
    packed = gzip.compress(json.dumps({"ok": True}).encode())

    def script(n: int, req: bytes) -> bytes:
        if n == 1:
            return ok(packed, "Content-Encoding: gzip")
        return b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy"

    async def main() -> tuple[Any, BaseException, bytes]:
        async with RawServer(script) as server:
            wire = WireTransport()
            tool = AsyncHttpTool(client=httpx.AsyncClient(transport=wire))
            url = httpx.URL(server.url + "/v1/chat")
            headers = [(b"Content-Type", b"application/json")]
            reply = await tool.post_direct(wire, url, headers, b"{}", httpx.Timeout(HANG))
            with pytest.raises(RetryableToolError) as busy:
                await tool.post_direct(wire, url, headers, b"{}", httpx.Timeout(HANG))
            await wire.aclose()
            return reply, busy.value, server.requests[0]

    reply, busy, request = run(main())
    assert (reply.status_code, json.loads(reply.content)) == (200, {"ok": True})
    assert busy.status == 503 and busy.retry_after == 7 and "busy" in str(busy)
    assert request.startswith(b"POST /v1/chat HTTP/1.1\r\nHost: 127.0.0.1:") and request.endswith(b"\r\n\r\n{}")


def test_a_proxy_from_the_environment_keeps_every_request_on_the_client(monkeypatch):
    # Given a proxy named in the environment (httpx mounts it on the client it builds)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")

    async def main() -> tuple[Any, Any]:
        clients = LoopClients()
        try:
            return clients.get(), clients.wire()
        finally:
            await clients.aclose()

    client, wire = run(main())
    # Then there is no direct path around the client (AsyncLLM sends through the client instead)
    assert client is not None and wire is None


def test_a_head_made_once_sends_the_same_bytes_as_one_made_per_request_and_is_checked_when_made():
    # Given a direct exchange whose request line and headers are made once, and one made per request
    async def main() -> list[bytes]:
        async with RawServer(lambda n, req: ok(b"{}")) as server:
            wire = WireTransport()
            url = httpx.URL(server.url + "/v1/chat?x=1")
            headers = [(b"Content-Type", b"application/json"), (b"Authorization", b"Bearer k")]
            head = wire.head(b"POST", url, headers)
            # When both send a body
            await wire.exchange(b"POST", url, headers, b'{"a":1}', {"read": HANG}, head)
            await wire.exchange(b"POST", url, headers, b'{"a":1}', {"read": HANG})
            await wire.aclose()
            return server.requests

    first, second = run(main())
    # Then the server read the same request twice, its length counted per body
    assert first == second
    assert first.startswith(b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert first.endswith(b"Content-Length: 7\r\n\r\n{\"a\":1}")
    # And a header that would split the request is refused when the head is made
    with pytest.raises(httpx.LocalProtocolError, match="line break"):
        WireTransport.head(b"POST", httpx.URL("http://h/"), [(b"X-A", b"a\r\nX-B: b")])
