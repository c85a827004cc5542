"""The redactor, pure: what is a secret and what stays readable for the audit."""

from __future__ import annotations

import json

import pytest

from orchestrator.payload import REDACTED, Redactor

r = Redactor(patterns=[r"sk-[A-Za-z0-9]{20,}", "(?i)hunter2"])


@pytest.mark.parametrize("name", ["Authorization", "proxy-authorization", "COOKIE", "Set-Cookie", "X-Api-Key",
                                  "api-key", "X-Auth-Token", "password", "client_secret", "accessToken", "apiKey",
                                  "api_keys", "refresh_token", "userPassword"])
def test_sensitive_names(name):
    assert r.is_sensitive(name)


@pytest.mark.parametrize("name", ["prompt_tokens", "max_tokens", "completion_tokens", "tokenizer", "keyword",
                                  "Accept", "author", "passage", "secretary"])
def test_names_that_merely_contain_a_word_are_kept(name):
    # Usage counters and ordinary fields are audit data: redacting them would blind the operator
    assert not r.is_sensitive(name)


def test_json_fields_are_redacted_at_any_depth_whole_values_go():
    value = {"user": {"password": {"nested": "x"}, "name": "ann"}, "items": [{"token": "t1"}, {"ok": 1}]}
    assert r.json(value) == {"user": {"password": REDACTED, "name": "ann"}, "items": [{"token": REDACTED}, {"ok": 1}]}


def test_json_nested_in_a_string_is_redacted_by_field():
    # An LLM's tool call carries its arguments as a JSON string
    call = {"name": "login", "arguments": json.dumps({"user": "ann", "password": "pw-123"})}
    out = r.json(call)
    assert "pw-123" not in json.dumps(out)
    assert json.loads(out["arguments"]) == {"user": "ann", "password": REDACTED}


def test_patterns_are_redacted_anywhere_in_text_even_with_their_own_flags():
    text = "key sk-" + "x1" * 15 + " then HUNTER2 and Bearer abc.def.ghi-123"
    assert r.text(text) == f"key {REDACTED} then {REDACTED} and {REDACTED}"


def test_urls_lose_passwords_and_sensitive_parameters_only():
    url = "https://bob:pw@api.example.com/v1/search?q=cats&api_key=K1&access_token=T1&max_tokens=5"
    assert r.url(url) == ("https://bob:[REDACTED]@api.example.com/v1/search"
                          "?q=cats&api_key=[REDACTED]&access_token=[REDACTED]&max_tokens=5")


def test_headers_keep_their_names_and_repeated_values():
    out = r.headers([("Authorization", "Basic xyz"), ("Accept", "a"), ("Accept", "b"), ("X-Note", "sk-" + "a" * 24)])
    assert out == {"Authorization": REDACTED, "Accept": "a, b", "X-Note": REDACTED}


def test_bodies_by_content_type():
    assert r.body(b"user=ann&password=pw", "application/x-www-form-urlencoded") == "user=ann&password=[REDACTED]"
    assert json.loads(r.body(b'{"secret": 1, "a": 2}', "application/json; charset=utf-8")) == {"secret": REDACTED, "a": 2}
    assert r.body("not json {", "application/json") == "not json {"
    assert r.body("plain hunter2", "text/plain") == f"plain {REDACTED}"


def test_configured_field_names_and_a_bad_pattern():
    custom = Redactor(fields=["ssn"], defaults=False)
    assert custom.json({"SSN": "123", "note": "Bearer abcdefghijkl"}) == {"SSN": REDACTED, "note": "Bearer abcdefghijkl"}
    with pytest.raises(ValueError, match="not a valid regex"):
        Redactor(patterns=["(unclosed"])
