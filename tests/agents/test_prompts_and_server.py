"""Prompt templates from a directory, and the scripted server's wire protocol as a plain HTTP client sees it."""

from __future__ import annotations

import json

import httpx
import pytest

from orchestrator.testing import ChatServer, Reply, tool_call
from orchestrator import PromptError
from orchestrator.agents import Prompt, Prompts, RenderedPrompt


def test_prompts_from_a_directory_include_each_other_and_name_what_is_missing(tmp_path):
    (tmp_path / "persona.j2").write_text("You help {{ team }}.")
    (tmp_path / "ask.j2").write_text('{% include "persona.j2" %} Question: {{ question }}')
    prompts = Prompts(tmp_path, role="system")
    message = prompts["ask.j2"].message(team="ops", question="why?")
    assert message == {"role": "system", "content": "You help ops. Question: why?"}
    assert isinstance(message["content"], RenderedPrompt) and message["content"].template == "ask.j2"
    with pytest.raises(PromptError, match=r"prompt 'ask.j2': missing variable\(s\) 'team' \(given: question\)"):
        prompts["ask.j2"].render(question="why?")
    with pytest.raises(PromptError, match=r"no prompt 'nope.j2' .*there are: ask.j2, persona.j2"):
        prompts["nope.j2"]


def test_a_changed_template_has_another_hash():
    assert Prompt("a {{ x }}").sha256 != Prompt("b {{ x }}").sha256
    assert Prompt("a {{ x }}", name="one").render(x=1).sha256 == Prompt("a {{ x }}", name="two").sha256


def test_the_server_speaks_chat_completions_with_tool_calls_and_errors():
    script = [tool_call("search", {"q": "x"}), Reply(status=503, headers={"Retry-After": "3"}),
              Reply(body=b"{not json")]
    with ChatServer(script, api_key="k") as server:
        url = f"{server.url}/chat/completions"
        payload = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
        unauthorised = httpx.post(url, json=payload)
        first = httpx.post(url, json=payload, headers={"Authorization": "Bearer k"}).json()
        failed = httpx.post(url, json=payload, headers={"Authorization": "Bearer k"})
        garbage = httpx.post(url, json=payload, headers={"Authorization": "Bearer k"})
        exhausted = httpx.post(url, json=payload, headers={"Authorization": "Bearer k"})
        count = server.count
    assert unauthorised.status_code == 401 and unauthorised.json()["error"]["type"] == "invalid_request_error"
    call = first["choices"][0]["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"] == {"name": "search", "arguments": json.dumps({"q": "x"})}
    assert first["choices"][0]["finish_reason"] == "tool_calls" and first["object"] == "chat.completion"
    assert first["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert failed.status_code == 503 and failed.headers["Retry-After"] == "3"
    assert garbage.content == b"{not json"
    assert exhausted.status_code == 400 and "no reply scripted for request #4" in exhausted.json()["error"]["message"]
    assert count == 5
