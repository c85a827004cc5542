"""The redactor, pure: what is a secret and what stays readable for the audit."""

from __future__ import annotations

import json

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.payload import REDACTED, JournalRedactor, Redactor

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


# -- names: secrets go, ordinary fields with "token" in them stay ---------------------------------
plain = Redactor()


@pytest.mark.parametrize("name", [
    "token", "access_token", "refresh_token", "id_token", "idToken", "authToken", "X-Auth-Token", "csrftoken",
    "x-amz-security-token", "github_token", "session_token", "private_key", "privateKey", "api_key", "openaiApiKey",
    "aws_secret_access_key", "client_secret", "db_password", "passphrase", "credentials", "set-cookie", "Cookie",
    "authorization", "Proxy-Authorization",
])
def test_secret_field_names(name):
    assert plain.is_sensitive(name)


@pytest.mark.parametrize("name", [
    "token_count", "next_token", "nextToken", "page_token", "next_page_token", "max_tokens", "prompt_tokens",
    "completion_tokens", "total_tokens", "tokens", "tokenizer", "token_type", "access_token_expires_in",
    "paid_token", "key", "idempotency_key", "keyword", "secretary", "author",
])
def test_ordinary_field_names_stay(name):
    assert not plain.is_sensitive(name)


def test_state_with_token_counters_and_cursors_is_journaled_as_is():
    # Given an LLM step's state: a pagination cursor, counters and the model's usage
    state = {"next_token": "eyJwYWdlIjogMn0", "token_count": 812, "max_tokens": 1024,
             "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    text = json.dumps(state)
    # When the journal redacts it
    # Then nothing changes, and the pre-filter did not even ask for a full pass
    assert JournalRedactor(plain)(text) == text
    assert not plain.may_hold_secret(text)


# -- values: common key formats, anywhere in text -------------------------------------------------
KEYS = {
    "openai": "sk-proj-Q1w2E3r4T5y6U7i8O9p0Asdfgh",
    "stripe": "sk_live_51Habcdefghijklmnop",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "A1b2C3d4E5" * 4,
    "github_pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
    "slack": "xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
    "google": "AIzaSyA-1234567890abcdefghijklmnopqrstu",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nabc+/=\n-----END RSA PRIVATE KEY-----",
    "bearer": "Bearer abc.def.ghi-123456",
    "basic": "Basic dXNlcjpodW50ZXIy",
}


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_key_formats_are_redacted_anywhere_in_text(kind):
    secret = KEYS[kind]
    # Given a secret in an error message, inside a JSON event
    text = json.dumps({"error": {"message": f"request failed with {secret} (retrying)"}})
    # When the journal redacts the event
    out = JournalRedactor(plain)(text)
    # Then the secret is gone and the sentence around it stays
    assert secret not in out and "request failed with [REDACTED] (retrying)" in json.loads(out)["error"]["message"]


def test_pem_cut_short_still_goes():
    text = json.dumps({"body": "key: -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC…[truncated]"})
    assert "MIIEvQ" not in JournalRedactor(plain)(text)


@pytest.mark.parametrize("text", [
    "Basic settings apply", "a basic understanding", "risk-free task-12 sk-short", "the token was counted",
    "ASIA is a continent", "eyJ alone", "https://example.com/@user/post?page=2&sort_key=name",
])
def test_ordinary_text_is_left_alone(text):
    # Given ordinary words that share a prefix or a word with a secret's format
    event = json.dumps({"msg": text}, separators=(",", ":"))
    # Then the text is kept, and the pre-filter does not even ask for a full pass
    assert plain.text(text) == text
    assert JournalRedactor(plain)(event) == event
    assert not plain.may_hold_secret(event)


def test_signed_urls_and_shouted_schemes():
    signed = "https://b.s3.amazonaws.com/k?X-Amz-Credential=me%2F2026&X-Amz-Signature=abc123def&X-Amz-Expires=60"
    event = json.dumps({"url": signed, "h": "BASIC dXNlcjpodW50ZXIy"})
    out = json.loads(JournalRedactor(plain)(event))
    assert out["url"].endswith("X-Amz-Signature=[REDACTED]&X-Amz-Expires=60") and out["h"] == REDACTED


def test_urls_in_any_text_lose_userinfo_passwords_and_sensitive_query_values():
    text = "GET https://bob:pw1@api.example.com/v1?q=cats&key=G1&access_token=T1&page_token=P2 then postgres://u:pw2@db/x"
    assert plain.text(text) == ("GET https://bob:[REDACTED]@api.example.com/v1?q=cats&key=[REDACTED]"
                                "&access_token=[REDACTED]&page_token=P2 then postgres://u:[REDACTED]@db/x")


def test_the_users_own_names_and_patterns():
    mine = Redactor(fields=["ssn", "bank_account"], patterns=[r"ACME-\d{6}"])
    value = {"SSN": "123-45-6789", "bankAccount": "DE89", "note": "ticket ACME-123456", "n": 1}
    out = JournalRedactor(mine)(json.dumps(value))
    assert json.loads(out) == {"SSN": REDACTED, "bankAccount": REDACTED, "note": f"ticket {REDACTED}", "n": 1}


def test_bad_settings_name_the_setting():
    with pytest.raises(ValueError, match="matches the empty string"):
        Redactor(patterns=["x*"])
    with pytest.raises(ValueError, match="single pattern"):
        Redactor(patterns="sk-.*")
    with pytest.raises(ValueError, match="field names must be non-empty"):
        Redactor(fields=["ok", ""])


# -- the pre-filter never skips a text the full pass would change ------------------------------------
_NAMES = st.sampled_from(["token", "next_token", "token_count", "accessToken", "password", "note", "api_key",
                          "Authorization", "max_tokens", "url", "ssn", "X-Auth-Token", "page_token", "key"])
_VALUES = st.one_of(
    st.sampled_from([*KEYS.values(), "https://u:p@h/x?key=1", "?token=abc", "plain words", "token", "Basic ok",
                     '{"password": "x"}', "ACME-123456", "Bearer\tabcdefghijkl", "a=1&api_key=2",
                     "u?X-Amz-Signature=abc", "BASIC dXNlcjpodW50ZXIy", "db password: pw1", "{'client_secret': 'x'}",
                     "access_token=T&x=1", "ssn=123"]),
    st.text(max_size=12),
)
_EVENTS = st.recursive(_VALUES | st.integers(), lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_NAMES, inner, max_size=3), max_leaves=10)


