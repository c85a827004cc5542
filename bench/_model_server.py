"""A fake OpenAI-compatible model server for bench/agents.py, run in a process of its own.

    python bench/_model_server.py [delay_ms]      # prints "READY <port>" once it listens on 127.0.0.1

``POST /v1/chat/completions`` waits ``delay_ms`` (50 by default: a model call's latency, without
burning CPU) and answers a chat completion of about 1 KB. Its ledger counts the calls per request
``tag`` (the content of the last message, e.g. ``run=r1 step=s3``): the benchmark reads it to
check every step's call was made exactly once. ``GET /ledger`` returns ``{"calls": {tag: n},
"connections": n}`` (connections accepted since the last reset); ``POST /reset`` empties both.

Plain asyncio streams and HTTP/1.1 with keep-alive: one event loop serves thousands of
concurrent connections without a thread each.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys

PAD = "lorem ipsum dolor sit amet " * 34  # ~920 characters of content: a reply of about 1 KB


class Server:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: dict[str, int] = {}
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                close = False
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    name = name.strip().lower()
                    if name == "content-length":
                        length = int(value.strip())
                    elif name == "connection" and value.strip().lower() == "close":
                        close = True
                body = await reader.readexactly(length) if length else b""
                status, payload = await self.route(method, path, body)
                data = json.dumps(payload).encode()
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: bytes) -> tuple[str, dict]:
        if method == "POST" and path.endswith("/chat/completions"):
            request = json.loads(body)
            tag = str(request["messages"][-1]["content"])
            self.calls[tag] = self.calls.get(tag, 0) + 1
            await asyncio.sleep(self.delay)
            return "200 OK", {
                "id": "chatcmpl-bench", "object": "chat.completion", "model": request.get("model", "bench"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"{tag}: {PAD}"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 160, "total_tokens": 163},
            }
        if method == "GET" and path == "/ledger":
            return "200 OK", {"calls": self.calls, "connections": self.connections}
        if method == "POST" and path == "/reset":
            self.calls, self.connections = {}, 0
            return "200 OK", {"reset": True}
        return "404 Not Found", {"error": {"message": f"no route {method} {path}"}}


async def main(delay_ms: float) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per concurrent run
    server = Server(delay_ms / 1000.0)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, backlog=4096)
    port = listener.sockets[0].getsockname()[1]
    print(f"READY {port}", flush=True)
    async with listener:
        await listener.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 50.0))
