"""A fork never starts from an effect its parent undid (docs/audit.md "fork"), on SQLite and Postgres.

A fork point is the state before a step's latest execution. When that state holds the result of an
effect the parent's saga (or a rollback) compensated since, the fork would continue from a
cancelled booking as if it stood: it is refused with one line naming the parent, the step, each
undone effect and the nearest fork points whose state holds none, and nothing is written. A fork
before the first undone effect books anew under its own idempotency keys; a parent whose effects
were never undone forks as before. The library and the real console script are both exercised.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Orchestrator, RunNotFoundError, RunStateError
from workflows import END, Workflow

sys.path.insert(0, str(Path(__file__).parent))

from ledger_helpers import Ledger  # noqa: E402


def trip(ledger: Ledger, card: dict[str, bool], *, compensate: bool = True) -> Workflow:
    """quote (plain) -> book_flight (effect) -> book_hotel (effect) -> pay (fails while the card is declined).
    Without ``compensate`` the bookings have no compensation: a failed run leaves them standing."""
    wf = Workflow("trip")

    def cancel(ctx, effect):
        ledger.cancel(next(iter(effect.result.values())))

    undo = cancel if compensate else None

    @wf.step(start=True)
    def quote(ctx, state):
        return {"price": 300}

    @wf.step(effect=True, compensate=undo)
    def book_flight(ctx, state):
        return {"flight": ledger.book("flight", ctx.idempotency_key)}

    @wf.step(effect=True, compensate=undo)
    def book_hotel(ctx, state):
        return {"hotel": ledger.book("hotel", ctx.idempotency_key)}

    @wf.step()
    def pay(ctx, state):
        if not card["ok"]:
            raise PermissionError("card declined")
        return {"paid": state["price"]}

    wf.edge("quote", "book_flight")
    wf.edge("book_flight", "book_hotel")
    wf.edge("book_hotel", "pay")
    wf.edge("pay", END)
    return wf


def seq_of(history: list[dict], kind: str, step: str, *, effect: int | None = None) -> int:
    return next(e["seq"] for e in history if e["kind"] == kind and e["data"].get("step") == step
                and (effect is None or e["data"].get("effect") == effect))


def test_fork_of_a_compensated_booking_run_at_its_failed_step_is_refused_and_writes_nothing(db_url):
    # Given a run that booked a flight and a hotel, then failed to pay: its saga cancelled both
    ledger, card = Ledger(), {"ok": False}
    wf = trip(ledger, card)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="t1").status == "compensated"
        history = orc.history("t1")
        flight, hotel = seq_of(history, "StepCompleted", "book_flight"), seq_of(history, "StepCompleted", "book_hotel")
        flight_undone = seq_of(history, "CompensationCompleted", "book_flight", effect=flight)
        hotel_undone = seq_of(history, "CompensationCompleted", "book_hotel", effect=hotel)
        quoted = seq_of(history, "StepCompleted", "quote")
        world = (dict(ledger.booked), list(ledger.cancelled))
        card["ok"] = True  # the card is fixed
        # When it is forked at the step that failed, to try the payment again
        with pytest.raises(RunStateError) as refused:
            orc.fork("t1", from_step="pay", run_id="t1-retry")
        # Then it is refused in one line naming the parent, the step, both undone effects and the
        # nearest fork point whose state holds none (the flight's: its state has only the quote)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith("run 't1' cannot be forked at step 'pay': ")
        assert (f"step 'book_flight' (seq {flight}, compensated at seq {flight_undone}), "
                f"step 'book_hotel' (seq {hotel}, compensated at seq {hotel_undone})") in message
        assert f"Fork it at step 'book_flight' (its state at seq {quoted}) instead" in message
        assert message.endswith("Nothing was written")
        # And nothing was written: no child run, the parent's journal as it was, nothing booked or cancelled
        with pytest.raises(RunNotFoundError):
            orc.get_run("t1-retry")
        assert [r.run_id for r in orc.list_runs()] == ["t1"]
        assert orc.history("t1") == history
        assert (ledger.booked, ledger.cancelled) == world
        # When it is forked at the hotel booking, whose state holds the (cancelled) flight
        with pytest.raises(RunStateError) as refused:
            orc.fork("t1", from_step="book_hotel")
        # Then that is refused too, naming only the flight, and still nothing is written
        message = str(refused.value)
        assert f"step 'book_flight' (seq {flight}, compensated at seq {flight_undone})" in message
        assert "'book_hotel' (seq" not in message
        assert [r.run_id for r in orc.list_runs()] == ["t1"]


def test_fork_before_the_first_undone_effect_books_anew_with_its_own_idempotency_keys(db_url):
    # Given the compensated booking run, and the card fixed
    ledger, card = Ledger(), {"ok": False}
    wf = trip(ledger, card)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="t1").status == "compensated"
        parent_keys = {e["data"]["step"]: e["data"]["key"] for e in orc.history("t1")
                       if e["kind"] == "StepCompleted" and e["data"].get("effect")}
        cancelled = set(ledger.cancelled)
        assert set(parent_keys) == {"book_flight", "book_hotel"} and len(cancelled) == 2
        card["ok"] = True
        # When it is forked at its first booking (the nearest fork point the refusal names)
        child = orc.fork("t1", from_step="book_flight", run_id="t2")
        first = orc.history(child)[0]["data"]
        # Then the child starts from the state before any effect: the quote, no booking
        assert first["input"] == {"price": 300} and first["start"] == ["book_flight"]
        assert first["parent"]["run_id"] == "t1" and first["parent"]["step"] == "book_flight"
        # And driven, it books anew under its own idempotency keys, and pays
        result = orc.resume(child)
        assert result.status == "completed", result.error
        child_keys = {e["data"]["step"]: e["data"]["key"] for e in orc.history(child)
                      if e["kind"] == "StepCompleted" and e["data"].get("effect")}
        assert set(child_keys) == {"book_flight", "book_hotel"}
        assert not set(child_keys.values()) & set(parent_keys.values())
        # And what stands in the world is exactly the child's bookings; the parent's stay cancelled
        assert ledger.in_force() == {result.state["flight"], result.state["hotel"]}
        assert ledger.in_force().isdisjoint(cancelled)
        assert result.state["paid"] == 300
        # And a fork at the run's start works as well
        assert orc.history(orc.fork("t1", from_step="quote"))[0]["data"]["input"] == {}
        # And the parent is untouched
        assert orc.get_run("t1").status == "compensated"


def test_fork_of_a_failed_run_whose_effects_were_never_undone_works_as_before(db_url):
    # Given a run whose bookings have no compensation: it fails at pay and they stand
    ledger, card = Ledger(), {"ok": False}
    wf = trip(ledger, card, compensate=False)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        assert orc.run(wf, {}, run_id="f1").status == "failed"
        assert not any(e["kind"] == "CompensationCompleted" for e in orc.history("f1"))
        booked = dict(ledger.booked)
        card["ok"] = True
        # When it is forked at the failed step
        child = orc.fork("f1", from_step="pay", run_id="f2")
        # Then the child starts from the state pay saw, bookings included, and completes without booking again
        first = orc.history(child)[0]["data"]
        assert first["input"] == {"price": 300, "flight": "flight-1", "hotel": "hotel-2"}
        result = orc.resume(child)
        assert result.status == "completed" and result.state["paid"] == 300
        assert ledger.booked == booked and ledger.cancelled == []


# -- the command line ------------------------------------------------------------------------------
FLOWS = '''\
import os
from pathlib import Path

from workflows import END, Workflow

LEDGER = Path(os.environ["FORK_LEDGER"])

trip = Workflow("trip")


def cancel(ctx, effect):
    with open(LEDGER / "cancelled", "a") as fh:
        fh.write(effect.result["flight"] + "\\n")


@trip.step(start=True, effect=True, compensate=cancel)
def book_flight(ctx, state):
    with open(LEDGER / "booked", "a") as fh:
        fh.write(ctx.idempotency_key + "\\n")
    return {"flight": "F-" + ctx.idempotency_key}


@trip.step
def pay(ctx, state):
    if not (LEDGER / "card-ok").exists():
        raise PermissionError("card declined")
    return {"paid": True}


trip.edge("book_flight", "pay")
trip.edge("pay", END)
'''


def agentsaga(project: Path, *args: str) -> subprocess.CompletedProcess:
    """The console script, run in the project directory as a person would run it."""
    exe = Path(sys.executable).parent / "agentsaga"
    found = str(exe) if exe.exists() else shutil.which("agentsaga")
    assert found, "the agentsaga console script is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSAGA_")}
    env["FORK_LEDGER"] = str(project / "ledger")
    return subprocess.run([found, *args], cwd=project, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow
def test_the_cli_refuses_a_fork_from_an_undone_booking_in_one_line_with_exit_1(tmp_path, db_url):
    # Given a run, started from the command line, whose flight booking its saga cancelled
    (tmp_path / "ledger").mkdir()
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    ran = agentsaga(tmp_path, "run", "trip", "--app", "flows.py", "--run-id", "t1", "--db", db_url)
    assert ran.returncode == 1 and "status compensated" in ran.stdout, ran.stderr
    (tmp_path / "ledger" / "card-ok").touch()
    # When it is forked at the failed step
    forked = agentsaga(tmp_path, "fork", "t1", "--from", "pay", "--run-id", "t1-retry", "--run", "--app", "flows.py",
                       "--db", db_url)
    # Then the fork is refused: exit 1, one line on stderr naming the parent, the step, the undone
    # booking and where a fork can start, nothing on stdout
    assert forked.returncode == 1, forked.stdout + forked.stderr
    assert forked.stdout == ""
    [line] = forked.stderr.splitlines()
    assert re.fullmatch(
        r"agentsaga: error: run 't1' cannot be forked at step 'pay': .* undid since: "
        r"step 'book_flight' \(seq \d+, compensated at seq \d+\); .* "
        r"Fork it at step 'book_flight' \(its state at seq 1, the run's start\) instead, .*Nothing was written", line)
    # And no run was created, nothing was booked again
    runs = [json.loads(r) for r in agentsaga(tmp_path, "runs", "--json", "--db", db_url).stdout.splitlines()]
    assert [r["run_id"] for r in runs] == ["t1"]
    assert len((tmp_path / "ledger" / "booked").read_text().split()) == 1
    # When it is forked where the refusal says, and driven at once
    again = agentsaga(tmp_path, "fork", "t1", "--from", "book_flight", "--run-id", "t2", "--run", "--app", "flows.py",
                      "--db", db_url)
    # Then the fork books anew under its own key and completes
    assert again.returncode == 0, again.stderr
    assert "run t2" in again.stdout and "status completed" in again.stdout
    booked = (tmp_path / "ledger" / "booked").read_text().split()
    assert len(booked) == 2 and booked[0].startswith("t1:") and booked[1].startswith("t2:")
