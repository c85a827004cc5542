"""How model calls fail: 429 with Retry-After, 5xx, 401, a dead provider and its breaker, a missing
template variable. Real HTTP on loopback; waits go to an injected sleep, so nothing sleeps."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import API_KEY, calls, raw_journal  # noqa: E402

from compensations import BreakerConfig  # noqa: E402
from orchestrator import Orchestrator  # noqa: E402
from orchestrator.testing import error, reply  # noqa: E402
from orchestrator.agents import LLM, AsyncLLM  # noqa: E402
from orchestrator import PromptError  # noqa: E402
from orchestrator.agents import Prompt  # noqa: E402
from orchestrator import CircuitOpenError, ConfigurationError, PermanentToolError, RetryableToolError  # noqa: E402
from workflows import END, Workflow  # noqa: E402


def ask_workflow(llm: LLM, name: str = "ask") -> Workflow:
    wf = Workflow(name)

    @wf.step(start=True)
    def ask(ctx, state):
        return {"answer": llm.chat(ctx, state["q"]).content}

    wf.edge("ask", END)
    return wf


def test_429_is_retried_after_exactly_the_retry_after_the_server_sent(db_url, chat, sleeps):
    # Given a provider that rate-limits the first request for 7 seconds
    chat.fail(429, retry_after=7)
    chat.script([reply("ok")])
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append)
    wf = ask_workflow(llm)
    # When a step calls the model
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"q": "hi"}, run_id="r429")
        [call] = calls(orc, "r429")
    # Then the client waited the 7 seconds the server asked for, once, and the call succeeded
    assert result.status == "completed" and result.state["answer"] == "ok"
    assert sleeps == [7.0] and chat.count == 2
    # And the journal says it took one retry, and why
    assert call["response"]["retries"] == 1
    [failure] = call["response"]["failures"]
    assert failure["status"] == 429 and failure["retry_after"] == 7.0 and failure["waited"] == 7.0


def test_5xx_is_retried_with_backoff_and_gives_up_after_max_attempts(chat, sleeps):
    # Given a provider that fails every request with 503
    chat.fail(503, times=10)
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append, max_attempts=3, backoff=1.0)
    # When the client asks
    with pytest.raises(RetryableToolError) as caught:
        llm.complete(llm.request("hi"))
    # Then it tried three times, backing off (1s then 2s, with up to 50% jitter off), and says so
    assert chat.count == 3 and len(sleeps) == 2
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0
    assert "failed after 3 attempt(s)" in str(caught.value) and "503" in str(caught.value)


def test_a_retry_after_longer_than_the_bound_is_left_to_the_steps_retry_policy(chat, sleeps):
    # Given a provider asking to come back in an hour
    chat.fail(429, retry_after=3600)
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append, max_retry_after=60)
    # When the client asks, it does not hold the step for an hour
    with pytest.raises(RetryableToolError) as caught:
        llm.complete(llm.request("hi"))
    # Then the error carries the wait for the step's Retry (which honours retry_after)
    assert sleeps == [] and chat.count == 1 and caught.value.retry_after == 3600


def test_401_fails_fast_with_a_clear_message_and_is_not_retried(db_url, chat, sleeps):
    # Given a client with the wrong API key
    chat.script([reply("never")])
    llm = LLM(base_url=chat.url, model="m", api_key="sk-wrong-key-000000000000000000", sleep=sleeps.append)
    wf = ask_workflow(llm, "auth")
    # When a step calls the model
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"q": "hi"}, run_id="a1")
        journal = calls(orc, "a1")
    # Then one request was made, nothing was retried, and the run failed saying what to fix
    assert chat.count == 1 and sleeps == []
    assert result.status == "failed"
    assert "PermanentToolError" in result.error and "401" in result.error and "OPENAI_API_KEY" in result.error
    # And the failed call is not journaled as completed; neither key is in the error
    assert journal == [] and "sk-wrong-key" not in result.error


def test_403_is_a_permanent_error_too(chat, sleeps):
    chat.script([error(403, "model not allowed for this key")])
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append)
    with pytest.raises(PermanentToolError, match="403.*not retried"):
        llm.complete(llm.request("hi"))
    assert chat.count == 1 and sleeps == []


def test_the_breaker_opens_on_a_failing_provider_and_then_fails_fast_without_a_request(db_url, chat, sleeps):
    # Given a provider that is down (503 on every request) behind a breaker that opens after 4 failures
    chat.fail(503, times=100)
    breaker = BreakerConfig(name="llm-test-provider", failure_threshold=4, window=60, reset_timeout=600)
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append, max_attempts=2, breaker=breaker)
    wf = ask_workflow(llm, "breaker")
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When two runs have each failed twice
        first = [orc.run(wf, {"q": "hi"}, run_id=f"b{i}") for i in range(2)]
        requests_when_open = chat.count
        # And a third run calls the model
        third = orc.run(wf, {"q": "hi"}, run_id="b2")
        history = orc.history("b1")
    # Then the third failed fast: the breaker is open, and no request reached the provider
    assert [r.status for r in first] == ["failed", "failed"] and requests_when_open == 4
    assert third.status == "failed" and "CircuitOpenError" in third.error and "llm-test-provider" in third.error
    assert chat.count == requests_when_open
    # And the transition to open is journaled on the step that tripped it
    [failed] = [e["data"] for e in history if e["kind"] == "StepFailed"]
    assert [(t["from"], t["to"]) for t in failed["breakers"]] == [("closed", "open")]


def test_a_dead_provider_trips_the_breaker_by_connect_errors(sleeps):
    # Given a port where nothing listens
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from store import open_store

    from orchestrator.tools import StoreBreakers

    store = open_store("sqlite://")
    try:
        llm = LLM(base_url=f"http://127.0.0.1:{port}/v1", model="m", sleep=sleeps.append, max_attempts=3,
                  breakers=StoreBreakers(store), breaker=BreakerConfig(name="dead", failure_threshold=3))
        # When the client asks twice
        with pytest.raises(RetryableToolError, match="cannot connect"):
            llm.complete(llm.request("hi"))
        with pytest.raises(CircuitOpenError, match="'dead' is open"):
            llm.complete(llm.request("hi"))
    finally:
        store.close()
    # Then the first call tried three times; the second was refused by the open breaker at once
    assert len(sleeps) == 2


def test_a_missing_template_variable_fails_before_any_model_call(db_url, chat):
    # Given a step whose prompt needs a variable the state does not have
    chat.script([reply("never")])
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY)
    prompt = Prompt("Plan a trip to {{ city }} for {{ people }} people.", name="trip")
    wf = Workflow("prompted")

    @wf.step(start=True)
    def plan(ctx, state):
        return {"plan": llm.chat(ctx, [prompt.message(city=state["city"])]).content}

    wf.edge("plan", END)
    # When it runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"city": "Lisbon"}, run_id="p1")
        journal = calls(orc, "p1")
    # Then it failed naming the template and the variable, and the model was never asked
    assert result.status == "failed"
    assert "PromptError" in result.error and "'trip'" in result.error and "'people'" in result.error
    assert chat.count == 0 and journal == []


def test_prompt_errors_name_every_missing_variable_and_the_line_of_a_syntax_error(tmp_path):
    prompt = Prompt("{{ a }} {{ b.c }} {% if d is defined %}{{ d }}{% endif %} {{ e }}", name="p")
    with pytest.raises(PromptError, match=r"missing variable\(s\) 'a', 'e' \(given: b\)"):
        prompt.render(b={"c": 1})
    with pytest.raises(PromptError, match="has no attribute 'c'"):
        prompt.render(a=1, b={}, e=2)
    assert prompt.render(a=1, b={"c": 2}, e=3) == "1 2  3"
    (tmp_path / "bad.j2").write_text("line one\n{% if x %}\nno end\n")
    with pytest.raises(PromptError, match=r"prompt 'bad.j2', line \d+: template syntax error"):
        Prompt.from_file(tmp_path / "bad.j2")


def test_a_2xx_that_is_not_a_chat_completion_is_a_clear_permanent_error(chat, sleeps):
    from orchestrator.testing import Reply

    chat.script([Reply(body={"unexpected": True})])
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append)
    with pytest.raises(PermanentToolError, match="not a chat completion"):
        llm.complete(llm.request("hi"))
    assert chat.count == 1


@pytest.mark.parametrize("content", [42, {"text": "hi"}, True])
def test_a_reply_whose_content_is_neither_text_nor_parts_is_not_a_chat_completion(chat, sleeps, content):
    # Given a provider answering 200 with a message whose content is a number or an object
    from orchestrator.testing import Reply

    chat.script([Reply(body={"choices": [{"message": {"role": "assistant", "content": content},
                                          "finish_reason": "stop"}]})])
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append)
    # When it is asked / Then it is the same clear permanent error, at the call, not in the step's code
    with pytest.raises(PermanentToolError, match="not a chat completion"):
        llm.complete(llm.request("hi"))
    assert chat.count == 1


# -- every error from the provider says who answered, with what status, and never the key ---------------
def _ask(llm_class, llm):
    import asyncio

    if llm_class is LLM:
        return llm.complete(llm.request("hi"))
    return asyncio.run(llm.acomplete(llm.request("hi")))


@pytest.mark.parametrize("llm_class", [LLM, AsyncLLM], ids=["sync", "async"])
@pytest.mark.parametrize("status, phrase", [(400, "400 Bad Request"), (404, "404 Not Found"), (409, "409 Conflict"),
                                            (413, "413 Request Entity Too Large"), (422, "422 Unprocessable Entity")])
def test_a_4xx_names_the_provider_and_its_status_and_never_the_key(chat, sleeps, llm_class, status, phrase):
    # Given a provider answering a client error whose message echoes the API key back
    chat.fail(status, message=f"model 'm' does not exist (key {API_KEY})")

    async def no_sleep(seconds):
        sleeps.append(seconds)

    llm = llm_class(base_url=chat.url, model="m", api_key=API_KEY,
                    sleep=sleeps.append if llm_class is LLM else no_sleep)
    # When the client asks
    with pytest.raises(PermanentToolError) as caught:
        _ask(llm_class, llm)
    # Then the error starts with who answered and with what, says it was not retried, carries the
    # provider's own words, and not the key
    message = str(caught.value)
    assert message.startswith(f"LLM provider {llm.provider} answered {phrase}: "), message
    assert "not retried" in message and "model 'm' does not exist" in message
    assert API_KEY not in message and caught.value.status == status
    assert chat.count == 1 and sleeps == []


def test_a_404_says_which_model_and_url_to_check(chat, sleeps):
    chat.fail(404, message="The model 'gpt-nope' does not exist")
    llm = LLM(base_url=chat.url, model="gpt-nope", api_key=API_KEY, sleep=sleeps.append)
    with pytest.raises(PermanentToolError, match=r"answered 404 Not Found: check base_url and the model name "
                                                 r"\('gpt-nope'\)"):
        llm.complete(llm.request("hi"))


def test_retried_failures_say_the_last_status_or_that_nothing_answered(chat, sleeps):
    # Given a provider failing with 503 twice, and an address where nothing listens
    chat.fail(503, times=2)
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append, max_attempts=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = LLM(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key=API_KEY, sleep=sleeps.append,
               max_attempts=2, breaker=False)
    # When each is asked / Then the errors name the provider, the attempts and the last answer (or none)
    with pytest.raises(RetryableToolError, match=rf"^LLM provider {llm.provider} failed after 2 attempt\(s\), the "
                                                 r"last answered 503 Service Unavailable: "):
        llm.complete(llm.request("hi"))
    with pytest.raises(RetryableToolError, match=rf"^LLM provider 127.0.0.1:{port} failed after 2 attempt\(s\), "
                                                 r"no answer: .*cannot connect"):
        dead.complete(dead.request("hi"))


def test_a_404_in_a_run_is_journaled_with_the_provider_and_status_and_without_the_key(db_url, chat, sleeps):
    # Given a step calling a model the provider does not have (its error echoes the key)
    chat.fail(404, message=f"no such model for key {API_KEY}")
    llm = LLM(base_url=chat.url, model="m", api_key=API_KEY, sleep=sleeps.append)
    wf = ask_workflow(llm, "missing_model")
    # When it runs
    with Orchestrator(db_url, workflows=[wf]) as orc:
        result = orc.run(wf, {"q": "hi"}, run_id="nf1")
        journal = raw_journal(orc, "nf1")
        row = orc.get_run("nf1").error
    # Then the step failed once, for good, saying who answered 404; the key is nowhere
    assert result.status == "failed" and chat.count == 1
    assert f"PermanentToolError: LLM provider {llm.provider} answered 404 Not Found" in result.error
    assert row == result.error
    assert API_KEY not in journal and API_KEY not in result.error


def test_the_client_never_shows_a_key_its_base_url_carries():
    # Given a base URL holding a password and a key in its query
    key = "sk-test-" + "q" * 30
    llm = LLM(base_url=f"http://user:{key}@127.0.0.1:9/v1?key={key}", model="m")
    # Then its repr, and the error for a URL that is not http(s), do not show them
    assert key not in repr(llm)
    with pytest.raises(ConfigurationError) as caught:
        LLM(base_url=f"ftp://user:{key}@127.0.0.1:9/v1", model="m")
    assert key not in str(caught.value) and "ftp://user:" in str(caught.value)
