"""The graph: building, validation errors that name the step, routing and fingerprints (no database)."""

from __future__ import annotations

import math
from typing import Annotated

import pytest
from pydantic import BaseModel

from workflows import END, DefinitionError, Retry, RoutingError, Workflow, reducers


def noop(ctx, state):
    return None


def chain(*names: str) -> Workflow:
    wf = Workflow("chain")
    for i, n in enumerate(names):
        wf.step(name=n, start=(i == 0))(noop)
    for a, b in zip(names, names[1:]):
        wf.edge(a, b)
    wf.edge(names[-1], END)
    return wf


def test_valid_chain_validates_and_has_a_stable_fingerprint():
    # Given two identical definitions
    a, b = chain("x", "y", "z"), chain("x", "y", "z")
    # Then they validate and share a fingerprint
    a.validate()
    assert a.fingerprint == b.fingerprint
    assert len(a.fingerprint) == 64


def test_fingerprint_changes_with_an_edge():
    # Given a graph, and the same graph with one more edge
    a = chain("x", "y")
    b = chain("x", "y")
    b.edge("x", END)
    # Then the fingerprints differ
    assert a.fingerprint != b.fingerprint


def test_without_start_true_the_first_declared_step_is_the_start():
    # Given steps declared with no start=True and an edge
    wf = Workflow("w")
    wf.step(name="a")(noop)
    wf.step(name="b")(noop)
    wf.edge("a", "b")
    wf.edge("b", END)
    # Then the first one declared is where a run starts
    wf.validate()
    assert wf.start_steps == ["a"]


def test_a_workflow_with_no_edges_is_a_chain_in_declaration_order():
    # Given three steps and no edges, routers or joins
    wf = Workflow("w")
    for name in ("plan", "search", "answer"):
        wf.step(name=name)(noop)
    # Then they run in the order declared, the last one ending the run (and the fingerprint says so)
    wf.validate()
    assert wf.start_steps == ["plan"]
    assert wf.describe()["edges"] == [["answer", "__end__"], ["plan", "search"], ["search", "answer"]]


def test_sequence_is_an_edge_per_hop():
    wf = Workflow("w")
    for name in ("a", "b", "c"):
        wf.step(name=name)(noop)
    wf.sequence("a", "b", "c", END)
    assert wf.edges == {"a": ["b"], "b": ["c"], "c": ["__end__"]}
    with pytest.raises(DefinitionError, match="two or more"):
        wf.sequence("a")


def test_into_keeps_a_single_returned_value_as_one_field_and_a_bare_value_otherwise_is_a_clear_error():
    wf = Workflow("w")
    wf.step(name="answer", into="answer")(noop)
    wf.step(name="plain")(noop)
    assert wf.normalise_update("answer", "forty-two") == {"answer": "forty-two"}
    with pytest.raises(TypeError, match=r"returned str \('forty-two'\).*into="):
        wf.normalise_update("plain", "forty-two")


def test_duplicate_step_name_is_an_error_naming_it():
    wf = Workflow("w")
    wf.step(name="a", start=True)(noop)
    with pytest.raises(DefinitionError, match="duplicate step name 'a'") as info:
        wf.step(name="a")(noop)
    assert info.value.step == "a"


def test_unknown_edge_target_names_the_step():
    wf = Workflow("w")
    wf.step(name="plan", start=True)(noop)
    wf.edge("plan", "serach")
    with pytest.raises(DefinitionError, match="unknown step 'serach'") as info:
        wf.validate()
    assert info.value.step == "plan"


def test_unreachable_step_is_named():
    wf = Workflow("w")
    wf.step(name="a", start=True)(noop)
    wf.step(name="orphan")(noop)
    wf.edge("a", END)
    with pytest.raises(DefinitionError, match="'orphan' is unreachable"):
        wf.validate()


def test_router_with_declared_targets_makes_them_reachable():
    wf = Workflow("w")
    wf.step(name="a", start=True)(noop)
    wf.step(name="b")(noop)
    wf.route("a", lambda s: "b", targets=["b", END])
    wf.validate()


