"""The HTTP clients steps share: one sync client, and one async client per event loop.

Building an httpx client is not free: with certificate verification on (the default) it loads the
system's CA bundle into a new SSL context, tens of milliseconds of CPU, even for an ``http://``
URL. A client per call also opens a TCP connection per call. So the process builds the SSL context
once (``ssl_context()``) and each ``ToolBox`` (one per Orchestrator) keeps:

- one ``httpx.Client`` for sync steps (``ctx.http``, ``LLM``), pooled and thread-safe;
- one ``httpx.AsyncClient`` per event loop (``ctx.ahttp``, ``AsyncLLM``): an async client is bound
  to the loop it first ran on, so every loop gets its own, reused by every run on that loop.

Connections are kept alive between calls and there is no limit on connections (N runs at once
make N calls at once; a cap would queue them behind each other). An async client sends through
``WireTransport`` (``orchestrator.tools.wire``): httpx's default transport costs about a
millisecond of CPU per request at a thousand requests in flight, more than the calls themselves
cost the engine. An async client is closed
when its loop shuts down (``asyncio.run`` and its kin finalise the loop's async generators, and a
parked one closes the client), or by ``close()``/``aclose()``, whichever comes first.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import threading
import urllib.request
import weakref
from collections.abc import AsyncIterator
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from orchestrator.tools.wire import WireTransport

__all__ = ["LoopClients", "client_options", "no_cookies", "ssl_context"]

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
#: no cap on connections (concurrent calls are the point); idle ones are dropped after keepalive_expiry
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=30.0)


@functools.lru_cache(maxsize=1)
def ssl_context() -> ssl.SSLContext:
    """The process's one verifying SSL context (system CAs, as httpx builds it), made on first use."""
    return httpx.create_ssl_context()


def no_cookies() -> CookieJar:
    """A cookie jar that keeps nothing. A shared client serves every run (and every tool) of the
    process: a cookie one run's call received must not be sent with another run's calls. A step that
    needs a cookie sends it itself (``headers={"Cookie": ...}``) and its call journals it (redacted)."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def client_options(timeout: Any = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """What every shared client is built with: the shared SSL context, keep-alive, no pool cap, and
    no cookie jar shared between runs."""
    return {"timeout": timeout, "verify": ssl_context(), "limits": LIMITS, "cookies": no_cookies()}


class LoopClients:
    """An ``httpx.AsyncClient`` per event loop, made on first use in that loop (see the module docstring)."""

    def __init__(self, timeout: Any = DEFAULT_TIMEOUT) -> None:
        self._timeout = timeout
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncIterator[None]] = \
            weakref.WeakKeyDictionary()
        self._wires: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WireTransport | None] = \
            weakref.WeakKeyDictionary()
        #: the loop asked last (weakly), its client and wire: a model call asks on every call, and
        #: three weak-dictionary look-ups under a lock cost more than the rest of finding its client
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], httpx.AsyncClient, WireTransport | None] | None = None
        self.closed = False

    def get(self) -> httpx.AsyncClient:
        """The running loop's client (made now if it has none)."""
        return self.pair()[0]

    def pair(self) -> tuple[httpx.AsyncClient, WireTransport | None]:
        """The running loop's client and, unless requests go through a proxy, the transport under it
        (``wire()``), in one look-up: a model call asks for both."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop and not last[1].is_closed and not self.closed:
            return last[1], last[2]
        with self._lock:
            if self.closed:
                raise RuntimeError("the HTTP clients are closed (the Orchestrator was closed)")
            client = self._clients.get(loop)
            if client is not None and not client.is_closed:
                self._last = (weakref.ref(loop), client, self._wires.get(loop))
                return client, self._wires.get(loop)
            options = client_options(self._timeout)
            wire = WireTransport(verify=options["verify"],
                                 fallback=httpx.AsyncHTTPTransport(verify=options["verify"], limits=LIMITS))
            client = httpx.AsyncClient(timeout=options["timeout"], cookies=options["cookies"], transport=wire)
            self._clients[loop] = client
            # Proxies from the environment are mounted on the client (read when it is made, as
            # httpx reads them); a request that would go through one cannot skip the client.
            self._wires[loop] = None if _env_proxies() else wire
            # Started on this loop, the generator waits at its first yield until the loop's
            # shutdown_asyncgens() finalises it, which closes the client while the loop still runs.
            closer = _close_at_shutdown(client)
            self._closers[loop] = closer
            wire_or_none = self._wires[loop]
            self._last = (weakref.ref(loop), client, wire_or_none)
        loop.create_task(_park(closer))
        return client, wire_or_none

    def wire(self) -> WireTransport | None:
        """The transport under the running loop's client, for a caller that sends through it
        directly (``AsyncLLM``); None when the client routes requests through a proxy."""
        return self.pair()[1]

    def clients(self) -> list[httpx.AsyncClient]:
        with self._lock:
            return list(self._clients.values())

    async def aclose(self) -> None:
        """Close the running loop's client, and every other one that can be closed from here."""
        self.closed = True
        loop = asyncio.get_running_loop()
        for owner, client in self._take():
            if owner is loop:
                await client.aclose()
            else:
                _close_elsewhere(owner, client)

    def close(self) -> None:
        """Close every client: now where its loop is idle; as a task on a loop that is running."""
        self.closed = True
        for owner, client in self._take():
            _close_elsewhere(owner, client)

    def _take(self) -> list[tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]]:
        with self._lock:
            taken = list(self._clients.items())
            self._last = None
            self._clients.clear()
            self._closers.clear()
            self._wires.clear()
        return taken


def _env_proxies() -> bool:
    """Whether the environment names a proxy httpx would mount (``HTTP(S)_PROXY``, ``ALL_PROXY``)."""
    return any(scheme in ("http", "https", "all") for scheme in urllib.request.getproxies_environment())


def _close_elsewhere(loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> None:
    if client.is_closed or loop.is_closed():
        return  # a closed loop finalised its async generators, which closed the client
    if loop.is_running():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(client.aclose())
        else:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop)
        return
    loop.run_until_complete(client.aclose())


async def _close_at_shutdown(client: httpx.AsyncClient) -> AsyncIterator[None]:
    try:
        yield
        yield  # never reached: the loop's shutdown finalises the generator at the first yield
    finally:
        if not client.is_closed:
            await client.aclose()


async def _park(closer: AsyncIterator[None]) -> None:
    await closer.__anext__()  # registers the generator with the loop; it waits at its first yield
