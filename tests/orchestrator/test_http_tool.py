"""The HTTP tool against a real HTTP server on 127.0.0.1: keys, error mapping, bounded and redacted
journal records, and the breaker it feeds."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass, field
from email.utils import format_datetime
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from compensations import BreakerConfig
from orchestrator.tools import StoreBreakers
from orchestrator.tools import AsyncHttpTool, HttpTool, parse_retry_after
from orchestrator.payload import Redactor
from orchestrator import CircuitOpenError, PermanentToolError, RetryableToolError
from store import open_store

HANG = 120.0  # seconds: bounds a hang, never a measure of speed


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | dict = b""
    headers: dict[str, str] = field(default_factory=dict)
    #: the reply waits until this is set (a test releases it once it has seen what it waits for)
    hold: threading.Event | None = None


class ScriptedServer:
    """Replies per path from a script (the last reply repeats); ``/echo`` returns what it received."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Reply]] = {}
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode("utf-8", errors="replace")
                parts = urlsplit(self.path)
                seen = {"method": self.command, "path": parts.path, "query": parse_qs(parts.query),
                        "headers": dict(self.headers.items()), "body": body}
                outer.received.append(seen)
                if parts.path == "/echo":
                    reply = Reply(200, seen)
                else:
                    script = outer.scripts.get(parts.path, [Reply(404, "no such path")])
                    reply = script.pop(0) if len(script) > 1 else script[0]
                if reply.hold is not None:
                    reply.hold.wait(HANG)
                payload = reply.body
                if isinstance(payload, dict):
                    payload = json.dumps(payload)
                    reply.headers.setdefault("Content-Type", "application/json")
                data = payload.encode() if isinstance(payload, str) else payload
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test): nothing to answer

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def script(self, path: str, *replies: Reply) -> str:
        self.scripts[path] = list(replies)
        return f"{self.url}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = ScriptedServer()
    yield s
    s.close()


@pytest.fixture
def journal():
    return []


def make_tool(journal, **options) -> HttpTool:
    return HttpTool(journal=journal.append, **options)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- idempotency keys --------------------------------------------------------------------------


def test_the_idempotency_key_is_sent_and_journaled(server, journal):
    # Given a tool whose context hands out the effect's idempotency key
    with make_tool(journal, idempotency_key=lambda: "run-1:book_flight:0") as tool:
        # When it posts a booking
        response = tool.post(f"{server.url}/echo", json={"to": "Lisbon"})
    # Then the server saw the key as a header, and the journal recorded the exchange
    assert response.status_code == 200
    assert server.received[0]["headers"]["Idempotency-Key"] == "run-1:book_flight:0"
    (record,) = journal
    assert record["method"] == "POST" and record["status"] == 200 and record["sent"] is True
    assert record["idempotency_key"] == "run-1:book_flight:0" and record["attempt"] == 1
    assert record["ms"] >= 0 and record["url"] == f"{server.url}/echo"
    assert json.loads(record["request"]["body"]["text"]) == {"to": "Lisbon"}


def test_resending_with_the_same_key_counts_attempts_and_no_key_sends_no_header(server, journal):
    with make_tool(journal, idempotency_key=lambda: "k") as tool:
        tool.post(f"{server.url}/echo")
        tool.post(f"{server.url}/echo")
    assert [r["attempt"] for r in journal] == [1, 2]
    with make_tool(journal) as plain:
        plain.get(f"{server.url}/echo")
    assert "Idempotency-Key" not in server.received[-1]["headers"]


def test_an_explicit_idempotency_key_header_wins(server, journal):
    with make_tool(journal, idempotency_key=lambda: "generated") as tool:
        tool.post(f"{server.url}/echo", headers={"Idempotency-Key": "mine"})
    assert server.received[0]["headers"]["Idempotency-Key"] == "mine"


# -- error mapping -------------------------------------------------------------------------------


def assert_no_httpx(exc: BaseException) -> None:
    assert not isinstance(exc, httpx.HTTPError)
    assert exc.__cause__ is None and exc.__suppress_context__


def test_429_with_retry_after_seconds_is_retryable_with_that_delay(server, journal):
    url = server.script("/rate", Reply(429, "slow down", {"Retry-After": "7"}))
    with make_tool(journal) as tool, pytest.raises(RetryableToolError, match="429") as info:
        tool.get(url)
    assert info.value.retry_after == 7.0 and info.value.status == 429
    assert journal[0]["error"] == {"type": "RetryableToolError", "message": str(info.value), "retry_after": 7.0}
    assert_no_httpx(info.value)


