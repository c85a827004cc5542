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


def test_a_connection_a_step_leaves_open_does_not_keep_the_step(db_url):
    # Given an async step that opens a connection of its own and leaves it open when it ends (asyncio
    # keeps a copy of the step's context with the connection's reader for as long as it is open)
    import asyncio

    contexts: list[weakref.ref[Any]] = []
    kept: list[Any] = []
    wf = Workflow("opens-its-own")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client closes
        writer.close()

    async def main(orc: Orchestrator) -> tuple[str, list[Any]]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        @wf.step(start=True)
        async def connect(ctx, state):
            contexts.append(weakref.ref(ctx))
            kept.append(await asyncio.open_connection("127.0.0.1", port))
            return {"connected": True}

        wf.edge("connect", END)
        result = await orc.arun(wf, {}, run_id="own-1")
        alive = [ref() for ref in contexts if ref() is not None]
        for _reader, writer in kept:
            writer.close()
        server.close()
        return result.status, alive

    with Orchestrator(db_url) as orc:
        # When the run completes with the garbage collector off, the connection still open
        with collector_off():
            status, alive = asyncio.run(main(orc))
    # Then the step's context did not outlive its step
    assert status == "completed"
    assert alive == [], f"kept alive by the connection the step left open: {alive}"
