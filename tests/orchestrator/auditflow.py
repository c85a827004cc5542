"""A workflow for the audit tests: reasoning traces, a retried step, an effect with its
compensation, and outputs such as an LLM could produce (HTML and terminal escape sequences).

    plan -> search (retried while flaky) -> book (an effect, compensated) -> confirm -> END

The run's input decides what happens: ``flaky`` (failed attempts of search before it succeeds),
``payload`` (what search "found", journaled as output and trace), ``decline`` (confirm fails for
good, with ``reason`` in its error, so the saga cancels the booking and the run ends ``compensated``). The CLI tests load it by
its path, as a user's workflow file.
"""

from __future__ import annotations

from workflows import END, Retry, Workflow, reducers

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)><a href=\"javascript:alert(2)\">x</a>" \
          "\x1b[2J\x1b[31mRED\x1b[0m\x9b31m"

wf = Workflow("auditflow", version="1", reducers={"notes": reducers.append, "total": reducers.add})


def cancel_booking(ctx, effect):
    ctx.trace("cancelling the booking", booking=effect.result["booking"])
    return {"cancelled": effect.result["booking"]}


@wf.step(start=True)
def plan(ctx, state):
    ctx.trace("split the question into one search", topic=state.get("topic", "sagas"))
    return {"notes": "planned", "total": 1}


@wf.step(retry=Retry(attempts=4, initial=0.001, max_backoff=0.002, jitter=0))
def search(ctx, state):
    if ctx.attempt <= state.get("flaky", 0):
        raise ConnectionError(f"search backend unavailable (attempt {ctx.attempt})")
    found = state.get("payload", "three sources")
    ctx.trace("the model answered", text=found)
    return {"notes": found, "total": 10}


@wf.step(effect=True, compensate=cancel_booking)
def book(ctx, state):
    ctx.trace("booking with the idempotency key", key=ctx.idempotency_key)
    return {"booking": f"B-{ctx.idempotency_key}"}


@wf.step()
def confirm(ctx, state):
    if state.get("decline"):
        raise PermissionError("card declined " + state.get("reason", "<b>by the bank</b>"))
    ctx.trace("confirmed")
    return {"confirmed": True, "total": 100}


wf.edge("plan", "search")
wf.edge("search", "book")
wf.edge("book", "confirm")
wf.edge("confirm", END)