def test_router_returning_unknown_step_is_a_routing_error():
    wf = Workflow("w")
    wf.step(name="a", start=True)(noop)
    wf.route("a", lambda s: "nowhere")
    with pytest.raises(RoutingError, match="unknown step 'nowhere'"):
        wf.successors("a", {})


def test_router_returning_a_number_is_a_routing_error():
    wf = Workflow("w")
    wf.step(name="a", start=True)(noop)
    wf.route("a", lambda s: 3)
    with pytest.raises(RoutingError, match="expected a step name"):
        wf.successors("a", {})


def test_router_fan_out_and_end():
    # Given a router returning several steps (parallel branches) or END
    wf = Workflow("w")
    for n in ("a", "b", "c"):
        wf.step(name=n, start=(n == "a"))(noop)
    wf.route("a", lambda s: ["b", "c"] if s["go"] else END)
    # Then it yields both branches, or none
    assert wf.successors("a", {"go": True}) == ["b", "c"]
    assert wf.successors("a", {"go": False}) == []


def test_join_needs_two_sources_and_known_steps():
    wf = Workflow("w")
    wf.step(name="a", start=True)(noop)
    with pytest.raises(DefinitionError, match="two or more"):
        wf.edge(["a"], "b")
    wf.edge(["a", "ghost"], "a")
    with pytest.raises(DefinitionError, match="unknown step 'ghost'"):
        wf.validate()


def test_compensate_contradicted_by_effect_false_is_an_error():
    wf = Workflow("w")
    with pytest.raises(DefinitionError, match="effect=False contradicts compensate"):
        wf.step(name="a", effect=False, compensate=noop)(noop)


def test_a_step_with_a_compensation_or_a_check_is_an_effect():
    # Given steps declaring their compensation or check hook next to them, without effect=True
    wf = Workflow("w")
    wf.step(name="a", compensate=noop)(noop)
    wf.step(name="b", check=noop)(noop)
    wf.step(name="c")(noop)
    # Then the first two are effects (and described as such in the graph), the plain one is not
    assert [wf.steps[n].effect for n in "abc"] == [True, True, False]
    assert [s.get("effect", False) for s in wf.describe()["steps"]] == [True, True, False]


@pytest.mark.parametrize("kwargs, message", [
    ({"attempts": 0}, "attempts"),
    ({"initial": -1}, "initial"),
    ({"multiplier": 0.5}, "multiplier"),
    ({"initial": 5, "max_backoff": 1}, "max_backoff"),
    ({"retry_on": (int,)}, "exception types"),
])
def test_bad_retry_options_are_named(kwargs, message):
    with pytest.raises(DefinitionError, match=message):
        Retry(**kwargs)


def test_retry_backoff_grows_and_caps():
    policy = Retry(attempts=6, initial=1, multiplier=2, max_backoff=5, jitter=1)
    assert [policy.backoff(n, 0.0) for n in range(1, 6)] == [1, 2, 4, 5, 5]
    assert policy.backoff(1, 0.5) == 1.5


def test_retry_on_and_give_up_on():
    policy = Retry(retry_on=(OSError,), give_up_on=(PermissionError,))
    assert policy.should_retry(ConnectionError())
    assert not policy.should_retry(PermissionError())
    assert not policy.should_retry(ValueError())


def test_step_returning_a_list_is_rejected_with_the_step_name():
    wf = chain("a")
    with pytest.raises(TypeError, match="step 'a' returned list"):
        wf.normalise_update("a", [1, 2])


class Notes(BaseModel):
    topic: str = ""
    notes: Annotated[list[str], reducers.append] = []
    count: int = 0