def test_429_with_retry_after_as_an_http_date(server, journal):
    now = 1_800_000_000.0
    when = format_datetime(datetime.fromtimestamp(now + 120, tz=timezone.utc), usegmt=True)
    url = server.script("/rate", Reply(429, "", {"Retry-After": when}))
    with make_tool(journal, clock=lambda: now) as tool, pytest.raises(RetryableToolError) as info:
        tool.get(url)
    assert info.value.retry_after == 120.0


@pytest.mark.parametrize("value, expected", [("0", 0.0), ("1.5", 1.5), ("-3", None), ("soon", None), ("nan", None),
                                             (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)])
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, now=2_000_000_000.0) == expected


def test_503_is_retryable(server, journal):
    url = server.script("/flaky", Reply(503, "maintenance"))
    with make_tool(journal) as tool, pytest.raises(RetryableToolError, match="503 Service Unavailable") as info:
        tool.get(url)
    assert info.value.status == 503 and info.value.retry_after is None
    assert journal[0]["status"] == 503


def test_404_is_permanent_and_quotes_the_body(server, journal):
    url = server.script("/missing", Reply(404, {"error": "no flight F-9"}))
    with make_tool(journal) as tool, pytest.raises(PermanentToolError, match="404 Not Found.*no flight F-9") as info:
        tool.delete(url)
    assert info.value.status == 404
    assert_no_httpx(info.value)


@pytest.mark.parametrize("status, words", [(401, "authentication failed"), (403, "forbidden")])
def test_401_and_403_are_permanent_auth_errors(server, journal, status, words):
    url = server.script("/private", Reply(status))
    with make_tool(journal) as tool, pytest.raises(PermanentToolError, match=words) as info:
        tool.get(url)
    assert "check the credentials for 127.0.0.1" in str(info.value)


def test_connection_refused_is_retryable(journal):
    with make_tool(journal) as tool, pytest.raises(RetryableToolError, match="cannot connect to 127.0.0.1") as info:
        tool.post(f"http://127.0.0.1:{closed_port()}/flights", json={})
    assert_no_httpx(info.value)
    assert journal[0]["status"] is None and journal[0]["error"]["type"] == "RetryableToolError"


def test_a_timeout_is_retryable(server, journal):
    # Given a server that answers only when the test lets it (after the client gave up), so the
    # answer cannot beat the read timeout however slowly the client runs; only the read timeout is
    # short, connecting may take as long as a loaded machine needs
    release = threading.Event()
    url = server.script("/slow", Reply(200, "late", hold=release))
    client = httpx.Client(timeout=httpx.Timeout(HANG, read=0.2))
    tool = make_tool(journal, client=client)
    try:
        with pytest.raises(RetryableToolError, match=r"no response within 0.2s") as info:
            tool.get(url)
    finally:
        release.set()
        client.close()
    assert_no_httpx(info.value)


def test_an_invalid_url_is_permanent_and_never_reaches_the_breaker(journal):
    calls = []
    tool = make_tool(journal, breaker=(calls.append, lambda name, ok: calls.append((name, ok))))
    with pytest.raises(PermanentToolError, match="not an http"):
        tool.get("ftp://example.com/file")
    assert calls == []
    tool.close()


# -- the journal record: bounded and redacted --------------------------------------------------


def test_bodies_are_bounded_with_a_marker_and_the_full_size(server, journal):
    url = server.script("/big", Reply(200, "x" * 100_000))
    with make_tool(journal, max_body=1024) as tool:
        response = tool.post(url, content="y" * 5000)
    assert len(response.content) == 100_000  # the caller gets everything; only the journal is bounded
    body = journal[0]["response"]["body"]
    assert body["truncated"] is True and body["size"] == 100_000
    assert body["text"].startswith("x" * 1024) and body["text"].endswith("[truncated: 100000 bytes total]")
    assert len(body["text"]) < 1100
    assert journal[0]["request"]["body"]["size"] == 5000
    assert journal[0]["request"]["body"]["truncated"] is True


def test_binary_bodies_are_described_not_copied(server, journal):
    url = server.script("/png", Reply(200, b"\x89PNG\r\n\x1a\n\xff\xfe", {"Content-Type": "image/png"}))
    with make_tool(journal) as tool:
        tool.get(url)
    assert journal[0]["response"]["body"]["text"] == "[binary: 10 bytes]"


