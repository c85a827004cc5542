"""The journal's JSON codec: tagged types round-trip; anything else is a clear error (invariant 8)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid

import pytest
from pydantic import BaseModel

from orchestrator import EncodingError
from orchestrator.payload import dumps as encode_json, loads as decode_json


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
