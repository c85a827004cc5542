"""A user's own exception class, raised by a durable call and journaled, is raised again as itself
when the same attempt runs again (after a crash, woken for a later wait): the ``except`` that caught
it and the step's ``Retry(give_up_on=...)`` that gave up on it do so again. Found by the class's own
name among the modules already imported, without importing or running anything
(orchestrator/engine/raised_again.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.engine.raised_again import failure_fields, recorded_error
from orchestrator.errors import CallFailedError
from workflows import END, Retry, Workflow

sys.path.insert(0, str(Path(__file__).parent))

from declineflow import Declined, charge  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import sys
sys.path.insert(0, "tests/orchestrator")
from declineflow import charge
from orchestrator import Orchestrator
db, ledger = sys.argv[1:]
Orchestrator(db, workflows=[charge]).run(charge, {"card": "4242", "ledger": ledger}, run_id="declined")
"""


def test_a_decline_journaled_before_a_crash_is_given_up_on_again_and_not_charged_twice(db_url, tmp_path):
    ledger = tmp_path / "ledger"
    # Given a process whose card charge was declined (the call's failure journaled) and that was
    # SIGKILLed before the step's failure was journaled
    process = subprocess.run([sys.executable, "-c", DRIVER, db_url, str(ledger)], cwd=ROOT,
                             env={**os.environ, "DECLINEFLOW_DIE": "1"}, capture_output=True, timeout=120)
    assert process.returncode == -9, process.stderr.decode()[-2000:]
    assert ledger.read_text().splitlines() == ["charge 4242"]
    # When the run is resumed here
    with Orchestrator(db_url, workflows=[charge]) as orc:
        result = orc.resume("declined")  # its owner is dead: taken over at once
        history = orc.history("declined")
    # Then the decline came back as Declined: the step's Retry gave up on it as it would have, and
    # the card service saw one charge, not a retry's second
    assert result.status == "failed"
    assert ledger.read_text().splitlines() == ["charge 4242"]
    [failed_call] = [e["data"] for e in history if e["kind"] == "CallFailed"]
    assert failed_call["error"]["type"] == "declineflow.Declined"
    assert failed_call["error"]["args"] == ["4242", "do_not_honor"]
    assert failed_call["error"]["attrs"] == {"code": "do_not_honor", "retry": False}
    [step_failed] = [e["data"] for e in history if e["kind"] == "StepFailed"]
    assert step_failed["error"]["type"] == "declineflow.Declined"
    assert step_failed.get("attempt", 1) == 1
    assert "StepRetrying" not in [e["kind"] for e in history]


def test_a_user_error_a_step_caught_is_caught_again_with_its_fields_when_the_step_runs_again(db_url, tmp_path):
    # Given a step that charges a card (declined: Declined, caught), then waits for a new card
    ledger = tmp_path / "ledger"
    wf = Workflow("decline-then-ask")
    seen: list = []

    @wf.step(start=True)
    def pay(ctx, state):
        try:
            ctx.durable_call("charge", {"card": "4242"}, lambda: _declined(ledger))
        except Declined as no:
            seen.append((type(no), no.args, no.code, no.retry))
            return {"card": ctx.wait_for("new-card"), "declined": no.code}
        return {"card": "4242"}

    wf.edge("pay", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="ask").status == "waiting"
        # When the new card comes and the step runs again (its charge's failure is journaled)
        orc.signal("ask", "new-card", "5555")
        result = orc.resume("ask")
    # Then the same except caught the same error, with its arguments and attributes, and the card
    # service saw one charge
    assert result.status == "completed", result.error
    assert result.state == {"card": "5555", "declined": "do_not_honor"}
    assert seen == [(Declined, ("4242", "do_not_honor"), "do_not_honor", False)] * 2
    assert ledger.read_text().splitlines() == ["charge"]


def _declined(ledger: Path) -> None:
    with ledger.open("a") as out:
        out.write("charge\n")
    raise Declined("4242", "do_not_honor")


