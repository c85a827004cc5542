"""Exactly-once when a signal, a wait or a saga meets a crash: each case a regression test, on SQLite and Postgres.

The cases are the ones a review reproduced against the engine (a signal and parking, a signal and a
wait not yet reached, a rollback and a wait, a crash and a lost compensation), and the one the
crash-point explorer under ``tests/explorer`` found (a parked run taken over by a process that
died). The explorer sweeps every crash point; these tests pin each case by name. The journal's cases
are in test_exactly_once_journal.py, the effects' in test_exactly_once_effects.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from exactly_once_helpers import Died, kinds

from orchestrator.engine import EventKind
from workflows import END, Workflow


# -- case 7: rollback does not reuse what came after the checkpoint --------------------------------------
def test_after_a_rollback_a_signal_received_after_the_checkpoint_is_not_reused(orc_factory):
    # Given a draft that is approved by a signal, the process dying after the approval was received
    wf = Workflow("drafts")
    versions = []
    die = {"after_approval": True}

    @wf.step(start=True)
    def draft(ctx, state):
        versions.append(len(versions) + 1)
        return {"draft": f"v{versions[-1]}"}

    @wf.step()
    def approve(ctx, state):
        data = ctx.wait_for("approval")
        if die["after_approval"]:
            die["after_approval"] = False
            raise Died
        return {"approved": data["draft"]}

    wf.edge("draft", "approve")
    wf.edge("approve", END)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="d1").status == "waiting"
    orc.signal("d1", "approval", {"draft": "v1"})
    with pytest.raises(Died):
        orc.resume("d1")
    # When the run is rolled back to before the draft (a new draft is made)
    result = orc_factory(wf).rollback("d1", to="draft")
    # Then the new draft waits for an approval of its own instead of reusing v1's
    assert versions == [1, 2]
    assert result.status == "waiting"
    orc.signal("d1", "approval", {"draft": "v2"})
    assert orc.resume("d1").state["approved"] == "v2"
    assert orc.verify("d1").ok


# -- case 8: a compensation that cannot be found --------------------------------------------------------
def booking_flow(compensate):
    wf = Workflow("trip")

    @wf.step(start=True, effect=True, compensate=compensate)
    def book(ctx, state):
        return {"booking": "B-1"}

    @wf.step()
    def pay(ctx, state):
        raise RuntimeError("card declined")

    wf.edge("book", "pay")
    wf.edge("pay", END)
    return wf


def test_a_missing_compensation_ends_compensation_failed_naming_the_effect(orc_factory):
    # Given a booking made while its step had a compensation, and the process dying before paying
    undone = []

    def cancel_booking(ctx, effect):
        undone.append(effect.result["booking"])

    wf = booking_flow(cancel_booking)
    orc = orc_factory(wf)
    real = orc.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if any(e.kind == EventKind.STEP_COMPLETED for e in events):
            raise Died
        return out

    orc.store.append = append
    with pytest.raises(Died):
        orc.run(wf, {}, run_id="t1")
    # When the code lost the compensation, the change is detected like any graph change
    changed = booking_flow(None)
    with pytest.raises(Exception, match="compensat"):
        orc_factory(changed).resume("t1")
    # And when resumed anyway (allow_graph_change) the saga does not claim to have compensated
    result = orc_factory(changed).resume("t1", allow_graph_change=True)
    assert undone == []
    assert result.status == "compensation_failed"
    assert "book" in result.error and "compensation" in result.error


# -- case 6: a signal is never lost --------------------------------------------------------------------------
def test_a_signal_sent_between_the_steps_look_and_the_park_wakes_the_run(orc_factory):
    # Given a step waiting for approval, and the approval sent just after the step looked for it
    wf = Workflow("approval")

    @wf.step(start=True)
    def approve(ctx, state):
        return {"by": ctx.wait_for("approval")["by"]}

    wf.edge("approve", END)
    orc = orc_factory(wf)
    sender = orc_factory(wf)
    real_pending = orc.store.signals.pending

    def pending_then_signal(run_id, name=None):
        found = real_pending(run_id, name)
        if not found:
            sender.signal(run_id, "approval", {"by": "ann"})  # lands after the look, before the park
        return found

    orc.store.signals.pending = pending_then_signal
    # When the run parks
    assert orc.run(wf, {}, run_id="a1").status == "waiting"
    # Then it is due at once: recovery drives it to the end with the approval, consumed exactly once
    results = orc_factory(wf).recover()
    assert [(r.run_id, r.status) for r in results] == [("a1", "completed")]
    assert orc.result("a1").state["by"] == "ann"
    assert kinds(orc, "a1").count(EventKind.SIGNAL_RECEIVED) == 1


def test_a_signal_for_a_wait_not_yet_reached_is_kept_and_delivered_once(orc_factory):
    # Given a run waiting for a first signal
    wf = Workflow("two-waits")

    @wf.step(start=True)
    def first(ctx, state):
        return {"a": ctx.wait_for("first")}

    @wf.step()
    def second(ctx, state):
        return {"b": ctx.wait_for("second")}

    wf.edge("first", "second")
    wf.edge("second", END)
    orc = orc_factory(wf)
    assert orc.run(wf, {}, run_id="w2").status == "waiting"
    # When the second signal is sent before the first, then the first
    orc.signal("w2", "second", 2)
    orc.signal("w2", "first", 1)
    # Then both are delivered, each exactly once
    result = orc.resume("w2")
    assert result.status == "completed" and result.state == {"a": 1, "b": 2}
    assert kinds(orc, "w2").count(EventKind.SIGNAL_RECEIVED) == 2


# -- found by the crash-point explorer (tests/explorer): a run taken over while parked ----------------------
def _reviewed_flow() -> Workflow:
    wf = Workflow("reviewed")

    @wf.step(start=True)
    def draft(ctx, state):
        return {"draft": "v2" if state.get("feedback") else "v1"}

    @wf.step()
    def approve(ctx, state):
        return {"approved": ctx.wait_for("approval")["by"]}

    wf.edge("draft", "approve")
    wf.edge("approve", END)
    return wf


def test_a_waiting_run_whose_rollback_died_midway_is_recovered_once_its_lease_expires(orc_factory, fake_time):
    # Given a run parked until a signal comes (no timeout)
    wf = _reviewed_flow()
    orc = orc_factory(wf, lease_ttl=5)
    assert orc.run(wf, {}, run_id="rv").status == "waiting"
    # When a rollback takes it over and its process dies once the saga's start is journaled
    dying = orc_factory(wf, lease_ttl=5)
    real = dying.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if any(e.kind == EventKind.SAGA_STARTED for e in events):
            raise Died
        return out

    dying.store.append = append
    with pytest.raises(Died):
        dying.rollback("rv", to="draft", input={"feedback": 1})
    # Then, once the dead owner's lease expired, recovery in a new process picks the run up (it is no
    # longer parked: the wake-up time of the wait it left must not hide it) and the rollback completes
    fake_time.advance(60)
    results = orc_factory(wf, lease_ttl=5).recover()
    assert [(r.run_id, r.status) for r in results] == [("rv", "waiting")]
    assert orc.result("rv").state["draft"] == "v2"
    assert EventKind.ROLLED_BACK in kinds(orc, "rv")
    assert orc.verify("rv").ok


def test_a_waiting_run_resumed_by_a_process_that_died_is_recovered_once_its_lease_expires(orc_factory, fake_time):
    # Given a run parked until a signal comes, explicitly resumed by a process that dies at once
    wf = _reviewed_flow()
    orc = orc_factory(wf, lease_ttl=5)
    assert orc.run(wf, {}, run_id="rw").status == "waiting"
    dying = orc_factory(wf, lease_ttl=5)
    real = dying.store.append

    def append(run_id, events, **kw):
        out = real(run_id, events, **kw)
        if any(e.kind == EventKind.RESUMED for e in events):
            raise Died
        return out

    dying.store.append = append
    with pytest.raises(Died):
        dying.resume("rw")
    # When the signal is sent, and the dead owner's lease has expired
    orc.signal("rw", "approval", {"by": "ann"})
    fake_time.advance(60)
    # Then recovery picks the run up and it completes with the approval
    results = orc_factory(wf, lease_ttl=5).recover()
    assert [(r.run_id, r.status) for r in results] == [("rw", "completed")]
    assert orc.result("rw").state["approved"] == "ann"


# -- the explorer found: an effect made again after a rollback reused a key of the first one's requests ---
def test_an_effect_made_again_after_a_rollback_sends_none_of_the_keys_its_undone_requests_used(orc_factory):
    from orchestrator.testing import BookingService

    # Given an effect step that rents two vans (two requests: keys `key` and `key:1`), then waits
    wf = Workflow("vans")

    @wf.step(start=True)
    def plan(ctx, state):
        return {"round": state.get("round", 0)}

    def return_vans(ctx, effect):
        for van in reversed(effect.result["vans"]):
            ctx.http.delete(f"{state_api['url']}/cars/{van}")

    @wf.step(effect=True, compensate=return_vans)
    def rent(ctx, state):
        first = ctx.http.post(f"{state_api['url']}/cars", json={"car": "van"}).json()
        second = ctx.http.post(f"{state_api['url']}/cars", json={"car": "van"}).json()
        return {"vans": [first["id"], second["id"]]}

    @wf.step()
    def approve(ctx, state):
        return {"approved": ctx.wait_for("go")}

    wf.edge("plan", "rent")
    wf.edge("rent", "approve")
    wf.edge("approve", END)
    state_api = {}
    with BookingService() as service:
        state_api["url"] = service.url
        orc = orc_factory(wf)
        assert orc.run(wf, {}, run_id="vans").state["vans"] == ["car-1", "car-2"]
        # When the run is rolled back to before the rental, which then runs again
        result = orc.rollback("vans", to="plan", input={"round": 1})
        ledger = service.ledger()
    # Then the first two vans were returned, and two new vans were rented: no request of the new
    # rental was answered with a booking of the undone one (its keys are its own)
    assert result.status == "waiting", result.error
    assert [e["id"] for e in ledger if e["action"] == "cancel"] == ["car-2", "car-1"]
    assert [e["action"] for e in ledger].count("replay") == 0, ledger
    assert result.state["vans"] == ["car-3", "car-4"]
    keys = [e["idempotency_key"] for e in ledger if e["action"] == "book"]
    assert len(set(keys)) == 4, keys


def test_an_effect_in_flight_whose_key_was_journaled_in_the_earlier_format_is_re_sent_with_that_key(
        db_url, orc_factory):
    from audit_helpers import raw_sql

    from orchestrator.testing import BookingService

    # Given a run rolled back once, whose effect step died after its key left, its intent journaled
    # (as versions before the `:r{n}` suffix wrote it) with the key `vans:rent:1:1`
    wf = Workflow("vans")
    dies = {"again": True}
    api = {}

    @wf.step(start=True)
    def plan(ctx, state):
        return {"round": state.get("round", 0)}

    @wf.step(effect=True, compensate=lambda ctx, effect: None)
    def rent(ctx, state):
        if state["round"] == 1 and dies["again"]:
            dies["again"] = False
            ctx.idempotency_key  # the key leaves (KeyIssued), then the process dies before the request
            raise Died
        return {"van": ctx.http.post(f"{api['url']}/cars", json={"car": "van"}).json()["id"]}

    @wf.step()
    def approve(ctx, state):
        return {"approved": ctx.wait_for("go")}

    wf.edge("plan", "rent")
    wf.edge("rent", "approve")
    wf.edge("approve", END)
    with BookingService() as service:
        api["url"] = service.url
        orc = orc_factory(wf, snapshot_every=1000)
        assert orc.run(wf, {}, run_id="vans").status == "waiting"
        with pytest.raises(Died):
            orc.rollback("vans", to="plan", input={"round": 1})
        started = [e for e in orc.history("vans") if e["kind"] == "StepStarted"][-1]
        assert started["data"]["key"] == "vans:rent:1:r1"
        old = {**started["data"], "key": "vans:rent:1:1"}
        raw_sql(db_url, "UPDATE agentsaga_events SET data = ? WHERE seq = ? AND run_pk = "
                        "(SELECT pk FROM agentsaga_runs WHERE run_id = ?)",
                (json.dumps(old), started["seq"], "vans"))
        raw_sql(db_url, "DELETE FROM agentsaga_snapshots WHERE seq >= ? AND run_pk = "
                        "(SELECT pk FROM agentsaga_runs WHERE run_id = ?)", (started["seq"], "vans"))
        # When a new process resumes it
        result = orc_factory(wf).resume("vans")
        ledger = service.ledger()
    # Then the effect is re-sent with the key its intent carries, not with one made anew
    assert result.status == "waiting", result.error
    assert [e["idempotency_key"] for e in ledger if e["action"] == "book"][-1] == "vans:rent:1:1"
