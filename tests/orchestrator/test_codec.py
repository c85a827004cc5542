"""The journal's JSON codec: tagged types round-trip; anything else is a clear error (invariant 8)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator import EncodingError
from orchestrator.payload import canonical_dumps, dumps as encode_json, loads as decode_json


@dataclasses.dataclass
class Point:
    x: int
    when: dt.date


class Booking(BaseModel):
    ref: str
    at: dt.datetime


def test_tagged_values_round_trip():
    value = {
        "at": dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc),
        "day": dt.date(2026, 1, 2),
        "blob": b"\x00\xffdata",
        "price": decimal.Decimal("10.10"),
        "id": uuid.UUID(int=7),
        "tags": {"b", "a"},
        "wait": dt.timedelta(seconds=90),
    }
    assert decode_json(encode_json(value)) == value


def test_models_and_dataclasses_become_dicts():
    out = decode_json(encode_json({"p": Point(1, dt.date(2026, 1, 1)),
                                   "b": Booking(ref="F1", at=dt.datetime(2026, 1, 1))}))
    assert out == {"p": {"x": 1, "when": dt.date(2026, 1, 1)}, "b": {"ref": "F1", "at": dt.datetime(2026, 1, 1)}}


def test_unencodable_value_names_path_and_type():
    with pytest.raises(EncodingError) as info:
        encode_json({"result": {"items": [1, object()]}}, what="output of step 'plan'")
    message = str(info.value)
    assert "output of step 'plan'" in message
    assert "$.result.items[1]" in message
    assert "builtins.object" in message


def test_nan_is_not_json():
    with pytest.raises(EncodingError, match="nan"):
        encode_json({"score": float("nan")})


def test_cycles_are_reported():
    loop: list = []
    loop.append(loop)
    with pytest.raises(EncodingError, match="cycle"):
        encode_json({"x": loop})


# -- user data that looks like a codec tag (the escape) ------------------------------------------------
MONGO_LIKE = [
    {"$set": {"status": "paid"}},                       # every MongoDB update
    {"$inc": {"n": 1}},
    {"$date": "2026-01-02"},                            # a real tag's name, as user data
    {"$bytes": "not base64 at all"},
    {"$$ROOT": 1},                                      # already starts with two
    {"$": 0},
    {"$set": {"$set": [1, 2]}},                         # nested
    [{"$push": {"log": "x"}}, {"$pull": {"log": "y"}}],
    {"ops": [{"$set": {"a": 1}}], "$set": "two keys: never a tag"},
]


@pytest.mark.parametrize("value", MONGO_LIKE)
def test_json_that_looks_like_a_tag_round_trips_exactly(value):
    # Given any JSON value a step may return
    # When it is encoded for the journal and decoded again, plainly and canonically
    # Then it comes back exactly: dicts stay dicts, nothing becomes a set or a date
    assert decode_json(encode_json(value)) == value
    assert decode_json(canonical_dumps(value)) == value


def test_the_escape_is_one_more_dollar_and_tags_are_still_tags():
    # Given a user dict whose only key starts with "$", next to a real set
    value = {"update": {"$set": {"a": 1}}, "tags": {"x"}}
    # When encoded
    text = encode_json(value)
    # Then the user's key is written with one more "$" and the set keeps its tag
    assert text == '{"update":{"$$set":{"a":1}},"tags":{"$set":["x"]}}'
    assert decode_json(text) == value


def test_models_and_dataclasses_holding_tag_shaped_dicts_round_trip():
    @dataclasses.dataclass
    class Update:
        query: dict
        change: dict

    out = decode_json(encode_json({"u": Update({"$eq": 1}, {"$set": {"a": 2}})}))
    assert out == {"u": {"query": {"$eq": 1}, "change": {"$set": {"a": 2}}}}


def test_journals_written_before_the_escape_still_decode():
    # Given texts as the old codec wrote them: real tags, and a $-key dict it did not know
    old = '{"at":{"$datetime":"2026-01-01T00:00:00"},"s":{"$set":[1,2]},"other":{"$weird":1}}'
    # Then they decode as they always did
    assert decode_json(old) == {"at": dt.datetime(2026, 1, 1), "s": {1, 2}, "other": {"$weird": 1}}


def test_a_step_returning_a_mongo_update_gets_it_back_after_a_resume(sqlite_url):
    from orchestrator import Orchestrator
    from workflows import END, Workflow

    # Given a workflow whose step returns a MongoDB update document
    wf = Workflow("mongo")
    wf.step(start=True, name="plan")(lambda ctx, s: {"update": {"$set": {"status": "paid"}}, "ids": {"$in": [1, 2]}})
    wf.step(name="apply")(lambda ctx, s: {"seen": s["update"]})
    wf.edge("plan", "apply")
    wf.edge("apply", END)
    # When it runs, and another process reads its state back from the journal
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        live = orc.run(wf, {}, run_id="m1")
    with Orchestrator(sqlite_url, workflows=[wf]) as orc:
        again = orc.result("m1")
    # Then the next step saw a dict and the journal gives the same dict back
    assert live.state["seen"] == {"$set": {"status": "paid"}}
    assert again.state == live.state == {"update": {"$set": {"status": "paid"}}, "ids": {"$in": [1, 2]},
                                         "seen": {"$set": {"status": "paid"}}}


_KEYS = st.one_of(st.text(max_size=6), st.sampled_from(["$set", "$date", "$bytes", "$$x", "$", "$uuid", "$set$"]))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: (st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3)
                   | st.dictionaries(st.integers() | st.none() | st.floats(allow_nan=False, allow_infinity=False), inner,
                                     max_size=3)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_any_json_round_trips(value):
    assert decode_json(encode_json(value)) == value
    assert decode_json(canonical_dumps(value)) == value


def test_tags_are_read_however_the_dollar_is_written_and_plain_text_decodes_as_json():
    # A tag whose "$" another writer escaped as \u0024 is still a tag (the fast path for texts
    # without tags must not miss it), and so is an escaped user dict
    assert decode_json('{"\\u0024date": "2020-01-02"}') == dt.date(2020, 1, 2)
    assert decode_json('{"\\u0024$x": 1}') == {"$x": 1}
    assert decode_json('[{"$uuid": "12345678-1234-5678-1234-567812345678"}]') == [
        uuid.UUID("12345678-1234-5678-1234-567812345678")]
    # A text with no "$" at all decodes exactly as JSON; a "$" inside a value is only text
    assert decode_json('{"a": [1, 2.5, {"b": null}], "c": "x"}') == {"a": [1, 2.5, {"b": None}], "c": "x"}
    assert decode_json('{"a": "$date"}') == {"a": "$date"}


# -- dict keys that are not strings --------------------------------------------------------------------
class Scores(BaseModel):
    by_id: dict[int, float]


NON_STR_KEYS = [
    {"m": {1: "a", 2: "b"}},                                    # ids as ints
    {"m": {2: "b", 1: "a"}},                                    # order kept
    {"grid": {1.5: "x", -3: "y", True: "t", None: "n"}},       # every JSON scalar
    {"when": {dt.date(2026, 1, 2): 1, dt.datetime(2026, 1, 2, 3): 2, dt.time(4, 5): 3, dt.timedelta(seconds=6): 4}},
    {"ids": {uuid.UUID(int=7): "u", decimal.Decimal("1.10"): "d", b"\x00k": "b"}},
    {"nested": [{"1": {2: {"$set": {3: "deep"}}}}]},           # under str keys, around a tag-shaped dict
    {"$map": [[1, "a"]]},                                       # user data shaped like the new tag
]


@pytest.mark.parametrize("value", NON_STR_KEYS)
def test_dict_keys_that_are_not_strings_come_back_as_they_were(value):
    # Given a value whose dicts are keyed by ints, floats, dates, UUIDs...
    # When it is encoded for the journal and decoded again, plainly and canonically
    plain, canonical = decode_json(encode_json(value)), decode_json(canonical_dumps(value))
    # Then the keys are the same objects of the same types, in the same order (plainly)
    assert plain == value and canonical == value
    assert repr(plain) == repr(value)


def test_a_model_with_int_keys_round_trips_as_its_fields():
    # Given a pydantic model whose field is keyed by ints
    # When it is journaled / Then its fields come back with int keys (a typed state re-validates them)
    assert decode_json(encode_json({"s": Scores(by_id={3: 0.5, 1: 1.0})})) == {"s": {"by_id": {3: 0.5, 1: 1.0}}}


def test_a_canonical_text_does_not_depend_on_the_order_of_non_str_keys():
    # Given the same dict built in two orders
    # When written canonically (snapshot hashes rely on it) / Then the texts are equal
    assert canonical_dumps({"m": {2: "b", 1: "a"}}) == canonical_dumps({"m": {1: "a", 2: "b"}})
    assert canonical_dumps({None: 1, 3: 2}) == canonical_dumps({3: 2, None: 1})


def test_string_keys_that_look_like_numbers_are_written_as_before():
    # Given ordinary string keys that read like numbers, true or null
    value = {"404": "not found", "true": 1, "null": 2, "-1": [{"2.5": "x"}]}
    # When encoded / Then the text is plain JSON, with no tag
    assert encode_json(value) == '{"404":"not found","true":1,"null":2,"-1":[{"2.5":"x"}]}'
    assert decode_json(encode_json(value)) == value


@pytest.mark.parametrize("value, path, words", [
    ({"m": {1: "a", "1": "b"}}, "$.m", "written as '1', a key the dict already has, and one entry would be lost"),
    ({"state": {"items": [0, 1, 2, {"name": "x", 1: "a"}]}}, "$.state.items[3]", "mixes string keys with the key 1"),
    ({True: 1, "true": 2}, "the top-level dict", "written as 'true', a key the dict already has"),
    ({"m": {(1, 2): "pair"}}, "$.m", "the key (1, 2) (tuple), which would not come back as itself"),
    ({"m": {frozenset({1}): "s"}}, "$.m", "would not come back as itself"),
    ({"m": {float("nan"): "x"}}, "$.m", "the key nan (float), which is not valid JSON"),
    ({"p": Point(x={1: 0.5, "1": 0.7}, when=dt.date(2026, 1, 1))}, "$.p.x", "one entry would be lost"),
])
def test_keys_that_would_not_come_back_are_refused_naming_the_dict_and_the_key(value, path, words):
    # Given a dict mixing string keys with others (they would collide or change), or a key that
    # would come back as something else
    # When it is encoded, plainly or canonically
    for encode in (encode_json, canonical_dumps):
        with pytest.raises(EncodingError) as raised:
            encode(value, what="output of step 'plan'")
        # Then the error names the value, the dict's path and the key, and says what would happen
        message = str(raised.value)
        assert message.startswith("output of step 'plan' cannot be journaled: ")
        assert path in message and words in message
