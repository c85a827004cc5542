"""Leaks an outside check found in the redaction, each held shut: a user's anchored pattern the
journal's pre-filter never applied, ``name: value`` rules that kept all but the first word of a
header's value, JSON encoded twice, a percent-encoded query name, a data field named like a header,
and JSON escapes (``\\u0061``, ``\\/``, an escaped newline) that hid a secret from the pre-filter.

Each journal test asserts on the text the database holds (every event of the run, as stored) and,
where the property matters, that the fast path gives exactly what the whole-document pass gives.
"""

from __future__ import annotations

import json

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import Orchestrator
from orchestrator.payload import REDACTED, JournalRedactor, Redactor
from workflows import END, Workflow

plain = Redactor()


def run_step(db_url: str, fn, *, input=None, run_id: str = "leak", **options):
    """Run a one-step workflow; the run's result and every stored event's text, joined."""
    wf = Workflow("leak")
    wf.step(start=True, name="s")(fn)
    wf.edge("s", END)
    with Orchestrator(db_url, workflows=[wf], **options) as orc:
        result = orc.run(wf, input or {}, run_id=run_id)
        journal = "\n".join(e.data for e in orc.store.events(run_id))
    return result, journal


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- 2. the user's own patterns are applied to each string, as Redactor.text applies them ---------------
def test_an_anchored_pattern_redacts_a_whole_value_in_the_journal(db_url):
    # Given a user pattern anchored to a whole value, and an SSN alone in the input and the output
    def step(ctx, state):
        return {"ssn_value": "123-45-6789", "note": "call 555-12-3456 later"}

    # When the run is journaled
    result, journal = run_step(db_url, step, input={"ssn_in": "987-65-4321"}, redact=[r"^\d{3}-\d{2}-\d{4}$"])
    # Then neither SSN is in the journal, the replacement is, and a number inside a sentence
    # (which the anchored pattern does not match) is kept, exactly as Redactor.text would do
    assert result.status == "completed"
    assert "123-45-6789" not in journal and "987-65-4321" not in journal
    assert f'"ssn_value":"{REDACTED}"' in journal and "call 555-12-3456 later" in journal
    assert result.state["ssn_value"] == REDACTED and result.state["ssn_in"] == REDACTED


def test_multiline_lookbehind_and_escaped_character_patterns_and_a_custom_replacement(db_url):
    # Given patterns that only work on a string by itself: ^...$ per line, a lookbehind at a
    # value's start, \s across a newline (written \n in JSON), and a literal quote
    patterns = [r"(?m)^PIN: \d+$", r"(?<!\w)EMP-\d{6}", r"code:\s+\d{4}", r'say "[\w-]+"']

    def step(ctx, state):
        return {"multi": "line1\nPIN: 4455", "emp": "EMP-998877", "wrapped": "code:\n  7788",
                "quoted": 'they say "open-sesame" here', "nested": json.dumps({"pin": "x\nPIN: 1212"})}

    # When the run is journaled with a replacement of the user's own
    result, journal = run_step(db_url, step, redact=Redactor(patterns=patterns, replacement="<gone>"))
    # Then each is gone and the replacement stands in its place
    assert result.status == "completed", result.error
    for secret in ("4455", "998877", "7788", "open-sesame", "1212"):
        assert secret not in journal, secret
    assert result.state["multi"] == "line1\n<gone>" and result.state["emp"] == "<gone>"
    assert result.state["wrapped"] == "<gone>" and result.state["quoted"] == "they <gone> here"
    assert json.loads(result.state["nested"]) == {"pin": "x\n<gone>"}


# Patterns of every kind the journal treats apart: anchored, lookarounds, \b, classes that can
# match a quote, a backslash or a newline, flags, a back reference.
_PATTERNS = [r"^\d{3}-\d{2}-\d{4}$", r"ACME-\d{6}", r"\bEMP-\d{6}\b", r"(?m)^PIN: \d+$", r"PIN:\s\d+",
             r"(?<=id=)\d{3}", r"(?i)hunter2", r'"quoted"', r"a\\b", r"x.y", r"[^a-z ]{5}", r"(ab)\1",
             r"(?:^|,)zz\d", r"\d-zz", r"(?>a+)b", r"(?:EMP|ACME)-\d{2}", r"(a)?(?(1)b|zz)"]