# -- what a journal may name, and what is made of it ------------------------------------------------
def _error(type_name: str, **more) -> dict:
    return {"type": type_name, "message": "no", **more}


def test_the_raised_again_error_says_so_in_a_note_and_runs_none_of_the_class_code(monkeypatch):
    # Given a class of the user's whose constructor has a side effect
    made: list = []
    module = types.ModuleType("userland_noisy")

    class Noisy(Exception):
        def __init__(self, *args):
            made.append(args)
            super().__init__(*args)

    Noisy.__module__, Noisy.__qualname__ = "userland_noisy", "Noisy"
    module.Noisy = Noisy
    monkeypatch.setitem(sys.modules, "userland_noisy", module)
    # When a journaled failure naming it is raised again
    error = recorded_error(_error("userland_noisy.Noisy", args=["a", 1], attrs={"code": 7}, status=402), "pay",
                           "call 0")
    # Then it is a Noisy with those arguments and attributes (a field journaled beside the type too),
    # its __init__ not run, and its note says why
    assert type(error) is Noisy and error.args == ("a", 1) and error.code == 7 and error.status == 402
    assert made == []
    assert error.__notes__ == ["raised again from the journal: call 0 of step 'pay' failed earlier in this "
                               "attempt and is not performed again"]


def test_a_class_whose_module_is_not_imported_is_not_imported_to_find_it():
    # Given a journal naming a class of a module this process has not imported
    assert "json.tool" not in sys.modules
    # When it is raised again
    error = recorded_error(_error("json.tool.Nothing"), "pay", "call 0")
    # Then it is a CallFailedError naming it, and nothing was imported
    assert type(error) is CallFailedError and error.type_name == "json.tool.Nothing"
    assert "json.tool" not in sys.modules


@pytest.mark.parametrize("type_name", [
    "orchestrator.engine.durable.Suspend",        # the engine's control flow: never made from a journal
    "orchestrator.engine.services.NotJournaled",
    "workflows.Workflow",                          # not an exception
    "os.system",                                   # not a class
    "userland_odd.Alias",                          # another name bound to a class: not its own name
    "userland_odd.WithNew",                        # a __new__ of its own would run user code
    "userland_odd.Hooked",                         # only found through the module's __getattr__
    "userland_odd.Base.__subclasses__",            # not a class
])
def test_what_is_not_made_from_a_journal(type_name, monkeypatch):
    # Given a module of the user's with an alias, a class with its own __new__, and an attribute hook
    called: list = []
    module = types.ModuleType("userland_odd")

    class Base(Exception):
        pass

    class WithNew(Exception):
        def __new__(cls, *args):
            called.append("__new__")
            return super().__new__(cls, *args)

    for cls in (Base, WithNew):
        cls.__module__, cls.__qualname__ = "userland_odd", cls.__name__
    module.Base, module.WithNew, module.Alias = Base, WithNew, Base
    module.__getattr__ = lambda name: called.append(name) or Base
    monkeypatch.setitem(sys.modules, "userland_odd", module)
    # When a journaled failure naming it is raised again
    error = recorded_error(_error(type_name), "pay", "call 0")
    # Then it is a CallFailedError naming it, and no code of the module ran
    assert type(error) is CallFailedError and error.type_name == type_name
    assert called == []


def test_a_class_defined_in_the_running_script_is_found_there(monkeypatch):
    # Given a class of __main__ (journaled by its bare name)
    main = types.ModuleType("__main__")

    class ScriptError(Exception):
        pass

    ScriptError.__module__, ScriptError.__qualname__ = "__main__", "ScriptError"
    main.ScriptError = ScriptError
    monkeypatch.setitem(sys.modules, "__main__", main)
    # When it is raised again / Then it is itself
    error = recorded_error(_error("ScriptError", args=["x"]), "pay", "call 0")
    assert type(error) is ScriptError and error.args == ("x",)