def test_typed_state_reducers_come_from_annotations():
    # Given a model whose notes field appends
    wf = Workflow("typed", state=Notes, reducers={"count": reducers.add})
    state = wf.initial_state({"topic": "t"})
    # When updates are reduced
    wf.reduce(state, {"notes": "first", "count": 1})
    wf.reduce(state, {"notes": ["second", "third"], "count": 2})
    # Then notes appended and count added
    assert state["notes"] == ["first", "second", "third"]
    assert state["count"] == 3
    assert isinstance(wf.view(state), Notes)


def test_typed_state_rejects_bad_input():
    wf = Workflow("typed", state=Notes)
    with pytest.raises(Exception, match="count"):
        wf.initial_state({"count": "many"})


def test_dict_input_required_for_untyped_state():
    wf = chain("a")
    with pytest.raises(DefinitionError, match="input must be a dict"):
        wf.initial_state([1])


def test_an_input_that_does_not_fit_the_state_model_names_each_field_at_fault():
    # Given a workflow whose state is a model with a required, typed field
    from pydantic import BaseModel

    from workflows import InputError

    class Trip(BaseModel):
        city: str
        nights: int

    wf = Workflow("typed_input", state=Trip)

    @wf.step
    def plan(ctx, state):
        return {}

    # When a run's input misses one field and mistypes the other
    # Then one error names the workflow, the model and both fields
    with pytest.raises(InputError, match=r"workflow 'typed_input': input does not fit the state model Trip: "
                                         r"city: Field required; nights: Input should be a valid integer"):
        wf.initial_state({"nights": "many"})


@pytest.mark.parametrize("options, said", [
    ({"jitter": math.nan}, "Retry(jitter=nan) must be a finite number >= 0"),
    ({"initial": math.nan}, "Retry(initial=nan) must be a finite number >= 0"),
    ({"max_backoff": math.inf}, "Retry(max_backoff=inf) must be a finite number >= 0"),
    ({"multiplier": math.nan}, "Retry(multiplier=nan) must be a finite number >= 1"),
    ({"initial": True}, "Retry(initial=True) must be a finite number >= 0"),
    ({"retry_on": "ValueError"}, "Retry(retry_on=...) must be an exception type or a tuple of them, got 'ValueError'"),
    ({"jitter": True}, "Retry(jitter=True) says no amount"),
])
def test_a_retry_policy_that_could_not_be_journaled_or_waited_is_refused_naming_the_option(options, said):
    # When a Retry is given NaN, infinity, a bool or a type's name / Then it is refused, naming the option
    with pytest.raises(DefinitionError) as info:
        Retry(**options)
    assert said in str(info.value)


def test_jitter_false_means_no_jitter():
    # When a Retry is given jitter=False / Then it waits exactly its backoff, journaled as 0.0
    policy = Retry(attempts=3, initial=1, jitter=False)
    assert policy.jitter == 0.0
    assert policy.backoff(2, 0.99) == 2.0
    assert policy.describe()["jitter"] == 0.0


@pytest.mark.parametrize("options, said", [
    ({"timeout": math.nan}, "timeout must be a positive number of seconds, got nan"),
    ({"timeout": math.inf}, "timeout must be a positive number of seconds, got inf"),
    ({"timeout": True}, "timeout must be a positive number of seconds, got True"),
    ({"max_visits": True}, "max_visits must be an integer >= 1, got True"),
    ({"durable_start": "yes"}, "durable_start must be True or False, got 'yes'"),
    ({"durable_start": 1}, "durable_start must be True or False, got 1"),
    ({"resend": "no"}, "resend must be True or False, got 'no'"),
])
def test_a_step_option_of_the_wrong_kind_is_refused_naming_the_step_and_the_option(options, said):
    wf = Workflow("opts")
    # When a step is declared with it / Then it is refused, naming the step and the option
    with pytest.raises(DefinitionError) as info:
        wf.step(name="a", **options)(lambda ctx, state: {})
    assert f"step 'a': {said}" in str(info.value)


def test_a_workflow_max_visits_of_true_is_refused():
    with pytest.raises(DefinitionError, match="max_visits must be an integer >= 1, got True"):
        Workflow("w", max_visits=True)