_PIECES = ["123-45-6789", "ACME-123456", "EMP-998877", "PIN: 4455", "id=123", "HUNTER2", '"quoted"', "a\\b",
           "x\ny", "xzy", "abab", ",zz1", "zz2", "\n", "\t", '"', "\\", "\\n", "é", "\u2028", "\x0b", "ok ", "EMP"]
_STRINGS = st.lists(st.sampled_from(_PIECES), max_size=4).map("".join)
_LEAVES = st.one_of(
    _STRINGS,
    _STRINGS.map(lambda s: json.dumps({"v": s})),                                 # JSON in a string
    _STRINGS.map(lambda s: json.dumps({"v": s}, ensure_ascii=True).replace("/", "\\/")),
    _STRINGS.map(lambda s: json.dumps(json.dumps([s]))),                          # JSON encoded twice
    st.integers(), st.none(),
)
_DOCS = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_STRINGS | st.sampled_from(["note", "ssn", "a"]), inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=500, deadline=None)
@given(_DOCS, st.lists(st.sampled_from(_PATTERNS), min_size=1, max_size=3, unique=True))
def test_with_the_users_patterns_the_fast_path_gives_exactly_the_whole_pass(event, patterns):
    # Given any event and any mix of the user's patterns
    journal = JournalRedactor(Redactor(patterns=patterns))
    text = compact(event)
    # When the journal redacts it, Then its text is the whole-document pass's, byte for byte
    assert journal(text) == journal(text, force=True)


def test_a_pattern_that_can_only_be_screened_per_string_is_searched_per_string():
    # An anchored pattern whose class cannot match a quote, backslash or newline screens the whole
    # document without its anchors; one that can (\s, ".", [^...]) is searched string by string
    screened = Redactor(patterns=[r"^\d{3}-\d{2}-\d{4}$", r"\bEMP-\d{6}\b", r"(?<=id=)\d+"])
    per_string = Redactor(patterns=[r"PIN:\s\d+", r"x.y", r'"q"', r"[^a]{3}"])
    assert len(screened._screens) == 3 and not screened._per_string
    assert not per_string._screens and len(per_string._per_string) == 4
    # And both find exactly the strings Redactor.text changes
    event = compact({"a": "123-45-6789", "b": "x 123-45-6789", "c": "PIN:\n12", "d": "id=77"})
    assert json.loads(JournalRedactor(screened)(event)) == {"a": REDACTED, "b": "x 123-45-6789",
                                                           "c": "PIN:\n12", "d": f"id={REDACTED}"}
    assert json.loads(JournalRedactor(per_string)(event))["c"] == REDACTED


# -- 4. name: value in free text: a header's whole value, a quoted value to its quote -----------------------
@pytest.mark.parametrize("text, expected", [
    ("Authorization: Token SECRETEX0032", f"Authorization: {REDACTED}"),
    ('Authorization: Digest username="bob", response="SECRETPAIR0052"', f"Authorization: {REDACTED}"),
    ("Cookie: a=1; session=SECRETPAIR0053", f"Cookie: {REDACTED}"),
    ("Set-Cookie: sid=SECRETPAIR0054; HttpOnly; Path=/", f"Set-Cookie: {REDACTED}"),
    ("password: 'hunter 2 with spaces SECRETPAIR0027'", f"password: '{REDACTED}'"),
    ('connect(password="two words", timeout=5)', f'connect(password="{REDACTED}", timeout=5)'),
    ("{'Authorization': 'Token abc def', 'Accept': 'json'}", f"{{'Authorization': '{REDACTED}', 'Accept': 'json'}}"),
    ("GET /x\nAuthorization: Token SECRET1 x\nAccept: json", f"GET /x\nAuthorization: {REDACTED}\nAccept: json"),
    ("password: 'cut short SECRET2", f"password: '{REDACTED}"),
    # unchanged from before: one word for other names, the URL rule for a query parameter
    ("client_secret: s3cr3t:with:colons and more", f"client_secret: {REDACTED} and more"),
    ("see https://h/x?cookie=abc&page=2 now", f"see https://h/x?cookie={REDACTED}&page=2 now"),
    # prose keeps its words: no separator follows the name
    ("the password field is required", "the password field is required"),
    ("the Authorization header is missing; set a cookie", "the Authorization header is missing; set a cookie"),
    ("token: 5 used", "token: 5 used"),
])
def test_names_with_values_in_free_text_lose_the_whole_value(text, expected):
    assert plain.text(text) == expected
    assert plain.text(expected) == expected  # (redacting again changes nothing)