def test_what_a_call_failure_keeps_of_the_error():
    class Odd(Exception):
        def __init__(self, handle, blob):
            super().__init__("odd")
            self.handle = handle           # not JSON: left out
            self.blob = blob               # too big: left out
            self.code = 3
            self.__secret_dunder__ = 1     # a dunder name: left out

    # When the failure of a call that raised it is recorded
    fields = failure_fields(Odd(object(), "x" * 10_000))
    # Then its message argument is the message (no args), and only what the journal can hold is kept
    assert fields == {"attrs": {"code": 3}}
    assert failure_fields(ValueError("a", 2)) == {"args": ["a", 2]}
    assert failure_fields(Declined("4242", "x"))["args"] == ["4242", "x"]


def test_a_class_journaled_from_a_script_is_found_in_the_step_module_the_app_imported(monkeypatch):
    # Given a class journaled by its bare name (the run was started by `python agent.py`), resumed
    # where that file is imported as module `agent` (`agentsaga resume --app agent.py`)
    app = types.ModuleType("agent")

    class ScriptError(Exception):
        pass

    ScriptError.__module__, ScriptError.__qualname__ = "agent", "ScriptError"
    app.ScriptError = ScriptError
    monkeypatch.setitem(sys.modules, "agent", app)
    # When its failure is raised again in a step whose function lives in `agent`
    error = recorded_error(_error("ScriptError"), "pay", "call 0", homes=("agent",))
    # Then it is that class
    assert type(error) is ScriptError
    assert type(recorded_error(_error("ScriptError"), "pay", "call 0")) is CallFailedError


def test_an_error_whose_str_and_fields_raise_is_still_recorded():
    class Broken(Exception):
        def __str__(self):
            raise RuntimeError("no str")

        @property
        def status(self):
            raise RuntimeError("no status")

    # When the failure of a call that raised it is recorded / Then what can be kept is kept
    assert failure_fields(Broken("a")) == {"args": ["a"]}


class Picky(Exception):
    """An error class with a ``__new__`` of its own: never made from a journal."""

    def __new__(cls, *args):
        return super().__new__(cls, *args)


def test_an_error_that_cannot_be_made_again_is_still_given_up_on_by_its_name(db_url, tmp_path):
    # Given a step whose charge raises Picky (which comes back as a CallFailedError naming it), and
    # whose Retry gives up on Picky; the step caught it the first time and waited before raising it
    ledger = tmp_path / "ledger"
    wf = Workflow("picky-give-up")

    def charge():
        with ledger.open("a") as out:
            out.write("charge\n")
        raise Picky("declined")


    @wf.step(start=True, retry=Retry(attempts=3, initial=0.01, give_up_on=(Picky,)))
    def pay(ctx, state):
        try:
            ctx.durable_call("charge", {"card": "4242"}, charge)
        except Picky:
            ctx.wait_for("go")
            raise
        return {}

    wf.edge("pay", END)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="picky").status == "waiting"
        # When the step runs again (its charge's failure journaled) and the error reaches the Retry
        orc.signal("picky", "go", True)
        result = orc.resume("picky")
        kinds = [e["kind"] for e in orc.history("picky")]
    # Then the Retry gave up on it by its recorded name: the card was charged once
    assert result.status == "failed"
    assert "Picky" in result.error
    assert ledger.read_text().splitlines() == ["charge"]
    assert "StepRetrying" not in kinds


def test_a_class_nested_in_a_class_of_the_running_script_is_found_there(monkeypatch):
    # Given a class nested in a class of __main__ (journaled as "Outer.Nested", no module)
    main = types.ModuleType("__main__")

    class Outer:
        class Nested(Exception):
            pass

    Outer.__module__, Outer.__qualname__ = "__main__", "Outer"
    Outer.Nested.__module__, Outer.Nested.__qualname__ = "__main__", "Outer.Nested"
    main.Outer = Outer
    monkeypatch.setitem(sys.modules, "__main__", main)
    # When it is raised again / Then it is itself
    assert type(recorded_error(_error("Outer.Nested"), "pay", "call 0")) is Outer.Nested
