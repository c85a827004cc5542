"""A scripted, local OpenAI-compatible chat server: real HTTP on 127.0.0.1, for tests and the demo.

    with ChatServer([tool_call("search", {"q": "venues"}), reply("done")]) as server:
        llm = LLM(base_url=server.url, model="scripted")      # server.url ends in /v1
        ...
        server.count                                           # chat requests served so far

It speaks ``POST /v1/chat/completions`` (and ``GET /v1/models``) as OpenAI does: the assistant
message with ``content`` and ``tool_calls`` (arguments as a JSON *string*), ``finish_reason``,
``usage``, and OpenAI-shaped ``{"error": {...}}`` bodies for failures.

The script is a list of replies served in order, or a function ``(request_body, n) -> reply``
(``n`` counts requests from 0), which suits agents whose requests depend on earlier answers: it
can answer by looking at the conversation, so a resumed run gets the same answers in any order.
A reply is a ``Reply``, a string (the assistant's content) or a dict (sent as the JSON body).
Failures can be scripted as replies (``error(429, retry_after=2)``) or queued in front of the
script with ``fail(status, times=...)``, which does not consume scripted replies. With
``api_key=...`` requests without ``Authorization: Bearer <that key>`` get 401.

Token counts are deterministic word counts, so tests can assert on them: a prompt costs the
words of each message's content plus one per message; a completion, the words of its content and
tool-call arguments plus one per tool call.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ChatServer", "Reply", "reply", "tool_call", "tool_calls", "error"]


@dataclass(slots=True)
class Reply:
    """One scripted answer. ``body`` (a JSON value, or bytes sent as they are) overrides the rest."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments": dict | str, "id"?}
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    delay: float = 0.0  # seconds before answering (a slow provider; tests of timeouts)


def reply(content: str, **options: Any) -> Reply:
    """The assistant answers with text."""
    return Reply(content=content, **options)


def tool_call(name: str, arguments: dict[str, Any] | str, *, id: str | None = None,
              content: str | None = None) -> Reply:
    """The assistant calls one tool; a ``str`` ``arguments`` is sent verbatim (malformed JSON, say)."""
    call = {"name": name, "arguments": arguments}
    if id is not None:
        call["id"] = id
    return Reply(content=content, tool_calls=[call])


def tool_calls(*calls: tuple[str, dict[str, Any] | str]) -> Reply:
    """The assistant calls several tools at once: ``tool_calls(("a", {...}), ("b", {...}))``."""
    return Reply(tool_calls=[{"name": n, "arguments": a} for n, a in calls])


def error(status: int, message: str | None = None, *, retry_after: float | str | None = None) -> Reply:
    """An HTTP error with an OpenAI-shaped body (and ``Retry-After`` when given)."""
    kind = {401: "invalid_request_error", 403: "permission_error", 429: "rate_limit_error"}.get(status, "server_error")
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    text = message or {401: "Incorrect API key provided.", 429: "Rate limit reached."}.get(status, "scripted failure")
    return Reply(status=status, headers=headers, body={"error": {"message": text, "type": kind, "code": status}})


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(v) for v in value)
    if isinstance(value, dict):
        return sum(_words(v) for v in value.values())
    return 0


Script = Sequence["Reply | str | dict[str, Any]"] | Callable[[dict[str, Any], int], "Reply | str | dict[str, Any]"]


