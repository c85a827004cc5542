"""The explorer's outgoing calls: a simulated process's crash points around every HTTP request.

While inside ``outgoing_calls_instrumented()``, a request made on behalf of the current ``Process``
passes a crash point before it leaves (``send``) and one after the service answered but before
anything was journaled about it (``sent``), for ``ctx.http``, tool calls and model calls alike
(httpx's transports and the async client's ``WireTransport``, including the direct path
``AsyncLLM`` takes, are wrapped while a process is current). Once past its ``send`` point, the
request is shown to the process's ``on_send`` (its method, URL and ``Idempotency-Key``), which
checks the journal before it leaves. The simulated processes also share one
TLS context per setting (only speed changes).

A process whose flow says so (``first_call_cost``) is slow to make its HTTP clients, as a fresh
process on a loaded machine is: its first ``clients.ssl_context()`` moves every event loop's clock
past a step's timeout (``_first_context``), so a timer that was running meanwhile comes due.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import httpx._transports.default as _httpx_default
from explorer_process import CURRENT, Process

from orchestrator.tools import clients
from orchestrator.tools.wire import WireTransport

_http_lock = threading.Lock()
_http_depth = 0
_REAL_SYNC = httpx.HTTPTransport.handle_request
_REAL_ASYNC = httpx.AsyncHTTPTransport.handle_async_request
_REAL_SSL = _httpx_default.create_ssl_context
# The shared async client's own transport, and the direct path AsyncLLM takes through it.
_REAL_WIRE = WireTransport.handle_async_request
_REAL_EXCHANGE = WireTransport.exchange
_ssl_contexts: dict[str, Any] = {}
# The process's SSL context for the shared clients, and the event loops' clock (see _first_context).
_REAL_CLIENT_SSL = clients.ssl_context
_REAL_LOOP_TIME = asyncio.BaseEventLoop.time
_loop_skew = 0.0
#: the event loops that read their clock while instrumented (the one a simulated process drives its run on)
_loops: weakref.WeakSet[asyncio.BaseEventLoop] = weakref.WeakSet()


def _shared_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
    # Every simulated process builds its own httpx clients, and each would load the system's CA
    # bundle again (~50 ms): the explorer's requests go to plain-HTTP loopback services, so one
    # context per setting serves them all. Only speed changes; connections stay per client.
    key = repr((verify, cert, trust_env))
    if key not in _ssl_contexts:
        _ssl_contexts[key] = _REAL_SSL(verify, cert, trust_env)
    return _ssl_contexts[key]


def _loop_time(self: asyncio.BaseEventLoop) -> float:
    _loops.add(self)
    return _REAL_LOOP_TIME(self) + _loop_skew


def _after_the_loops_turn() -> None:
    """From a thread other than a loop's: return once every running event loop has finished the turn
    it is in (the task that handed work to this thread has gone on to wait for it, inside the timeout
    it set, if any), as slow work on a thread spans the loop's turns. A loop that does not turn (one
    blocked waiting for this very thread) is not waited for beyond a minute: that only leaves the
    slowness unseen by a timer, it never makes one fire."""
    turns = []
    for loop in list(_loops):
        if loop.is_running() and not loop.is_closed():
            ran = threading.Event()
            try:
                loop.call_soon_threadsafe(loop.call_soon, ran.set)
            except RuntimeError:  # closed meanwhile
                continue
            turns.append(ran)
    for ran in turns:
        ran.wait(60)


def _first_context() -> Any:
    """``orchestrator.tools.clients.ssl_context()`` for a simulated process: the real process made it
    once, but each simulated one is fresh, and on a loaded machine making it (the CA bundle) has
    taken longer than a step's timeout. The first time a process whose flow says so
    (``first_context_cost``) asks, every event loop's clock moves on by that cost, as if the making
    had taken that long, without waiting for it: a step timeout whose timer was running meanwhile
    comes due (on the thread of a sync step or of ``ToolBox.warm``, the loop meets it when that
    thread hands its result back, before the step's task goes on). The engine makes the clients
    before a timed attempt's timer starts: then no timeout comes due, however slow the machine."""
    global _loop_skew
    process = CURRENT.get()
    if process is not None and process.first_context_cost and not process.context_made:
        process.context_made = True
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # on a step's thread, or ToolBox.warm's
            _after_the_loops_turn()
        with _http_lock:
            _loop_skew += process.first_context_cost  # (only ever forward: the loops' clocks are monotonic)
    return _REAL_CLIENT_SSL()


def _restore_loop_time() -> None:
    """Give the event loops their own clock back once no loop that read the moved clock is open (a
    loop's clock must never go back while it runs; a loop made later starts from the real clock)."""
    global _loop_skew
    if _loop_skew and any(not loop.is_closed() for loop in list(_loops)):
        return  # still in use: it keeps the moved clock (an offset, so its intervals are unchanged)
    _loop_skew = 0.0
    _loops.clear()
    asyncio.BaseEventLoop.time = _REAL_LOOP_TIME  # type: ignore[method-assign]


def _request_label(process: Process, request: httpx.Request) -> str:
    """``POST /flights``; for a group's runs, the endpoint and the query that names the run
    (``DELETE /cars?run=r2``: a booking's id depends on how the runs interleaved, the run does not)."""
    return _label_for(process, request.method, request.url)


def _label_for(process: Process, method: str, url: httpx.URL) -> str:
    if not process.tag_runs:
        return f"{method} {url.path}"
    endpoint = "/" + url.path.strip("/").split("/")[0]
    query = url.query.decode()
    return f"{method} {endpoint}" + (f"?{query}" if query else "")


def _leaving(process: Process, method: str, url: httpx.URL, key: str | None) -> None:
    """The request passed its ``send`` point and is about to leave: tell the process's ``on_send``."""
    if process.on_send is not None:
        process.on_send(process, method, str(url.copy_with(query=None)), key)


def _key(headers: Any) -> str | None:
    for name, value in headers:
        if name.lower() in (b"idempotency-key", "idempotency-key"):
            return value.decode() if isinstance(value, bytes) else value
    return None


def _sync_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
    process = CURRENT.get()
    if process is None:
        return _REAL_SYNC(self, request)
    label = _request_label(process, request)
    process.point(f"send {label}")
    _leaving(process, request.method, request.url, request.headers.get("Idempotency-Key"))
    response = _REAL_SYNC(self, request)
    response.read()
    process.point(f"sent {label}")  # the service acted; nothing about its answer is journaled yet
    return response


def _async_points(real: Callable[..., Any], passes_on: Callable[[Any, httpx.Request], bool] | None = None
                  ) -> Callable[..., Any]:
    """An async transport's ``handle_async_request`` with the send/sent points around ``real``;
    a request ``passes_on`` says the transport hands to another one is counted there instead."""

    async def request_with_points(self: Any, request: httpx.Request) -> httpx.Response:
        process = CURRENT.get()
        if process is None or (passes_on is not None and passes_on(self, request)):
            return await real(self, request)
        label = _request_label(process, request)
        process.point(f"send {label}")
        _leaving(process, request.method, request.url, request.headers.get("Idempotency-Key"))
        response = await real(self, request)
        await response.aread()
        process.point(f"sent {label}")
        return response

    return request_with_points


_async_request = _async_points(_REAL_ASYNC)
# (WireTransport hands HEAD, streamed uploads and upgrades to httpx's transport, which counts them)
_wire_request = _async_points(_REAL_WIRE, lambda transport, request: not transport._ours(request))


async def _wire_exchange(self: WireTransport, method: bytes, url: httpx.URL, *args: Any) -> Any:
    process = CURRENT.get()
    if process is None:
        return await _REAL_EXCHANGE(self, method, url, *args)
    label = _label_for(process, method.decode(), url)
    process.point(f"send {label}")
    _leaving(process, method.decode(), url, _key(args[0] if args else ()))
    reply = await _REAL_EXCHANGE(self, method, url, *args)
    process.point(f"sent {label}")
    return reply


@contextlib.contextmanager
def outgoing_calls_instrumented() -> Iterator[None]:
    """While inside: HTTP requests made on behalf of a current ``Process`` pass its crash points."""
    global _http_depth
    with _http_lock:
        _http_depth += 1
        httpx.HTTPTransport.handle_request = _sync_request  # type: ignore[method-assign]
        httpx.AsyncHTTPTransport.handle_async_request = _async_request  # type: ignore[method-assign]
        WireTransport.handle_async_request = _wire_request  # type: ignore[method-assign]
        WireTransport.exchange = _wire_exchange  # type: ignore[method-assign]
        _httpx_default.create_ssl_context = _shared_ssl_context
        clients.ssl_context = _first_context  # type: ignore[assignment]
        asyncio.BaseEventLoop.time = _loop_time  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _http_lock:
            _http_depth -= 1
            if _http_depth == 0:
                httpx.HTTPTransport.handle_request = _REAL_SYNC  # type: ignore[method-assign]
                httpx.AsyncHTTPTransport.handle_async_request = _REAL_ASYNC  # type: ignore[method-assign]
                WireTransport.handle_async_request = _REAL_WIRE  # type: ignore[method-assign]
                WireTransport.exchange = _REAL_EXCHANGE  # type: ignore[method-assign]
                _httpx_default.create_ssl_context = _REAL_SSL
                clients.ssl_context = _REAL_CLIENT_SSL  # type: ignore[assignment]
                _restore_loop_time()
