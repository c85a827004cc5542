"""``ctx.http`` as durable calls: each request's response is journaled the moment it arrives.

A step that made three requests and then died does not send them again when it runs again: request
``i`` with the same method, URL and body returns its journaled response (``CallCompleted``, kind
``http``), exactly as a model call does. Under replay (``Orchestrator(replay=cassette)``) the
responses come from the cassette, so a workflow that talks HTTP can be tested with no server.

A request that fails (connect error, timeout, 4xx/5xx mapped to a ``ToolError``) is not journaled as
completed: running the step again sends it again, with the same idempotency key. Response bodies
are kept up to ``MAX_BODY`` characters; a larger response is returned live and not journaled as a
durable call (the request is sent again, with its key, if the step runs again). Outside a step
(in a compensation or a check hook) requests are plain tool calls.
"""

from __future__ import annotations

from typing import Any

import httpx

from orchestrator.tools.http import AsyncHttpTool, HttpTool, HttpVerbs

__all__ = ["DurableHttp", "AsyncDurableHttp", "MAX_BODY"]

MAX_BODY = 1 << 20  # 1 MiB of response text kept for resume and replay


def _request_key(method: str, url: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What identifies a request for reuse: not its headers (secrets, tracing ids), its body."""
    key: dict[str, Any] = {"method": method.upper(), "url": str(url)}
    for name in ("params", "json", "data"):
        if kwargs.get(name) is not None:
            key[name] = kwargs[name]
    content = kwargs.get("content")
    if content is not None:
        key["content"] = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
    if kwargs.get("breaker"):
        key["breaker"] = kwargs["breaker"]
    return key


class _TooBig(Exception):
    """Carries a response too large to journal whole out of ``perform``."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        super().__init__("response too large to journal")


def _record(response: httpx.Response) -> dict[str, Any]:
    text = response.text
    if len(text) > MAX_BODY:
        raise _TooBig(response)
    return {"status": response.status_code, "headers": dict(response.headers), "url": str(response.url),
            "text": text}


def _response(method: str, record: dict[str, Any]) -> httpx.Response:
    headers = {k: v for k, v in record.get("headers", {}).items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")}
    return httpx.Response(record["status"], headers=headers, content=record.get("text", "").encode("utf-8"),
                          request=httpx.Request(method.upper(), record.get("url") or "http://replayed.invalid/"))


class DurableHttp(HttpVerbs):
    """The sync ``ctx.http``: httpx-like methods over an ``HttpTool``, each request a durable call."""

    def __init__(self, tool: HttpTool, ctx: Any) -> None:
        self.tool = tool
        self._ctx = ctx

    def request(self, method: str, url: Any, **kwargs: Any) -> httpx.Response:
        if self._ctx._runtime is None:  # a compensation or a check hook: no step to journal into
            return self.tool.request(method, url, **kwargs)

        def perform() -> dict[str, Any]:
            return _record(self.tool.request(method, url, **kwargs))

        try:
            record = self._ctx.durable_call("http", _request_key(method, url, kwargs), perform)
        except _TooBig as big:
            return big.response
        return _response(method, record)


class AsyncDurableHttp(HttpVerbs):
    """The async ``ctx.ahttp``: the same over an ``AsyncHttpTool``."""

    def __init__(self, tool: AsyncHttpTool, ctx: Any) -> None:
        self.tool = tool
        self._ctx = ctx

    async def request(self, method: str, url: Any, **kwargs: Any) -> httpx.Response:
        if self._ctx._runtime is None:
            return await self.tool.request(method, url, **kwargs)

        async def perform() -> dict[str, Any]:
            return _record(await self.tool.request(method, url, **kwargs))

        try:
            record = await self._ctx.adurable_call("http", _request_key(method, url, kwargs), perform)
        except _TooBig as big:
            return big.response
        return _response(method, record)
