"""Snapshot policies as data, per workflow: every N events, every T seconds (the injected clock),
after effects, at gates, adaptive (its choice and inputs journaled), combined. SQLite and Postgres."""

from __future__ import annotations

import json

import pytest

from workflows import END, Adaptive, DefinitionError, Snapshots, Workflow, reducers


def chain(name: str = "chain", *, snapshots=None, effect_at: str | None = None, steps: int = 6,
          clock=None, tick: float = 0.0) -> Workflow:
    """Steps s1..sN in a row; each adds its number to a list; ``effect_at`` is an effect step;
    with ``clock`` each step advances the fake clock by ``tick`` seconds."""
    wf = Workflow(name, snapshots=snapshots)
    names = [f"s{i}" for i in range(1, steps + 1)]
    for i, step in enumerate(names, 1):
        def body(ctx, state, i=i):
            if clock is not None:
                clock.advance(tick)
            return {"done": state.get("done", []) + [i]}
        wf.step(name=step, effect=step == effect_at)(body)
    wf.sequence(*names, END)
    return wf


def catalog(orc, run_id):
    return sorted((s.seq, s.trigger) for s in orc.snapshots(run_id))


def step_seq(orc, run_id, step):
    return next(e["seq"] for e in orc.history(run_id) if e["kind"] == "StepCompleted" and e["data"]["step"] == step)


# -- each condition --------------------------------------------------------------------------------
def test_every_n_events_is_the_default_and_the_orchestrator_settings_apply(orc_factory):
    # Given a workflow that declares no policy, on an orchestrator snapshotting every 3 events
    wf = chain()
    orc = orc_factory(wf, snapshot_every=3, keep_snapshots=10)
    # When a run of 6 steps (8 events with start and end) completes
    orc.run(wf, {}, run_id="p")
    # Then snapshots were written at seq 3 and 6 by count and at the end
    assert catalog(orc, "p") == [(3, "periodic"), (6, "periodic"), (8, "final")]


def test_a_workflows_own_every_and_keep_override_the_orchestrators(orc_factory):
    wf = chain(snapshots=Snapshots(every=2, keep=2, incremental=None))
    orc = orc_factory(wf, snapshot_every=100, keep_snapshots=10)
    orc.run(wf, {}, run_id="own")
    assert catalog(orc, "own") == [(6, "periodic"), (8, "final")]


def test_every_t_seconds_of_run_time_with_the_injected_clock(orc_factory, fake_time):
    # Given a policy of one snapshot per 10 s and no count, and steps that take 4 s each
    wf = chain(snapshots=Snapshots(every=None, seconds=10, keep=10), clock=fake_time, tick=4, steps=7)
    orc = orc_factory(wf)
    # When the run completes
    orc.run(wf, {}, run_id="t")
    # Then a snapshot was taken at the first commit 10 s or more after the last one (steps 3 and 6;
    # step 7 ends the run, whose snapshot is the final one)
    timed = [seq for seq, trigger in catalog(orc, "t") if trigger == "timed"]
    assert timed == [step_seq(orc, "t", "s3"), step_seq(orc, "t", "s6")]
    times = [s.created_at for s in sorted(orc.snapshots("t"), key=lambda s: s.seq) if s.trigger == "timed"]
    assert times[1] - times[0] >= 10


def test_after_each_completed_effect(orc_factory):
    wf = chain(snapshots=Snapshots(every=None, after_effects=True), effect_at="s4")
    orc = orc_factory(wf)
    orc.run(wf, {}, run_id="e")
    assert (step_seq(orc, "e", "s4"), "effect") in catalog(orc, "e")
    assert [t for _, t in catalog(orc, "e")] == ["effect", "final"]


def test_at_declared_gates(orc_factory):
    wf = chain(snapshots=Snapshots(every=None, gates=["s2", "s5"], keep=10))
    orc = orc_factory(wf)
    orc.run(wf, {}, run_id="g")
    assert catalog(orc, "g") == [(step_seq(orc, "g", "s2"), "gate:s2"), (step_seq(orc, "g", "s5"), "gate:s5"),
                                 (8, "final")]


