"""The shared async client's HTTP/1.1 transport (``orchestrator.tools._http11``), against a loopback
server that answers each request the way the test scripts it: keep-alive, chunked and unframed
bodies, a connection that closes, a server that hangs up or never answers. Errors must be httpx's,
as the HTTP tool maps them."""

from __future__ import annotations

import asyncio
from typing import Self

import httpx
import pytest

from orchestrator.tools._http11 import Http11Transport
from orchestrator.tools.clients import ShardedTransport


class Server:
    """Answers each request with the next scripted raw reply (bytes, or None: hang up at once, or
    "hang": never answer); counts connections and keeps the requests it read."""

    def __init__(self, replies: list) -> None:
        self.replies = list(replies)
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> Self:
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
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                reply = self.replies.pop(0)
                if reply is None:
                    break
                if reply == "hang":
                    await asyncio.sleep(3600)
                writer.write(reply)
                await writer.drain()
                if b"Connection: close" in reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), b"".join(e + b"\r\n" for e in extra), body)


def client(**timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=Http11Transport(fallback=ShardedTransport()),
                             timeout=httpx.Timeout(timeout.get("all", 5.0), **{k: v for k, v in timeout.items()
                                                                             if k != "all"}))


def run(coro):
    return asyncio.run(coro)


def test_keep_alive_reuses_one_connection_and_sends_the_request_as_given():
    async def scenario():
        async with Server([ok(b'{"a":1}'), ok(b"second", b"Content-Type: text/plain")]) as srv, client() as c:
            first = await c.post(srv.url + "/v1/x?q=1", json={"k": "v"}, headers={"X-Test": "yes"})
            second = await c.get(srv.url + "/two")
            return srv, first, second

    srv, first, second = run(scenario())
    assert (first.status_code, first.json(), first.reason_phrase) == (200, {"a": 1}, "OK")
    assert second.text == "second" and second.headers["content-type"] == "text/plain"
    assert srv.connections == 1
    assert srv.requests[0].startswith(b"POST /v1/x?q=1 HTTP/1.1\r\n")
    assert b"\r\nx-test: yes\r\n" in srv.requests[0].lower() and srv.requests[0].endswith(b'{"k":"v"}')


def test_chunked_and_unframed_bodies_and_a_closing_server():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\n"
    unframed = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"

    async def scenario():
        async with Server([chunked, ok(b"again"), unframed]) as srv, client() as c:
            texts = [(await c.get(srv.url)).text for _ in range(2)]
            texts.append((await c.get(srv.url)).text)
            return srv, texts

    srv, texts = run(scenario())
    # Then the chunked body was reassembled and its connection reused; the unframed one read to the end
    assert texts == ["hello world", "again", "until the end"]
    assert srv.connections == 1


def test_a_closed_connection_is_not_reused():
    async def scenario():
        async with Server([ok(b"one", b"Connection: close"), ok(b"two")]) as srv, client() as c:
            texts = [(await c.get(srv.url)).text, (await c.get(srv.url)).text]
            return srv, texts

    srv, texts = run(scenario())
    assert texts == ["one", "two"] and srv.connections == 2


def test_failures_are_httpx_errors():
    async def hang_up():
        async with Server([None]) as srv, client() as c:
            await c.get(srv.url)

    async def no_answer():
        async with Server(["hang"]) as srv, client(read=0.05) as c:
            await c.get(srv.url)

    async def nobody_listens():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        async with client() as c:
            await c.get(f"http://127.0.0.1:{port}/")

    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        run(hang_up())
    with pytest.raises(httpx.ReadTimeout):
        run(no_answer())
    with pytest.raises(httpx.ConnectError):
        run(nobody_listens())


def test_a_streamed_request_body_goes_through_the_fallback_transport():
    async def body():
        yield b"part1-"
        yield b"part2"

    async def scenario():
        async with Server([b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"]) as srv, client() as c:
            response = await c.post(srv.url, content=body())
            return srv, response

    srv, response = run(scenario())
    assert (response.status_code, response.text) == (201, "ok")
    assert srv.requests[0].lower().find(b"transfer-encoding: chunked") > 0
