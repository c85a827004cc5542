"""A step's context is freed when its step ends, by reference counting alone.

At a thousand concurrent runs, a context left in a reference cycle (with the tools, durable calls
and run it reaches) waits for the garbage collector's oldest generation, and every cycle promoted
there makes the next full collection come sooner. These tests keep the collector off while runs
execute and check that nothing the step's context made points back at it.
"""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

from orchestrator import Orchestrator
from workflows import END, Workflow


@contextmanager
def collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def workflow(contexts: list[weakref.ref[Any]]) -> Workflow:
    wf = Workflow("lifetime")

    @wf.step(start=True)
    def plain(ctx, state):
        contexts.append(weakref.ref(ctx))
        ctx.trace("thinking", about="nothing")
        return {"a": 1}

    @wf.step()
    def calls(ctx, state):
        contexts.append(weakref.ref(ctx))
        ctx.tools  # what ctx.http and a model client build on first use
        return {"b": ctx.durable_call("quote", {"q": 1}, lambda: {"price": 3})["price"]}

    @wf.step()
    async def acalls(ctx, state):
        contexts.append(weakref.ref(ctx))
        ctx.ahttp

        async def ask() -> dict[str, int]:
            return {"price": 4}

        return {"c": (await ctx.adurable_call("aquote", {"q": 2}, ask))["price"]}

    @wf.step(effect=True)
    def effect(ctx, state):
        contexts.append(weakref.ref(ctx))
        return {"key": ctx.idempotency_key}

    wf.edge("plain", "calls")
    wf.edge("calls", "acalls")
    wf.edge("acalls", "effect")
    wf.edge("effect", END)
    return wf


def test_every_step_context_is_freed_when_its_run_ends_without_the_garbage_collector(db_url):
    # Given a run whose steps trace, build tools, make durable calls (sync and async) and read a key
    contexts: list[weakref.ref[Any]] = []
    wf = workflow(contexts)
    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When it runs to its end with the garbage collector off
        with collector_off():
            result = orc.run(wf, {}, run_id="life-1")
            alive = [ref() for ref in contexts if ref() is not None]
    # Then it completed, and no step's context outlived its step: none was kept by a cycle
    assert result.status == "completed", result
    assert result.state["b"] == 3 and result.state["c"] == 4
    assert len(contexts) == 4
    assert alive == [], f"step contexts kept alive after the run: {alive}"