def test_header_lines_and_quoted_values_in_the_journal(db_url):
    # Given a step whose output quotes headers and a password with spaces, as log lines do
    def step(ctx, state):
        return {"log5": "Authorization: Token SECRETPAIR0026",
                "log6": "password: 'hunter 2 with spaces SECRETPAIR0027'",
                "log7": 'Authorization: Digest username="bob", response="SECRETPAIR0052"',
                "log8": "Cookie: a=1; session=SECRETPAIR0053", "prose": "the password field is required"}

    result, journal = run_step(db_url, step)
    # Then no part of any value is journaled; the names and the prose are
    assert result.status == "completed"
    assert "SECRETPAIR" not in journal and "hunter 2" not in journal and "Token" not in journal
    assert f"Authorization: {REDACTED}" in journal and f"Cookie: {REDACTED}" in journal
    assert "the password field is required" in journal


def test_an_exception_quoting_a_header_line(db_url):
    def step(ctx, state):
        raise ValueError("login failed for {'user': 'bob', 'password': 'SECRETEX0031'} "
                         "Authorization: Token SECRETEX0032")

    result, journal = run_step(db_url, step)
    assert result.status == "failed"
    assert "SECRETEX" not in journal and "SECRETEX" not in result.error
    assert f"Authorization: {REDACTED}" in result.error and f"Authorization: {REDACTED}" in journal


# -- 5. JSON encoded twice, a percent-encoded query name, a field named as a header -------------------------
def test_json_encoded_twice_a_percent_encoded_query_name_and_a_header_named_field(db_url):
    def step(ctx, state):
        return {"args3": json.dumps(json.dumps({"password": "SECRETJS0021", "city": "Oslo"})),
                "args4": json.dumps(json.dumps(json.dumps({"token": "SECRETJS0022"}))),
                "u3": "https://h/x?api%5Fkey=SECRETQENC0014&page=2",
                "headers": {"X-Functions-Key": "SECRETFK0005", "x-goog-api-key": "SECRETFK0006",
                            "Ocp-Apim-Subscription-Key": "SECRETFK0007", "Idempotency-Key": "run-1:s:0"},
                "sort_key": "name", "next_token": "CURSOR-1"}

    result, journal = run_step(db_url, step)
    assert result.status == "completed"
    # Then the secrets are gone at every depth of encoding
    for secret in ("SECRETJS0021", "SECRETJS0022", "SECRETQENC0014", "SECRETFK0005", "SECRETFK0006", "SECRETFK0007"):
        assert secret not in journal, secret
    state = result.state
    assert json.loads(json.loads(state["args3"])) == {"password": REDACTED, "city": "Oslo"}
    assert json.loads(json.loads(json.loads(state["args4"]))) == {"token": REDACTED}
    assert state["u3"] == f"https://h/x?api%5Fkey={REDACTED}&page=2"
    # And ordinary fields, and our own Idempotency-Key, stay readable
    assert state["headers"]["Idempotency-Key"] == "run-1:s:0"
    assert state["sort_key"] == "name" and state["next_token"] == "CURSOR-1"