class ChatServer:
    """The server: ``start()`` (or ``with``) on a free port, ``url`` to point an ``LLM`` at, ``stop()``.

    The reply builders are also reachable from the class (``ChatServer.reply("hi")``), so a user
    needs only the one public name.
    """

    reply = staticmethod(reply)
    tool_call = staticmethod(tool_call)
    tool_calls = staticmethod(tool_calls)
    error = staticmethod(error)

    def __init__(self, script: Script | None = None, *, api_key: str | None = None, port: int = 0,
                 model: str = "scripted-model") -> None:
        self.api_key = api_key
        self.port = port
        self.model = model
        self._lock = threading.Lock()
        self._script: Script = script if script is not None else []
        self._next = 0  # index of the next scripted reply (list scripts)
        self._failures: list[Reply] = []
        self.requests: list[dict[str, Any]] = []  # {"n", "path", "body", "authorized"} per chat request
        self.connections = 0  # TCP connections accepted (a client that keeps connections alive opens few)
        self.open_connections = 0  # of those, still open
        self._httpd: ThreadingHTTPServer | None = None
        self.url: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> str:
        if self._httpd is not None:
            raise RuntimeError(f"chat server already running at {self.url}")
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         name="chat-server", daemon=True).start()
        return self.url

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ChatServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting -------------------------------------------------------------------------------
    def script(self, script: Script) -> None:
        """Replace the script (and restart a list script from its first reply)."""
        with self._lock:
            self._script, self._next = script, 0

    def fail(self, status: int, *, times: int = 1, retry_after: float | str | None = None,
             message: str | None = None) -> None:
        """Answer the next ``times`` chat requests with ``status`` before going on with the script."""
        with self._lock:
            self._failures.extend(error(status, message, retry_after=retry_after) for _ in range(times))

    @property
    def count(self) -> int:
        """Chat requests received (including failed ones)."""
        with self._lock:
            return len(self.requests)

    # -- serving ---------------------------------------------------------------------------------
    def _answer(self, body: Any, authorization: str | None) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            n = len(self.requests)
            authorized = self.api_key is None or authorization == f"Bearer {self.api_key}"
            self.requests.append({"n": n, "body": body, "authorized": authorized})
            if not authorized:
                chosen: Any = error(401)
            elif self._failures:
                chosen = self._failures.pop(0)
            elif callable(self._script):
                chosen = None
            elif self._next < len(self._script):
                chosen = self._script[self._next]
                self._next += 1
            else:
                chosen = error(400, f"scripted chat server: no reply scripted for request #{n} "
                                    f"(the script has {len(self._script)})")
        if chosen is None:  # a script function runs outside the lock: it may be slow or re-entrant
            try:
                chosen = self._script(body, n)  # type: ignore[operator]
            except Exception as exc:  # a bug in the script: say so in the answer, do not hang the client
                chosen = error(500, f"scripted chat server: the script raised {type(exc).__name__}: {exc}")
        return self._render(chosen, body, n)

    def _render(self, chosen: Reply | str | dict[str, Any], request: Any, n: int) -> tuple[int, dict[str, str], bytes]:
        if isinstance(chosen, str):
            chosen = Reply(content=chosen)
        elif isinstance(chosen, dict):
            chosen = Reply(body=chosen)
        if chosen.delay:
            time.sleep(chosen.delay)
        headers = {"Content-Type": "application/json", **chosen.headers}
        if chosen.body is not None:
            raw = chosen.body if isinstance(chosen.body, bytes) else json.dumps(chosen.body).encode()
            return chosen.status, headers, raw
        calls = [{"id": c.get("id") or f"call_{n}_{i}", "type": "function",
                  "function": {"name": c["name"],
                               "arguments": c["arguments"] if isinstance(c["arguments"], str)
                               else json.dumps(c["arguments"])}}
                 for i, c in enumerate(chosen.tool_calls)]
        message: dict[str, Any] = {"role": "assistant", "content": chosen.content}
        if calls:
            message["tool_calls"] = calls
        messages = request.get("messages") if isinstance(request, dict) else None
        messages = messages if isinstance(messages, list) else []
        prompt = sum(_words(m.get("content")) + 1 for m in messages if isinstance(m, dict))
        completion = _words(chosen.content) + _words([c["function"]["arguments"] for c in calls]) + len(calls)
        body = {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1_700_000_000 + n,
            "model": (request.get("model") if isinstance(request, dict) else None) or self.model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": chosen.finish_reason or ("tool_calls" if calls else "stop")}],
            "usage": chosen.usage or {"prompt_tokens": prompt, "completion_tokens": completion,
                                      "total_tokens": prompt + completion},
        }
        return chosen.status, headers, json.dumps(body).encode()


def _handler(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without TCP_NODELAY, Nagle holds the body back
        # until the client's delayed ACK (~40 ms per request on loopback).
        disable_nagle_algorithm = True

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server.connections += 1
                server.open_connections += 1

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                with server._lock:
                    server.open_connections -= 1

        def _send(self, status: int, headers: dict[str, str], raw: bytes) -> None:
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timed out, or its process was killed)

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?", 1)[0].rstrip("/") != "/v1/chat/completions":
                self._send(404, {"Content-Type": "application/json"},
                           json.dumps({"error": {"message": f"no endpoint POST {self.path}"}}).encode())
                return
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                self._send(400, {"Content-Type": "application/json"},
                           json.dumps({"error": {"message": "the request body is not JSON"}}).encode())
                return
            self._send(*server._answer(body, self.headers.get("Authorization")))

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") == "/v1/models":
                data = {"object": "list", "data": [{"id": server.model, "object": "model"}]}
                self._send(200, {"Content-Type": "application/json"}, json.dumps(data).encode())
            else:
                self._send(404, {"Content-Type": "application/json"}, b'{"error": {"message": "not found"}}')

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
