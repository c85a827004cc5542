"""The copy-on-access view a step and a router get: whatever is done to it never reaches the run's
state, and it copies only what is reached (so the per-step cost does not grow with the state)."""

from __future__ import annotations

import copy
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.engine.views import CowDict, CowList, copy_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)


def _mutate_everything(view):
    """Every in-place change a step could make, reached through every access path."""
    for value in list(view.values()):
        if isinstance(value, list):
            value.append("new")
            for item in value:
                if isinstance(item, dict):
                    item["x"] = 1
                if isinstance(item, list):
                    item.append(2)
            if value:
                value[0] = "replaced"
            value.sort(key=repr)
        elif isinstance(value, dict):
            value["added"] = True
            for inner in value.values():
                if isinstance(inner, (list, dict)):
                    inner.clear()
    for key in list(view):
        view[key] = None
    view["brand_new"] = [1]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=3), json_values, max_size=5))
def test_nothing_done_to_a_view_reaches_the_state(state):
    # Given a state and its frozen text
    before = json.dumps(state, sort_keys=True)
    # When a view of it is read every way and changed every way
    view = CowDict(state)
    assert json.loads(json.dumps(view, sort_keys=True)) == json.loads(before)
    assert copy.deepcopy(view) == state and dict(view) == state and {**view} == state
    _mutate_everything(view)
    # Then the state is byte for byte what it was
    assert json.dumps(state, sort_keys=True) == before


def test_elements_reached_by_slices_iteration_pop_and_concatenation_are_copies():
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    state = {"messages": messages}
    view = CowDict(state)
    for msg in view["messages"][:1]:
        msg["content"] = "changed by a slice"
    for msg in reversed(view["messages"]):
        msg["role"] = "changed by reversed"
    ([{"n": 0}] + view["messages"])[1]["content"] = "changed by radd"
    (view["messages"] + [])[0]["content"] = "changed by add"
    view["messages"].pop()["content"] = "changed by pop"
    view.pop("messages")[0]["content"] = "changed by dict.pop"
    assert state == {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}


def test_what_a_step_puts_in_stays_itself():
    view = CowDict({"items": [{"a": 1}]})
    mine = {"b": 2}
    view["items"].append(mine)
    assert view["items"][-1] is mine
    view["own"] = mine
    assert view["own"] is mine and view.get("own") is mine


def test_reading_a_long_list_does_not_copy_its_elements():
    # Given a 1,000-message conversation
    messages = [{"role": "assistant", "content": "x" * 2000} for _ in range(1000)]
    view = CowDict({"messages": messages})
    # When a step only measures it and reads the last message
    assert len(view["messages"]) == 1000
    last = view["messages"][-1]
    # Then only that one message was copied; the others are the state's own objects, unchanged
    assert last == messages[-1] and last is not messages[-1]
    assert isinstance(view["messages"], CowList)
    assert sum(a is b for a, b in zip(list.__iter__(view["messages"]), messages, strict=True)) == 999


def test_copy_json_is_a_deep_copy():
    state = {"a": [{"b": [1, 2]}], "c": "d"}
    copied = copy_json(state)
    copied["a"][0]["b"].append(3)
    assert state == {"a": [{"b": [1, 2]}], "c": "d"}
