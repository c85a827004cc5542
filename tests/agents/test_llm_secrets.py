"""A model client's key, and any credential ``ctx.http`` sends, never reach the journal or an error
even when the server echoes it back ("Incorrect API key provided: KEY"), and provider text is
redacted before it is cut. Real HTTP on loopback: the scripted chat server, and a small service
echoing the headers it was sent.

The keys here are shaped like no known key format, so only the client's knowledge of what it sent
can keep them out.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.agents import LLM, AsyncLLM  # noqa: E402
from orchestrator.payload import REDACTED  # noqa: E402
from orchestrator.payload.truncate import bound_json  # noqa: E402
from orchestrator.testing import ChatServer, Reply, error, reply  # noqa: E402
from workflows import END, Workflow  # noqa: E402

KEY = "local-key-SECRETLLM0050"  # no rule knows this format


@pytest.fixture
def provider() -> Iterator[ChatServer]:
    server = ChatServer(api_key=KEY)
    server.start()
    yield server
    server.stop()


def ask(llm, *, is_async: bool = False, name: str = "ask") -> Workflow:
    wf = Workflow(name)
    if is_async:
        @wf.step(start=True, name="ask")
        async def ask_async(ctx, state):
            return {"answer": (await llm.chat(ctx, state["q"])).content}
    else:
        @wf.step(start=True, name="ask")
        def ask_sync(ctx, state):
            return {"answer": llm.chat(ctx, state["q"]).content}
    wf.edge("ask", END)
    return wf


def run(db_url: str, wf: Workflow, *, is_async: bool = False, run_id: str = "r1"):
    """The run's result and every stored event's text, joined."""
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = asyncio.run(orc.arun(wf, {"q": "hi"}, run_id=run_id)) if is_async \
            else orc.run(wf, {"q": "hi"}, run_id=run_id)
        journal = "\n".join(e.data for e in orc.store.events(run_id))
    return result, journal


# -- 1. the client's own key, echoed by the provider --------------------------------------------------------
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_401_that_echoes_the_key_fails_without_the_key(db_url, provider, is_async):
    # Given a provider whose 401 quotes the key it was sent
    provider.script([error(401, f"Incorrect API key provided: {KEY}")])
    llm = (AsyncLLM if is_async else LLM)(base_url=provider.url, model="m", api_key=KEY, max_attempts=1, breaker=False)
    # When a step calls the model
    result, journal = run(db_url, ask(llm, is_async=is_async), is_async=is_async)
    # Then the run failed saying why, with the key replaced in the error and in the journal
    assert result.status == "failed" and "401" in result.error
    assert KEY not in result.error and KEY not in journal
    assert f"Incorrect API key provided: {REDACTED}" in result.error
    assert f"Incorrect API key provided: {REDACTED}" in journal


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_5xx_that_echoes_the_key_is_retried_and_journaled_without_it(db_url, provider, is_async):
    # Given a provider failing twice with the key (and the Authorization header) in its message
    provider.fail(500, times=2, message=f"internal error for key {KEY} (Authorization: Bearer {KEY})")
    provider.script([reply("recovered")])

    async def no_wait(_seconds):
        return None

    options = {"sleep": no_wait} if is_async else {"sleep": lambda _s: None}
    llm = (AsyncLLM if is_async else LLM)(base_url=provider.url, model="m", api_key=KEY, max_attempts=3,
                                          breaker=False, **options)
    # When a step calls the model
    result, journal = run(db_url, ask(llm, is_async=is_async), is_async=is_async)
    # Then it succeeded on the third attempt, and the two failures are journaled without the key
    assert result.status == "completed" and result.state["answer"] == "recovered"
    assert journal.count("internal error for key") == 2
    assert KEY not in journal and f"internal error for key {REDACTED}" in journal


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_reply_that_echoes_the_key_is_journaled_and_seen_without_it(db_url, provider, is_async):
    # Given a model whose answer quotes the key it was called with
    provider.script([reply(f"debug: your key is {KEY}")])
    llm = (AsyncLLM if is_async else LLM)(base_url=provider.url, model="m", api_key=KEY, breaker=False)
    # When a step calls the model
    result, journal = run(db_url, ask(llm, is_async=is_async), is_async=is_async)
    # Then neither the journal nor the step saw the key
    assert result.status == "completed"
    assert result.state["answer"] == f"debug: your key is {REDACTED}"
    assert KEY not in journal and f"debug: your key is {REDACTED}" in journal


def test_a_key_escaped_as_json_may_escape_it_is_still_found(db_url, provider):
    # Given a provider that writes the echoed key with \u escapes (valid JSON for the same text)
    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)
    body = ('{"choices":[{"index":0,"message":{"role":"assistant","content":"key: ' + escaped
            + '"},"finish_reason":"stop"}]}').encode()
    provider.script([Reply(body=body)])
    llm = LLM(base_url=provider.url, model="m", api_key=KEY, breaker=False)
    result, journal = run(db_url, ask(llm))
    assert result.status == "completed" and result.state["answer"] == f"key: {REDACTED}"
    assert KEY not in journal and escaped not in journal


# -- 3. provider text is redacted before it is cut ------------------------------------------------------------
def test_a_reply_that_is_not_a_chat_completion_is_redacted_before_it_is_quoted(db_url, provider):
    # Given a 200 that is not a chat completion, whose first 300 bytes end inside a URL's password
    # (cut there, the URL rule would no longer see the "@" and the password's start would be kept)
    secret = "SECRETPWCUT0030-abcdefghijklmn"
    head = '{"e": "'
    pad = "x" * (300 - len(head) - len("https://bob:") - 15)
    provider.script([Reply(body=(head + pad + f"https://bob:{secret}@db.internal/x" + '"}').encode())])
    llm = LLM(base_url=provider.url, model="m", api_key=KEY, breaker=False)
    # When a step calls the model
    result, journal = run(db_url, ask(llm))
    # Then the error quotes the text with the password redacted, and no part of it reached the journal
    assert result.status == "failed" and "not a chat completion" in result.error
    assert secret[:15] not in result.error and secret[:15] not in journal
    assert f"https://bob:{REDACTED}@" in result.error


def test_a_response_over_the_bound_is_redacted_before_its_strings_are_cut(db_url, provider):
    # Given an answer holding an OpenAI-style key where the client's bound would cut it after a
    # few characters (cut there, "sk-SECRETKEYC" no longer matches the key's pattern)
    key = "sk-SECRETKEYCUT0060abcdefghijklmnopqrstuvwxyz0123"
    limit = 1024

    def completion(content: str) -> dict:
        return {"id": "c", "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                        "finish_reason": "stop"}]}

    for pad in range(3000):
        content = "y" * pad + " " + key + " " + "z" * 2000
        cut, _ = bound_json(completion(content), limit)
        kept = cut["choices"][0]["message"]["content"].split("…")[0]
        if kept.endswith(key[:13]):
            break
    else:
        pytest.fail("no padding cuts the key after 13 characters")
    provider.script([Reply(body=completion(content))])
    llm = LLM(base_url=provider.url, model="m", api_key=KEY, breaker=False, max_response_bytes=limit)
    # When a step calls the model
    result, journal = run(db_url, ask(llm))
    # Then the response was cut, and neither the journal nor the step holds any part of the key
    assert result.status == "completed" and "[truncated:" in result.state["answer"]
    assert key[:13] not in journal and key[:13] not in result.state["answer"]
    assert REDACTED in result.state["answer"]


# -- ctx.http: a credential a step sends, echoed by the service ---------------------------------------------------
class _Echo(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        sent = self.headers.get("X-Api-Key", "")
        status, body = (401, {"error": f"bad key {sent}"}) if self.path.startswith("/fail") \
            else (200, {"note": f"you sent {sent}", "canary": "CANARY-ECHO"})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Debug", f"key={sent}")
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def echo() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_ctx_http_never_journals_a_header_credential_the_service_echoes(db_url, echo):
    secret = "SECRETHTTP0048-local"
    wf = Workflow("http-echo")

    @wf.step(start=True)
    def call(ctx, state):
        ok = ctx.http.get(f"{echo}/ok", headers={"X-Api-Key": secret}).json()
        ctx.http.get(f"{echo}/fail", headers={"X-Api-Key": secret})
        return {"never": ok}

    wf.edge("call", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When the step's first call echoes the key in its body and a header, and the second in a 401
        result = orc.run(wf, {}, run_id="h1")
        journal = "\n".join(e.data for e in orc.store.events("h1"))
    # Then the run failed on the 401, and the key is in neither the error nor the journal
    assert result.status == "failed" and "401" in result.error and f"bad key {REDACTED}" in result.error
    assert "CANARY-ECHO" in journal and f"you sent {REDACTED}" in journal
    assert secret not in journal and secret not in result.error
