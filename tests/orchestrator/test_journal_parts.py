"""A durable call's request is encoded and redacted once: ``JournalWriter.with_parts`` puts its text
into the ``CallCompleted`` event as it is. The event must hold exactly what encoding and redacting
it whole would give (its keys aside), and fall back to the whole pass wherever redaction could judge
the whole differently (the user's own patterns, a sensitive name as a part's key).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import Orchestrator
from orchestrator.engine.journal import Encoded, JournalWriter
from orchestrator.payload import codec
from orchestrator.payload.redact import REDACTED, JournalRedactor, Redactor
from store import open_store
from workflows import END, Workflow

_SECRETS = ["Bearer abcdefghijkl0123", "sk-" + "a1B2" * 6, "https://u:pw@host/x?api_key=1", '{"password": "x"}',
            "db password: pw1", "ACME-123456", "plain words", "token", "ssn=123"]
_NAMES = st.sampled_from(["password", "note", "api_key", "max_tokens", "token", "Authorization", "ssn", "$set",
                          "messages", "content", "role"])
_VALUES = st.one_of(st.sampled_from(_SECRETS), st.text(max_size=10), st.integers(), st.none(),
                    st.floats(allow_nan=False, allow_infinity=False))
_JSON = st.recursive(_VALUES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAMES, inner, max_size=3),
                     max_leaves=12)


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('parts') / 'parts.db'}")
    made = {name: JournalWriter(store, clock=lambda: 0.0, redact=JournalRedactor(redactor), snapshot_every=100,
                                keep_snapshots=2)
            for name, redactor in {"defaults": Redactor(), "fields": Redactor(fields=["ssn"]),
                                   "patterns": Redactor(patterns=[r"ACME-\d{6}"]),
                                   "request field": Redactor(fields=["request"])}.items()}
    yield made
    for writer in made.values():
        writer.close()
    store.close()


def _as_numbered(writer: JournalWriter, request: dict) -> str:
    """The request's text as ``DurableExecution._prepare`` makes it."""
    return writer.redact(codec.dumps(request))


def _event(request_text: str, response) -> dict:
    return {"step": "s", "tick": 1, "index": 0, "kind": "llm", "request": codec.loads(request_text),
            "response": response, "ms": 1.5}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=st.dictionaries(_NAMES, _JSON, max_size=4), response=_JSON)
def test_an_event_with_its_request_put_in_place_is_the_event_redacted_whole(writers, request, response):
    for writer in (writers["defaults"], writers["fields"]):
        # Given a request numbered as a durable call numbers it, and the call's response
        text = _as_numbered(writer, request)
        data = _event(text, response)
        # When the event is made with the request's text put in place
        made = writer.with_parts("CallCompleted", {k: v for k, v in data.items() if k != "request"},
                                 {"request": text})
        # Then its text is valid JSON holding exactly what the whole pass writes, the request last
        assert isinstance(made, Encoded)
        whole = writer.redact(codec.dumps(data))
        assert json.loads(made.text) == json.loads(whole)
        assert codec.loads(made.text) == codec.loads(whole)
        assert list(json.loads(made.text))[-1] == "request"


def test_with_the_users_own_patterns_or_a_sensitive_part_name_the_event_is_redacted_whole(writers):
    # Given a request numbered under each redactor
    for name in ("patterns", "request field"):
        writer = writers[name]
        request = {"messages": [{"role": "user", "content": "ticket ACME-123456"}]}
        text = _as_numbered(writer, request)
        data = _event(text, {"note": "ACME-654321"})
        # When the event is made with the request's text put in place
        made = writer.with_parts("CallCompleted", {k: v for k, v in data.items() if k != "request"},
                                 {"request": text})
        # Then it is handed back whole, to be encoded whole, which redacts what the user asked for
        assert made == data
        journaled = json.loads(writer.redact(codec.dumps(made)))
        if name == "patterns":
            assert journaled["request"]["messages"][0]["content"] == f"ticket {REDACTED}"
            assert journaled["response"] == {"note": REDACTED}
        else:
            assert journaled["request"] == REDACTED


def test_a_durable_calls_event_holds_its_request_and_response_redacted(tmp_path):
    # Given a step whose durable call sends a key in its request and gets one back
    wf = Workflow("parts")
    request = {"messages": [{"role": "user", "content": "use Bearer abcdefghijkl0123 please"}],
               "params": {"api_key": "k-1", "max_tokens": 5}}

    @wf.step(start=True)
    def ask(ctx, state):
        answer = ctx.durable_call("llm", request, lambda: {"text": "ok", "password": "hunter2"})
        return {"answer": answer}

    wf.edge("ask", END)
    orc = Orchestrator(f"sqlite:///{tmp_path / 'a.db'}", workflows=[wf])
    try:
        # When it runs
        result = orc.run(wf, {}, run_id="r1")
        events = [e for e in orc.store.events("r1") if e.kind == "CallCompleted"]
    finally:
        orc.close()
    # Then the call's event holds the request and the response with their secrets gone, and the step
    # saw the response as journaled
    assert result.status == "completed"
    [event] = events
    data = json.loads(event.data)
    assert data["request"] == {"messages": [{"role": "user", "content": f"use {REDACTED} please"}],
                               "params": {"api_key": REDACTED, "max_tokens": 5}}
    assert data["response"] == {"text": "ok", "password": REDACTED}
    assert result.state["answer"] == {"text": "ok", "password": REDACTED}