def test_secrets_never_reach_the_journal(server, journal):
    # Given secrets in a header, a query parameter, a JSON field and free text matching a pattern
    secrets = ["Bearer-abc123-TOPSECRET", "QUERYKEY-987", "hunter2-password", "sk-" + "A" * 32]
    redactor = Redactor(patterns=[r"sk-[A-Za-z0-9]{20,}"])
    with make_tool(journal, redactor=redactor) as tool:
        # When they are sent to a server that echoes everything back (so they are in the response too)
        tool.post(f"{server.url}/echo?api_key={secrets[1]}&city=Lisbon",
                  headers={"Authorization": secrets[0], "X-Trace": "ok"},
                  json={"user": "ann", "password": secrets[2], "note": f"my key is {secrets[3]}",
                        "usage": {"prompt_tokens": 12}})
    # Then the server received them, but no journal record contains any of them
    received = json.dumps(server.received)
    assert all(s in received for s in secrets)
    recorded = json.dumps(journal)
    leaked = [s for s in secrets if s in recorded]
    assert leaked == []
    # And what is not secret stays readable for the audit
    record = journal[0]
    assert record["request"]["headers"]["Authorization"] == "[REDACTED]"
    assert record["request"]["headers"]["X-Trace"] == "ok"
    assert record["url"].endswith("/echo?api_key=[REDACTED]&city=Lisbon")
    assert json.loads(record["request"]["body"]["text"])["usage"] == {"prompt_tokens": 12}


def test_secrets_in_a_failing_url_stay_out_of_the_error(journal):
    tool = make_tool(journal)
    with pytest.raises(RetryableToolError) as info:
        tool.get(f"http://127.0.0.1:{closed_port()}/x?token=SEKRIT-1")
    assert "SEKRIT-1" not in str(info.value) and "SEKRIT-1" not in json.dumps(journal)
    tool.close()


# -- the breaker -------------------------------------------------------------------------------


def test_every_outcome_is_fed_to_the_breaker_named_per_host_or_per_call(server, journal):
    fed = []
    ok_url = server.script("/ok", Reply(201, "{}"))
    bad_url = server.script("/bad", Reply(502))
    missing_url = server.script("/missing", Reply(404))
    tool = make_tool(journal, breaker=(lambda name: None, lambda name, ok: fed.append((name, ok))))
    host = server.url.removeprefix("http://")
    tool.post(ok_url)
    with pytest.raises(RetryableToolError):
        tool.get(bad_url)
    with pytest.raises(PermanentToolError):
        tool.get(missing_url, breaker="catalog")
    # A 404 means the server answered: it counts as a success for the breaker
    assert fed == [(host, True), (host, False), ("catalog", True)]
    assert [r["tool"] for r in journal] == [host, host, "catalog"]
    tool.close()


def test_an_open_breaker_fails_fast_without_sending(server, journal):
    def refuse(name):
        raise CircuitOpenError(f"circuit breaker {name!r} is open", tool=name, retry_at=123.0)

    tool = make_tool(journal, breaker=(refuse, lambda name, ok: None))
    with pytest.raises(CircuitOpenError):
        tool.post(f"{server.url}/echo")
    assert server.received == []
    assert journal[0]["sent"] is False and journal[0]["error"]["type"] == "CircuitOpenError"
    tool.close()


def test_store_backed_breaker_trips_after_repeated_5xx_and_then_fails_fast(server, journal, tmp_path):
    # Given a tool whose breaker state lives in a store, opening after two failures
    store = open_store(f"sqlite:///{tmp_path}/b.db")
    transitions = []
    breakers = StoreBreakers(store, clock=lambda: 1000.0)
    hooks = breakers.hooks(lambda name: BreakerConfig(name=name, failure_threshold=2), transitions.append)
    url = server.script("/pay", Reply(500, "boom"))
    tool = make_tool(journal, breaker=hooks, breaker_name="payments")
    try:
        # When two calls fail with 500
        for _ in range(2):
            with pytest.raises(RetryableToolError):
                tool.post(url)
        # Then the breaker opened, and the third call fails fast without reaching the server
        with pytest.raises(CircuitOpenError, match="'payments' is open"):
            tool.post(url)
        assert len(server.received) == 2
        assert [(t["from"], t["to"]) for t in transitions] == [("closed", "open")]
    finally:
        tool.close()
        store.close()


# -- async -------------------------------------------------------------------------------------


def test_async_tool_sends_the_key_maps_errors_and_journals(server):
    records = []

    async def journal(record):
        records.append(record)

    async def scenario():
        url = server.script("/rate", Reply(429, "", {"Retry-After": "3"}))
        async with AsyncHttpTool(journal=journal, idempotency_key=lambda: "k-async") as tool:
            ok = await tool.post(f"{server.url}/echo", json={"a": 1})
            with pytest.raises(RetryableToolError) as info:
                await tool.get(url)
        return ok, info.value

    ok, error = asyncio.run(scenario())
    assert ok.json()["headers"]["Idempotency-Key"] == "k-async"
    assert error.retry_after == 3.0
    assert [r["status"] for r in records] == [200, 429]