@pytest.mark.parametrize("name, secret", [
    ("X-Functions-Key", True), ("x-functions-key", True), ("Ocp-Apim-Subscription-Key", True),
    ("X-Custom-Token", True), ("X-Vendor-Secret", True), ("Idempotency-Key", False), ("sort_key", False),
    ("sort-key", False), ("cache-key", False), ("primaryKey", False), ("next-token", False), ("page_token", False),
    ("X-Request-Id", False),
])
def test_a_field_named_as_a_header_is_judged_as_a_header(name, secret):
    assert plain.is_sensitive(name) is secret


# -- JSON escapes no longer hide a secret from the pre-filter ---------------------------------------------
@pytest.mark.parametrize("value, gone", [
    ('{"p\\u0061ssword": "s3cr3t-1"}', "s3cr3t-1"),                       # a name spelled with \u
    ('{"u": "https:\\/\\/bob:s3cr3t-2@h\\/x"}', "s3cr3t-2"),              # a URL with escaped slashes
    ("Bearer\x0babcdefghijklm3", "abcdefghijklm3"),                        # \u000b between scheme and token
    ('{"token"\n: "s3cr3t-4"}', "s3cr3t-4"),                              # a newline before the colon
    ('{"k": "Bearer\\nabcdefghijklmnop5"}', "abcdefghijklmnop5"),          # an escaped newline, nested
    ('{"k": "s\\u006b-abcdefghijklmnopqrstuvwxyz6"}', "abcdefghijklmnopqrstuvwxyz6"),
])
def test_secrets_behind_json_escapes_are_found_by_the_fast_path(value, gone):
    text = compact({"a": value})
    fast = JournalRedactor(plain)(text)
    assert fast == JournalRedactor(plain)(text, force=True)
    assert gone not in fast and REDACTED in fast


_ESCAPED = st.sampled_from([
    '{"p\\u0061ssword": "x"}', '{"u": "https:\\/\\/u:p@h\\/x"}', "Bearer\x0babcdefghijkl", '{"token"\n: "abc"}',
    '{"k": "Bearer\\nabcdefghijklmnop"}', json.dumps(json.dumps({"password": "x"})),
    json.dumps(json.dumps({"token": "y"})), json.dumps({"note": "Basic\tdXNlcjpodW50ZXIy"}),
    "https://h/x?api%5Fkey=1&b=2", '{"X-Functions-Key": "k1"}', json.dumps({"x-api-token": "t"}, indent=1),
    "C:\\users\\ann", "tab\there", "\u00e9t\u00e9",
])


@settings(max_examples=400, deadline=None)
@given(st.recursive(_ESCAPED | st.integers(), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["a", "token", "X-Functions-Key", "note"]), inner, max_size=3),
                    max_leaves=8))
def test_with_json_escapes_the_fast_path_gives_exactly_the_whole_pass(event):
    for journal in (JournalRedactor(plain), JournalRedactor(Redactor(fields=["ssn"]))):
        text = compact(event)
        assert journal(text) == journal(text, force=True)


# -- credentials a request sends, scrubbed from what comes back ----------------------------------------------
def test_the_credentials_headers_send_and_their_scrubbing():
    import base64

    basic = "Basic " + base64.b64encode(b"svc:pw-SECRET-9").decode()
    sent = plain.credentials({"Authorization": "Bearer local-key-123", "Cookie": "a=1; sid=SECRET-SID-77",
                              "Proxy-Authorization": basic, "X-Api-Key": "xk-SECRET-5", "Accept": "application/json",
                              "X-Short-Key": "abc"})
    # Then each sensitive value is there, alone and without its scheme, longest first
    assert {"Bearer local-key-123", "local-key-123", "a=1; sid=SECRET-SID-77", "SECRET-SID-77", "pw-SECRET-9",
            "xk-SECRET-5"} <= set(sent)
    assert "application/json" not in sent and "abc" not in sent and "1" not in sent  # (too short to scrub)
    assert list(sent) == sorted(sent, key=len, reverse=True)
    # And scrubbing replaces them in text and in JSON, keys included
    assert plain.scrub("Incorrect API key provided: local-key-123.", sent) == f"Incorrect API key provided: {REDACTED}."
    assert plain.scrub({"local-key-123": ["session SECRET-SID-77 expired"]}, sent) == {
        REDACTED: [f"session {REDACTED} expired"]}
