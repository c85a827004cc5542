"""Invariant 9, door by door: a distinct secret goes in through each way data reaches the database,
and the raw database bytes (the SQLite file and its -wal; every Postgres row as text) never hold
it. Each test also finds a canary that travelled next to its secret, so a door that was never
exercised cannot pass by accident.

No secret here is shaped like an ``sk-`` key unless the door is about that format: each one is
caught only by the rule its door depends on (a query parameter's name, a header's name, a URL's
userinfo, a field name, a key format, a ``name=value`` in a message).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from compensations import EffectRecord
from orchestrator import Orchestrator
from orchestrator.agents import LLM, ToolRegistry, run_tool_loop
from orchestrator.scale.deadletter import DeadLetterPolicy
from orchestrator.testing import ChatServer, reply, tool_call
from workflows import END, Retry, Workflow


# -- reading the database as bytes ---------------------------------------------------------------------
def database_bytes(db_url: str) -> bytes:
    """Everything the database holds: the SQLite files byte for byte, or every Postgres row as text."""
    if db_url.startswith("sqlite"):
        path = Path(db_url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))
    import psycopg

    with psycopg.connect("postgresql://" + db_url.split("://", 1)[1]) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")]
        assert "agentsaga_events" in tables
        rows = [str(r[0]) for t in tables for r in conn.execute(f'SELECT t::text FROM "{t}" t')]
    return "\n".join(rows).encode()


def assert_kept_out(db_url: str, secrets: list[str], canaries: list[str]) -> None:
    raw = database_bytes(db_url)
    for canary in canaries:
        assert canary.encode() in raw, f"the door was not exercised: {canary!r} is not in the database"
    for secret in secrets:
        assert secret.encode() not in raw, f"{secret!r} reached the database"


def run_one_step(db_url: str, fn, *, input=None, **options):
    wf = Workflow("door")
    wf.step(start=True, name="s")(fn)
    wf.edge("s", END)
    with Orchestrator(db_url, workflows=[wf], **options) as orc:
        result = orc.run(wf, input or {}, run_id="d1")
    return result


# -- an HTTP service that sets cookies and redirects with a token in the URL ---------------------------
class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/landing?access_token=REDIRECT-TOKEN-3&from=CANARY-REDIRECT")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._json(200, {"ok": True, "path": "CANARY-BODY"}, {"Set-Cookie": "sid=SETCOOKIE-SECRET-4; HttpOnly"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._json(200, {"ok": True})


@pytest.fixture
def service() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# -- the doors --------------------------------------------------------------------------------------------
def test_url_query_values_userinfo_and_redirected_urls(db_url, service):
    # Given a step that calls URLs with a key in the query, a password in the userinfo, and a
    # redirect that lands on a URL carrying an access token
    def call(ctx, state):
        ctx.http.get(f"http://door:USERINFO-SECRET-1@{service}/echo?api_key=QUERY-SECRET-2&q=CANARY-QUERY")
        ctx.http.get(f"http://{service}/redirect", follow_redirects=True)
        return {"called": True}

    # When it runs (each response journaled as a durable call, and as the step's call record)
    assert run_one_step(db_url, call).status == "completed"
    # Then no secret is in the database: not in the request keys, the records, nor the final URLs
    assert_kept_out(db_url, ["USERINFO-SECRET-1", "QUERY-SECRET-2", "REDIRECT-TOKEN-3"],
                    ["CANARY-QUERY", "CANARY-REDIRECT"])


def test_headers_sent_and_received(db_url, service):
    # Given a step sending credentials in headers whose names say so, to a service setting a cookie
    def call(ctx, state):
        ctx.http.get(f"http://{service}/echo", headers={
            "Authorization": "Token HEADER-SECRET-5", "X-Functions-Key": "HEADER-SECRET-6",
            "Cookie": "session=HEADER-SECRET-7", "X-Request-Id": "CANARY-HEADER"})
        return {}

    assert run_one_step(db_url, call).status == "completed"
    assert_kept_out(db_url, ["HEADER-SECRET-5", "HEADER-SECRET-6", "HEADER-SECRET-7", "SETCOOKIE-SECRET-4"],
                    ["CANARY-HEADER"])


def test_trace_data(db_url):
    def think(ctx, state):
        ctx.trace("signed in as CANARY-TRACE", session_token="TRACE-SECRET-8", user="ann")
        ctx.trace("config loaded: {'db_password': 'TRACE-SECRET-9'}")
        return {}

    assert run_one_step(db_url, think).status == "completed"
    assert_kept_out(db_url, ["TRACE-SECRET-8", "TRACE-SECRET-9"], ["CANARY-TRACE"])


def test_exception_messages_and_tracebacks(db_url):
    # Given a step that fails twice with a secret in its message (its traceback quotes the source
    # line too), once retried and once for good, so the run fails with that error
    def connect(ctx, state):
        raise ConnectionError("login to CANARY-EXC failed: password=EXC-SECRET-10 (retry later)")

    wf = Workflow("door")
    wf.step(start=True, name="s", retry=Retry(attempts=2, initial=0.0, max_backoff=0.0, jitter=0.0))(connect)
    wf.edge("s", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {}, run_id="d1")
        history = orc.history("d1")
    assert result.status == "failed" and "CANARY-EXC" in result.error
    assert any("Traceback" in (e["data"].get("error") or {}).get("traceback", "") for e in history)
    # Then the events, the snapshot and the run row's error hold the message without the secret
    assert_kept_out(db_url, ["EXC-SECRET-10"], ["CANARY-EXC", "Traceback"])


def test_failed_recovery_records(db_url):
    # Given a worker's dead-letter policy recording a failed recovery whose error names a secret
    wf = Workflow("door")
    wf.step(start=True, name="s")(lambda ctx, s: {})
    wf.edge("s", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        run_id = orc.start(wf, {})
        token = orc.store.leases.acquire(run_id, owner="w", ttl=30, now=orc.engine.config.clock(), force=True)
        policy = DeadLetterPolicy(orc.store, owner="w", clock=orc.engine.config.clock, max_failures=0,
                                  redact=orc.engine.journal.redact)
        # When the failure is recorded (and, past max_failures, the run is buried with it)
        policy.on_error(orc.get_run(run_id), token, RuntimeError("CANARY-DLQ: api_key=DLQ-SECRET-11"))
        assert orc.get_run(run_id).status == "dead"
    # Then neither the failures table nor the run's error hold it
    assert_kept_out(db_url, ["DLQ-SECRET-11"], ["CANARY-DLQ"])


def test_step_outputs(db_url):
    pem = "-----BEGIN EC PRIVATE KEY-----\nOUTPUT-SECRET-12xxMHcCAQEEIB\n-----END EC PRIVATE KEY-----"

    def deploy(ctx, state):
        return {"host": "CANARY-OUTPUT", "deploy": {"private_key": "OUTPUT-SECRET-13", "pem": pem},
                "log": "pushed with ghp_OUTPUTSECRET14abcdefghijklmnopqrstuvwxyz0",
                "next_token": "CANARY-CURSOR", "token_count": 4242}

    result = run_one_step(db_url, deploy)
    assert result.status == "completed"
    # Then the secrets are gone, and the ordinary fields with "token" in their names are intact
    assert result.state["next_token"] == "CANARY-CURSOR" and result.state["token_count"] == 4242
    assert_kept_out(db_url, ["OUTPUT-SECRET-12", "OUTPUT-SECRET-13", "ghp_OUTPUTSECRET14"],
                    ["CANARY-OUTPUT", "CANARY-CURSOR"])


def test_run_input(db_url):
    result = run_one_step(db_url, lambda ctx, s: {}, input={"customer": "CANARY-INPUT", "api_token": "INPUT-SECRET-15",
                                                            "dsn": "postgresql://app:INPUT-SECRET-16@db/app"})
    assert result.status == "completed"
    assert_kept_out(db_url, ["INPUT-SECRET-15", "INPUT-SECRET-16"], ["CANARY-INPUT"])


def test_signal_data(db_url):
    # Given a run waiting for an approval
    wf = Workflow("door")
    wf.step(start=True, name="ask")(lambda ctx, s: {"decision": ctx.wait_for("approval")})
    wf.edge("ask", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="d1").status == "waiting"
        # When a signal with a secret in it is sent (it waits in the signals table until consumed)
        orc.signal("d1", "approval", {"by": "CANARY-SIGNAL", "otp_secret": "SIGNAL-SECRET-17",
                                      "note": "approved, Bearer SIGNAL-SECRET-18xyz"})
        # Then it is not in the database while it waits
        assert_kept_out(db_url, ["SIGNAL-SECRET-17", "SIGNAL-SECRET-18"], ["CANARY-SIGNAL"])
        # Nor after the run consumed it
        [result] = orc.recover()
    assert result.status == "completed" and result.state["decision"]["by"] == "CANARY-SIGNAL"
    assert_kept_out(db_url, ["SIGNAL-SECRET-17", "SIGNAL-SECRET-18"], ["CANARY-SIGNAL"])


def test_compensation_results(db_url):
    basic = "Basic " + base64.b64encode(b"svc:COMP-SECRET-19").decode()

    def refund(ctx, effect: EffectRecord):
        ctx.trace("refunded", client_secret="COMP-SECRET-20")
        return {"refund": "CANARY-COMP", "authorization_used": "yes", "header": basic}

    wf = Workflow("door")
    wf.step(start=True, name="charge", effect=True, compensate=refund)(lambda ctx, s: {"charged": True})
    wf.step(name="ship")(lambda ctx, s: (_ for _ in ()).throw(PermissionError("no stock")))
    wf.edge("charge", "ship")
    wf.edge("ship", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="d1").status == "compensated"
    assert_kept_out(db_url, ["COMP-SECRET-19", base64.b64encode(b"svc:COMP-SECRET-19").decode(), "COMP-SECRET-20"],
                    ["CANARY-COMP"])


def test_model_requests_responses_and_tool_calls(db_url):
    # Given a model that calls a tool with a key in its arguments, a tool whose result holds a
    # refresh token, and a final answer quoting an AWS key id; the user's prompt holds a password
    script = [
        tool_call("lookup", {"query": "CANARY-TOOLARG", "api_key": "TOOLARG-SECRET-21"}),
        reply("done: CANARY-ANSWER, use AKIAMODELSECRET00220 for the bucket"),
    ]
    tools = ToolRegistry()

    @tools.tool
    def lookup(query: str, api_key: str) -> dict:
        """Look something up."""
        return {"found": "CANARY-TOOLRESULT", "refresh_token": "TOOLRESULT-SECRET-23"}

    with ChatServer(script) as chat:
        llm = LLM(base_url=chat.url, model="m", api_key="MODEL-KEY-SECRET-24")
        wf = Workflow("door")

        @wf.step(start=True)
        def agent(ctx, state):
            out = run_tool_loop(ctx, llm, "my db password: PROMPT-SECRET-25, find CANARY-PROMPT", tools)
            return {"answer": out.content}

        wf.edge("agent", END)
        with Orchestrator(db_url, workflows=[wf]) as orc:
            assert orc.run(wf, {}, run_id="d1").status == "completed"
    assert_kept_out(db_url, ["TOOLARG-SECRET-21", "AKIAMODELSECRET00220", "TOOLRESULT-SECRET-23",
                             "MODEL-KEY-SECRET-24", "PROMPT-SECRET-25"],
                    ["CANARY-TOOLARG", "CANARY-ANSWER", "CANARY-TOOLRESULT", "CANARY-PROMPT"])


def test_the_users_own_names_and_patterns(db_url):
    def step(ctx, state):
        return {"patient": {"ssn": "USER-SECRET-26", "name": "CANARY-USER"}, "ref": "case ACME-998877 opened"}

    result = run_one_step(db_url, step, redact=[r"ACME-\d{6}"], redact_fields=["ssn"])
    assert result.status == "completed"
    assert_kept_out(db_url, ["USER-SECRET-26", "ACME-998877"], ["CANARY-USER"])