def test_policies_combine(orc_factory, fake_time):
    # Given a hybrid: every 3 events, after effects, at a gate
    wf = chain(snapshots=Snapshots(every=3, after_effects=True, gates=["s2"], keep=10), effect_at="s3", steps=8)
    orc = orc_factory(wf)
    orc.run(wf, {}, run_id="h")
    # Then each condition wrote its snapshot, and the count restarts from the last snapshot
    effect = step_seq(orc, "h", "s3")
    last = orc.history("h")[-1]["seq"]
    assert catalog(orc, "h") == [(3, "gate:s2"), (effect, "effect"), (effect + 3, "periodic"), (last, "final")]


def test_the_catalogs_configuration_hash_follows_the_policy(orc_factory):
    a, b = chain("a", snapshots=Snapshots(every=2)), chain("b", snapshots=Snapshots(every=3))
    orc = orc_factory(a, b)
    orc.run(a, {}, run_id="a")
    orc.run(b, {}, run_id="b")
    assert orc.snapshots("a")[0].config_hash != orc.snapshots("b")[0].config_hash


def test_replay_ratio_waits_until_the_journal_since_holds_the_snapshots_bytes(orc_factory):
    # Given a conversation whose state grows by ~1 KB a step, snapshotting every 2 events, but only
    # once the events since the last snapshot are at least as large as it
    wf = Workflow("talk", reducers={"log": reducers.append}, snapshots=Snapshots(every=2, replay_ratio=1.0, keep=50))

    @wf.step(start=True)
    def say(ctx, state):
        return {"n": state["n"] + 1, "log": "w" * 1000}

    wf.route("say", lambda s: "say" if s["n"] < 40 else END)
    orc = orc_factory(wf)
    orc.run(wf, {"n": 0, "log": []}, run_id="talk")
    # Then the periodic snapshots thin out as the state grows: each one is preceded by at least as
    # many journaled bytes as the snapshot before it holds
    periodic = sorted((s.seq, s.size_bytes) for s in orc.snapshots("talk") if s.trigger == "periodic")
    gaps = [b[0] - a[0] for a, b in zip(periodic, periodic[1:])]
    assert len(periodic) >= 3 and gaps == sorted(gaps) and gaps[-1] > gaps[0] >= 2
    events = {e["seq"]: len(json.dumps(e["data"])) for e in orc.history("talk")}
    for (seq_a, size_a), (seq_b, _) in zip(periodic, periodic[1:]):
        assert sum(events[s] for s in range(seq_a + 1, seq_b + 1)) >= 0.9 * size_a


# -- adaptive ----------------------------------------------------------------------------------------
def _crashing(name: str, policy: Snapshots, *, crash: bool) -> Workflow:
    wf = Workflow(name, snapshots=policy)

    @wf.step(start=True)
    def work(ctx, state):
        if crash:
            raise KeyboardInterrupt  # the process dies: the run stays leased
        return {"ok": True}

    wf.edge("work", END)
    return wf