@settings(max_examples=400, deadline=None)
@given(_EVENTS)
def test_the_pre_filter_only_skips_texts_that_hold_no_secret(event):
    journal = JournalRedactor(Redactor(fields=["ssn"], patterns=[r"ACME-\d{6}"]))
    text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    assert journal(text) == journal(text, force=True)


@pytest.mark.parametrize("text, expected", [
    ("db login failed: password=hunter2 (retrying)", "db login failed: password=[REDACTED] (retrying)"),
    ("{'user': 'ann', 'api_key': 'abc123'}", "{'user': 'ann', 'api_key': '[REDACTED]'}"),
    ('    connect(password="hunter2")', '    connect(password="[REDACTED]")'),
    ("client_secret: s3cr3t:with:colons", "client_secret: [REDACTED]"),
    ("Authorization: Bearer abcdefghijkl", "Authorization: [REDACTED]"),
    ("token: 5 used, max_tokens=100, next_token=abc", "token: 5 used, max_tokens=100, next_token=abc"),
    ("secretary: bob", "secretary: bob"),
])
def test_names_with_values_in_free_text(text, expected):
    # An exception message or a traceback line quotes a setting: its value goes, its name stays
    assert plain.text(text) == expected


def test_header_names_that_end_in_key_or_token_are_secrets_but_ours_is_not():
    out = plain.headers({"X-Functions-Key": "a", "Ocp-Apim-Subscription-Key": "b", "X-Session-Token": "c",
                         "Idempotency-Key": "run:step:0", "X-Request-Id": "r1"})
    assert out == {"X-Functions-Key": REDACTED, "Ocp-Apim-Subscription-Key": REDACTED, "X-Session-Token": REDACTED,
                   "Idempotency-Key": "run:step:0", "X-Request-Id": "r1"}


def test_a_secret_used_as_an_object_key_goes_too():
    key = KEYS["github"]
    out = JournalRedactor(plain)(json.dumps({key: 1, "n": 2}))
    assert key not in out and json.loads(out) == {REDACTED: 1, "n": 2}


# -- redaction in place: only the strings the pre-filter points at are touched ------------------------
_NESTED = st.sampled_from(['{"a": 1, "password": "x"}', '{"city": "Paris", "n": [1, 2]}', '[{"api_key": "k"}, 3]',
                           '{"usage": {"total_tokens": 7}}', '{ "note" : "Bearer abcdefghijkl" }', "[1, 2,  3]"])
_IN_PLACE_NAMES = st.sampled_from(["token", "total_tokens", "max_tokens", "password", "client_secret", "note",
                                   "Authorization", "args", "usage", "accessToken", "apiKey", "ssn", "x-api-key"])
_IN_PLACE_EVENTS = st.recursive(
    _VALUES | _NESTED | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.none(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_IN_PLACE_NAMES | st.text(max_size=6), inner,
                                                               max_size=4),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(_IN_PLACE_EVENTS)
def test_redacting_in_place_gives_the_same_text_as_redacting_the_parsed_event(event):
    # An event as the codec writes it, redacted in place (no user patterns: the pre-filter points at
    # strings), must be exactly what the whole-document pass makes of it
    for journal in (JournalRedactor(plain), JournalRedactor(Redactor(fields=["ssn"]))):
        text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        assert journal(text) == journal(text, force=True)
        assert json.loads(journal(text)) == journal.redactor.json(event)


def test_a_usage_block_stays_as_it_is_and_only_the_nested_secret_goes():
    # Given a model call's event: a usage block full of "token" names, nested JSON with a key in it
    event = {"kind": "llm", "request": {"model": "m", "params": {"max_tokens": 64}},
             "response": {"usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
                          "body": {"choices": [{"message": {"tool_calls": [{"function": {
                              "arguments": '{"city": "Paris", "api_key": "k-123456"}'}}]}}]},
                          "meta": {"deep": {"client_secret": {"v": "s3cr3t-v"}}, "note": '{"x": 1}'}}}
    text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    out = JournalRedactor(plain)(text)
    data = json.loads(out)
    # Then the usage block and the untouched nested JSON are byte for byte what they were
    assert data["response"]["usage"] == event["response"]["usage"]
    assert data["request"] == event["request"] and data["response"]["meta"]["note"] == '{"x": 1}'
    # And the secrets went: a field at depth, and a key inside a tool call's JSON arguments
    assert data["response"]["meta"]["deep"]["client_secret"] == REDACTED
    assert json.loads(data["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) \
        == {"city": "Paris", "api_key": REDACTED}
    assert "s3cr3t-v" not in out and "k-123456" not in out
    # And an event that holds no secret costs the pre-filter only: the same text comes back
    usage_only = json.dumps({"usage": event["response"]["usage"], "params": {"max_tokens": 64}})
    assert not plain.may_hold_secret(usage_only)
