"""The shared HTTP clients keep no cookies: one client serves every run of the process, so a cookie
one run's call received must never ride along on another run's calls."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator import Orchestrator
from workflows import Workflow


class CookieServer:
    """A loopback server: ``/login`` sets a session cookie; every path answers whether it got a Cookie header."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.dumps({"had_one": self.headers.get("Cookie") is not None}).encode()
                self.send_response(200)
                if self.path.startswith("/login"):
                    self.send_header("Set-Cookie", "session=run-a-secret; Path=/")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CookieServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def flows(url: str) -> tuple[Workflow, Workflow]:
    sync = Workflow("cookies-sync")

    @sync.step
    def call(ctx, state):
        return {"had_one": ctx.http.post(f"{url}/{state['path']}", json={}).json()["had_one"]}

    asynchronous = Workflow("cookies-async")

    @asynchronous.step
    async def acall(ctx, state):
        return {"had_one": (await ctx.ahttp.post(f"{url}/{state['path']}", json={})).json()["had_one"]}

    return sync, asynchronous


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_cookie_one_run_received_is_not_sent_with_another_runs_calls(db_url, kind):
    with CookieServer() as server:
        sync, asynchronous = flows(server.url)
        wf = sync if kind == "sync" else asynchronous
        with Orchestrator(db_url, workflows=[sync, asynchronous]) as orc:
            # Given run a logged in through the shared client and was handed a session cookie
            async def both() -> tuple[str, str]:
                a = await orc.arun(wf, {"path": "login"}, run_id="a")
                b = await orc.arun(wf, {"path": "whoami"}, run_id="b")
                return a.status, b.status

            # When run b calls the same server through the same client (on the same loop)
            assert asyncio.run(both()) == ("completed", "completed")
            # Then run b's request carried no cookie
            assert orc.result("b").state["had_one"] is False
            assert orc.result("a").state["had_one"] is False