def test_adaptive_snapshots_more_often_after_crashes_and_journals_why(orc_factory, fake_time):
    policy = Snapshots(adaptive=Adaptive(min_every=5, max_every=400, window=10, full_at=0.5))
    # Given a workflow none of whose runs ever failed
    calm = _crashing("calm", policy, crash=False)
    orc = orc_factory(calm, lease_ttl=30)
    for i in range(4):
        orc.run(calm, {}, run_id=f"calm{i}")
    # Then its runs are snapshotted at the upper bound, and the choice and its inputs are journaled
    chosen = [e["data"] for e in orc.history("calm3") if e["kind"] == "SnapshotPolicy"]
    assert chosen == [{"every": 400, "policy": "adaptive", "bounds": [5, 400],
                       "inputs": {"window": 10, "runs": 3, "troubled": 0, "rate": 0.0, "full_at": 0.5}}]
    # Given another workflow whose runs crashed and were recovered
    stormy = _crashing("stormy", policy, crash=True)
    orc2 = orc_factory(stormy, lease_ttl=30)
    for i in range(2):
        with pytest.raises(KeyboardInterrupt):
            orc2.run(stormy, {}, run_id=f"storm{i}")
    fake_time.advance(31)
    healed = _crashing("stormy", policy, crash=False)
    rescuer = orc_factory(healed, lease_ttl=30)
    assert {r.status for r in rescuer.recover()} == {"completed"}
    # When a new run of it starts
    rescuer.run(healed, {}, run_id="storm-next")
    # Then its interval is the lower bound (2 of its 2 recent runs were taken over), journaled
    [choice] = [e["data"] for e in rescuer.history("storm-next") if e["kind"] == "SnapshotPolicy"]
    assert choice["every"] == 5 and choice["inputs"]["troubled"] == 2 and choice["inputs"]["runs"] == 2
    # And a recovered run chose again, with the crashes counted, journaled right after its Resumed
    history = rescuer.history("storm0")
    kinds = [e["kind"] for e in history]
    assert kinds[:2] == ["RunStarted", "SnapshotPolicy"] and history[1]["data"]["every"] == 400
    after = kinds.index("Resumed") + 1
    assert kinds[after] == "SnapshotPolicy" and history[after]["data"]["inputs"]["troubled"] == 2


def test_adaptive_choice_is_geometric_between_the_bounds():
    a = Adaptive(min_every=10, max_every=1000, window=20, full_at=0.2)
    assert a.choose(0, 0) == 1000 and a.choose(20, 0) == 1000
    assert a.choose(20, 2) == 100  # rate 0.1 = half of full_at: the geometric middle
    assert a.choose(20, 4) == 10 and a.choose(20, 20) == 10


# -- bad input -------------------------------------------------------------------------------------
def test_bad_policies_are_definition_errors_naming_the_option():
    with pytest.raises(DefinitionError, match="unknown option 'evry'.*known: every"):
        Workflow("x", snapshots={"evry": 3})
    with pytest.raises(DefinitionError, match=r"Adaptive\(window=...\): unknown|unknown option 'windw'"):
        Workflow("x", snapshots={"adaptive": {"windw": 3}})
    with pytest.raises(DefinitionError, match=r"Snapshots\(every=...\) must be an integer >= 1, got 0"):
        Snapshots(every=0)
    with pytest.raises(DefinitionError, match=r"Snapshots\(seconds=...\) must be a positive number"):
        Snapshots(seconds=-1)
    with pytest.raises(DefinitionError, match="max_every=5.*min_every=10"):
        Adaptive(min_every=10, max_every=5)
    with pytest.raises(DefinitionError, match=r"Snapshots\(replay_ratio=...\) must be a positive number"):
        Snapshots(replay_ratio=0)
    with pytest.raises(DefinitionError, match="snapshots must be a Snapshots"):
        Workflow("x", snapshots=42)


def test_a_gate_naming_no_step_is_a_definition_error_naming_it():
    wf = chain(snapshots=Snapshots(gates=["s2", "validate"]))
    with pytest.raises(DefinitionError) as info:
        wf.validate()
    assert "snapshot gate 'validate' names no step" in str(info.value) and info.value.step == "validate"


def test_policies_read_as_data():
    wf = Workflow("data", snapshots={"every": 50, "after_effects": True, "gates": ["a"],
                                     "adaptive": {"min_every": 5, "max_every": 50}})
    assert wf.snapshots == Snapshots(every=50, after_effects=True, gates=("a",),
                                     adaptive=Adaptive(min_every=5, max_every=50))
    assert Snapshots().to_json() == {"every": 100, "seconds": None, "after_effects": False, "gates": [],
                                     "adaptive": None, "replay_ratio": None, "incremental": 10, "keep": 3,
                                     "finished_ttl": None}
