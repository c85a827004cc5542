"""A step that waits for the same signal name more than once (a conversation loop: each turn waits
for the next ``message``) gets each signal once, in the order sent: the n-th ``ctx.wait_for(name)``
of a step execution is the n-th wait for that name, journaled with its ``index``.

It used to be keyed by the step and the name only, so every later wait for the name got the first
signal's data again and the later signals stayed unconsumed in the inbox for ever."""

from __future__ import annotations

from workflows import END, Workflow


def chat_flow() -> Workflow:
    wf = Workflow("same-signal-twice")

    @wf.step(start=True)
    def talk(ctx, state):
        first = ctx.wait_for("a")
        other = ctx.wait_for("b")
        again = ctx.wait_for("a")
        turns = [ctx.wait_for("msg")["n"] for _ in range(3)]
        return {"got": [first["n"], other["n"], again["n"]], "turns": turns}

    wf.edge("talk", END)
    return wf


def received(orc, run_id: str) -> list[tuple[str, int, int]]:
    return [(e["data"]["name"], e["data"].get("index", 0), e["data"]["data"]["n"])
            for e in orc.history(run_id) if e["kind"] == "SignalReceived"]


def test_signals_sent_before_the_step_are_each_delivered_once_in_order(orc_factory):
    wf = chat_flow()
    orc = orc_factory(wf)
    # Given a waiting run, and every signal sent before it runs on: a, b, a, then three messages
    assert orc.run(wf, {}, run_id="pre").status == "waiting"
    for name, n in [("a", 1), ("b", 2), ("a", 3), ("msg", 10), ("msg", 11), ("msg", 12)]:
        orc.signal("pre", name, {"n": n})
    # When it resumes
    result = orc.resume("pre")
    # Then each wait got its own signal, in the order they were sent, each journaled once
    assert result.status == "completed", result.error
    assert result.state == {"got": [1, 2, 3], "turns": [10, 11, 12]}
    assert received(orc, "pre") == [("a", 0, 1), ("b", 0, 2), ("a", 1, 3), ("msg", 0, 10), ("msg", 1, 11),
                                     ("msg", 2, 12)]


def test_signals_sent_one_at_a_time_while_it_waits_are_each_delivered_once(orc_factory):
    wf = chat_flow()
    orc = orc_factory(wf)
    # Given a run that waits, woken once per signal (the step runs again from its first line each time)
    assert orc.run(wf, {}, run_id="turns").status == "waiting"
    for name, n in [("a", 1), ("b", 2), ("a", 3), ("msg", 10), ("msg", 11)]:
        orc.signal("turns", name, {"n": n})
        # Then after each signal it waits again, for the next one
        assert orc.resume("turns").status == "waiting"
    waits = [(e["data"]["name"], e["data"].get("index", 0)) for e in orc.history("turns")
             if e["kind"] == "WaitStarted"]
    assert waits == [("a", 0), ("b", 0), ("a", 1), ("msg", 0), ("msg", 1), ("msg", 2)]
    # When the last message comes
    orc.signal("turns", "msg", {"n": 12})
    result = orc.resume("turns")
    # Then it completes with every signal once, none left in the inbox
    assert result.status == "completed", result.error
    assert result.state == {"got": [1, 2, 3], "turns": [10, 11, 12]}
    assert [n for _, _, n in received(orc, "turns")] == [1, 2, 3, 10, 11, 12]
    assert orc.store.signals.pending("turns", "msg") == [] and orc.store.signals.pending("turns", "a") == []


def test_a_signal_for_no_wait_does_not_wake_a_run_waiting_for_another(orc_factory):
    wf = Workflow("a-then-b")

    @wf.step(start=True)
    def both(ctx, state):
        return {"a": ctx.wait_for("a"), "b": ctx.wait_for("b")}

    wf.edge("both", END)
    orc = orc_factory(wf)
    # Given a run that took signal a and now waits for b, with a second a pending (for no wait)
    assert orc.run(wf, {}, run_id="ab").status == "waiting"
    orc.signal("ab", "a", 1)
    orc.signal("ab", "a", 2)
    assert orc.resume("ab").status == "waiting"
    seq = len(orc.history("ab"))
    # When recovery looks for runs that are due
    recovered = orc.recover()
    # Then the run is not one of them: the pending a answers no wait, so it is not woken to wait again
    assert [r.run_id for r in recovered] == []
    assert len(orc.history("ab")) == seq
    # And signal b wakes it and completes it; the second a stays pending
    orc.signal("ab", "b", 3)
    assert [(r.run_id, r.status) for r in orc.recover()] == [("ab", "completed")]
    assert orc.result("ab").state == {"a": 1, "b": 3}


def ask_flow() -> Workflow:
    wf = Workflow("wait-inside-a-call")

    @wf.step(start=True)
    def ask(ctx, state):
        # a tool that asks a human, made a durable call; then the step asks again itself
        first = ctx.durable_call("ask-human", {"question": "book it?"}, lambda: ctx.wait_for("approve"))
        second = ctx.wait_for("approve")
        return {"first": first["n"], "second": second["n"]}

    wf.edge("ask", END)
    return wf


def test_a_wait_inside_a_durable_call_is_numbered_under_it(orc_factory):
    wf = ask_flow()
    orc = orc_factory(wf)
    # Given a run whose durable call waits for "approve", answered and journaled
    assert orc.run(wf, {}, run_id="inner").status == "waiting"
    orc.signal("inner", "approve", {"n": 1})
    assert orc.resume("inner").status == "waiting"
    # When the step, run again, has that call answered from the journal (its wait is not reached)
    # and waits for "approve" itself, and the second approval comes
    orc.signal("inner", "approve", {"n": 2})
    result = orc.resume("inner")
    # Then the step's own wait got the second signal, not the first again
    assert result.status == "completed", result.error
    assert result.state == {"first": 1, "second": 2}
    assert received(orc, "inner") == [("approve", "0.0", 1), ("approve", 0, 2)]
    assert orc.store.signals.pending("inner", "approve") == []


def test_waits_inside_and_outside_a_call_take_signals_sent_early_in_order(orc_factory):
    wf = ask_flow()
    orc = orc_factory(wf)
    # Given both approvals sent before the run first waits
    assert orc.run(wf, {}, run_id="early").status == "waiting"
    orc.signal("early", "approve", {"n": 1})
    orc.signal("early", "approve", {"n": 2})
    # When it resumes
    result = orc.resume("early")
    # Then the call's wait took the first and the step's the second, each once
    assert result.status == "completed", result.error
    assert result.state == {"first": 1, "second": 2}
    assert received(orc, "early") == [("approve", "0.0", 1), ("approve", 0, 2)]
