"""When ``LLM`` / ``AsyncLLM`` read ``OPENAI_BASE_URL``, ``OPENAI_MODEL`` and ``OPENAI_API_KEY``: at
each call, for what was not given to them. A client built at import time (a module-level
``llm = LLM()``) therefore uses the environment a test or a notebook sets up afterwards, and a key
set after a failed call is used by the next one. A call to OpenAI's API without a key fails before
anything is sent, naming the variable; a server that refuses a call made without a key gets the
same advice. Real HTTP on loopback; nothing sleeps."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import API_KEY, calls, raw_journal  # noqa: E402

from orchestrator import ConfigurationError, Orchestrator, PermanentToolError  # noqa: E402
from orchestrator.agents import LLM, AsyncLLM  # noqa: E402
from orchestrator.testing import reply  # noqa: E402
from workflows import END, Retry, Workflow  # noqa: E402

ENV = ("OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_API_KEY")


@pytest.fixture(autouse=True)
def bare_environment(monkeypatch):
    """None of the client's variables set: each test sets what it means to."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def ask_workflow(llm, name: str = "ask", retry: Retry | None = None) -> Workflow:
    wf = Workflow(name)
    if isinstance(llm, AsyncLLM):
        @wf.step(start=True, retry=retry)
        async def ask(ctx, state):
            return {"answer": (await llm.chat(ctx, state["q"])).content}
    else:
        @wf.step(start=True, retry=retry)
        def ask(ctx, state):
            return {"answer": llm.chat(ctx, state["q"]).content}
    wf.edge("ask", END)
    return wf


def failed_call(orc: Orchestrator, run_id: str) -> dict:
    [failed] = [e["data"] for e in orc.history(run_id) if e["kind"] == "CallFailed"]
    return failed


@pytest.mark.parametrize("client", [LLM, AsyncLLM])
def test_a_client_built_before_the_environment_is_set_uses_it_at_the_call(db_url, chat, monkeypatch, client):
    # Given a client built with nothing given and nothing in the environment (as at import time)
    llm = client(sleep=lambda s: None) if client is LLM else client()
    wf = ask_workflow(llm)
    # When the environment is set afterwards, and a step calls the model
    chat.script([reply("hello")])
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_MODEL", "model-from-env")
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"q": "hi"}, run_id="late-env")
        [call] = calls(orc, "late-env")
        journal = raw_journal(orc, "late-env")
    # Then the call went to that server with that key, and the journal holds that model, not the key
    assert result.status == "completed" and result.state["answer"] == "hello"
    assert [r["authorized"] for r in chat.requests] == [True]
    assert call["request"]["model"] == "model-from-env"
    assert API_KEY not in journal
    assert repr(llm) == f"<{client.__name__} 'model-from-env' at {chat.url}>"


def test_a_key_set_after_a_refused_call_is_used_by_the_next_one(db_url, chat, monkeypatch):
    # Given a client pointed at a server that needs a key, and no key anywhere
    llm = LLM(base_url=chat.url, model="m")
    wf = ask_workflow(llm)
    chat.script([reply("now it works")])
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When a step calls it, the server refuses, and the error says which variable to set
        refused = orc.run(wf, {"q": "hi"}, run_id="no-key")
        assert refused.status == "failed"
        assert "answered 401" in refused.error and "no API key was sent: set OPENAI_API_KEY" in refused.error
        assert "no API key was sent: set OPENAI_API_KEY" in failed_call(orc, "no-key")["error"]["message"]
        # And when the key is set then (a notebook's next cell), the same client uses it
        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        result = orc.run(wf, {"q": "hi"}, run_id="with-key")
    assert result.status == "completed" and result.state["answer"] == "now it works"
    assert [r["authorized"] for r in chat.requests] == [False, True]


def test_a_call_to_openai_without_a_key_fails_before_anything_is_sent(db_url):
    # Given a client for OpenAI's API (the default base URL) and no key given or in the environment,
    # whose every request would be recorded, in a step that may retry
    sent: list[httpx.Request] = []
    client = httpx.Client(transport=httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(500)))
    llm = LLM(model="gpt-4o-mini", client=client)
    wf = ask_workflow(llm, retry=Retry(attempts=3))
    # When a step calls it
    with Orchestrator(db_url, workflows=[wf], sleep=_no_sleep) as orc:
        result = orc.run(wf, {"q": "hi"}, run_id="openai-no-key")
        failed = failed_call(orc, "openai-no-key")
        history = orc.history("openai-no-key")
    # Then nothing was sent, and the step failed once (retrying cannot help) saying to set OPENAI_API_KEY
    assert sent == []
    assert result.status == "failed"
    assert failed["error"]["type"] == "orchestrator.errors.PermanentToolError"
    assert failed["error"]["message"] == (
        "LLM provider api.openai.com: no API key to send; set OPENAI_API_KEY (read when a call is made) "
        "or give the key to LLM as its api_key argument; not sent")
    assert [e["kind"] for e in history].count("StepFailed") == 1


async def _no_sleep(seconds: float) -> None:
    return None


def test_an_async_call_to_openai_without_a_key_fails_naming_the_variable():
    # Given an async client for OpenAI's API and no key
    llm = AsyncLLM(model="gpt-4o-mini")
    request = llm.request("hi")
    # When a call is made outside any step, Then it fails before sending, naming the variable
    with pytest.raises(PermanentToolError, match="no API key to send; set OPENAI_API_KEY"):
        asyncio.run(llm.acomplete(request))


def test_what_was_given_wins_over_the_environment(chat, monkeypatch):
    # Given a client given its base URL, model and key, and an environment saying otherwise
    chat.script([reply("given")])
    llm = LLM(base_url=chat.url, model="given-model", api_key=API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    # When it is called, Then it uses what it was given
    response = llm.complete(llm.request("hi"))
    assert response["body"]["choices"][0]["message"]["content"] == "given"
    assert llm.model == "given-model" and llm.base_url == chat.url
    assert [r["authorized"] for r in chat.requests] == [True]


def test_a_bad_base_url_is_named_where_it_came_from(monkeypatch):
    # A base_url given to the client fails at construction, naming the argument
    with pytest.raises(ConfigurationError, match="LLM base_url must be an http"):
        LLM(base_url="ftp://example.com", model="m")
    # One from the environment fails at the call that reads it, naming the variable
    llm = LLM(model="m", api_key=API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "not a url")
    with pytest.raises(ConfigurationError, match="LLM OPENAI_BASE_URL must be an http"):
        llm.complete(llm.request("hi"))
    assert repr(llm) == "<LLM with an invalid OPENAI_BASE_URL>"


def test_a_model_set_in_the_environment_after_construction_is_used(monkeypatch):
    # Given a client without a model
    llm = LLM(api_key=API_KEY)
    with pytest.raises(ConfigurationError, match="LLM has no model: pass LLM\\(model=...\\) or set OPENAI_MODEL"):
        llm.request("hi")
    # When OPENAI_MODEL is set later, Then the next request uses it
    monkeypatch.setenv("OPENAI_MODEL", "later-model")
    assert llm.request("hi")["model"] == "later-model"
