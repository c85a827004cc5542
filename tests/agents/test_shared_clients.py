"""Model calls and ``ctx.http``/``ctx.ahttp`` share one kept-alive HTTP client per event loop (per
Orchestrator), closed with the Orchestrator: seen from the loopback chat server, as connections."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import API_KEY  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402
from orchestrator.agents import LLM, AsyncLLM  # noqa: E402
from orchestrator.testing import reply  # noqa: E402
from workflows import END, Workflow  # noqa: E402

HANG = 120.0  # seconds a readiness wait may take on a loaded machine before it counts as hung


def wait_until(predicate, what: str) -> None:
    """Poll an observable condition (never a fixed sleep), bounded generously."""
    deadline = time.monotonic() + HANG
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def async_chain(llm: AsyncLLM, url: str, steps: int) -> Workflow:
    wf = Workflow("async-chain")
    for i in range(steps):
        async def step(ctx, state, i=i):
            answer = await llm.chat(ctx, f"step {i}")
            raw = await ctx.ahttp.post(url + "/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": f"raw {i}"}]}, headers={"Authorization": f"Bearer {API_KEY}"})
            return {f"s{i}": [answer.content, raw.status_code]}

        step.__name__ = f"s{i}"
        wf.step(name=f"s{i}", start=i == 0)(step)
        if i:
            wf.edge(f"s{i - 1}", f"s{i}")
    wf.edge(f"s{steps - 1}", END)
    return wf


def sync_chain(llm: LLM, url: str, steps: int) -> Workflow:
    wf = Workflow("sync-chain")
    for i in range(steps):
        def step(ctx, state, i=i):
            answer = llm.chat(ctx, f"step {i}")
            raw = ctx.http.post(url + "/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": f"raw {i}"}]}, headers={"Authorization": f"Bearer {API_KEY}"})
            return {f"s{i}": [answer.content, raw.status_code]}

        step.__name__ = f"s{i}"
        wf.step(name=f"s{i}", start=i == 0)(step)
        if i:
            wf.edge(f"s{i - 1}", f"s{i}")
    wf.edge(f"s{steps - 1}", END)
    return wf


def test_async_model_calls_and_ctx_ahttp_reuse_one_connection_per_loop(db_url, chat):
    # Given async steps that each call AsyncLLM and ctx.ahttp, in two runs on one event loop
    chat.script(lambda body, n: reply(f"answer {n}"))
    llm = AsyncLLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    wf = async_chain(llm, chat.url, steps=4)

    async def main(orc: Orchestrator) -> list[str]:
        first = await orc.arun(wf, {}, run_id="a1")
        second = await orc.arun(wf, {}, run_id="a2")
        return [first.status, second.status]

    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When both runs complete
        statuses = asyncio.run(main(orc))
        # Then all 16 calls went over one kept-alive connection
        assert statuses == ["completed", "completed"]
        assert chat.count == 16
        assert chat.connections == 1
        # And the loop's end closed it (asyncio.run finalises the loop's client)
        wait_until(lambda: chat.open_connections == 0, "the connection to close")


def test_sync_model_calls_and_ctx_http_share_the_orchestrators_client_until_close(db_url, chat):
    # Given sync steps that each call LLM and ctx.http, in two runs
    chat.script(lambda body, n: reply(f"answer {n}"))
    llm = LLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    wf = sync_chain(llm, chat.url, steps=3)
    orc = Orchestrator(db_url, workflows=[wf])
    try:
        # When both runs complete
        assert orc.run(wf, {}, run_id="s1").status == "completed"
        assert orc.run(wf, {}, run_id="s2").status == "completed"
        # Then the 12 calls shared one connection, kept open between runs
        assert chat.count == 12
        assert chat.connections == 1 and chat.open_connections == 1
    finally:
        # When the Orchestrator is closed
        orc.close()
    # Then its client is closed, and the connection with it
    wait_until(lambda: chat.open_connections == 0, "the connection to close")


def test_closing_the_orchestrator_inside_its_loop_closes_the_loops_client(db_url, chat):
    # Given a run on a loop that outlives the Orchestrator
    chat.script(lambda body, n: reply(f"answer {n}"))
    llm = AsyncLLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    wf = async_chain(llm, chat.url, steps=2)

    async def main() -> None:
        orc = Orchestrator(db_url, workflows=[wf])
        assert (await orc.arun(wf, {}, run_id="c1")).status == "completed"
        assert chat.open_connections == 1
        # When it is closed while the loop goes on
        orc.close()
        # Then the connection is closed without waiting for the loop to end
        deadline = time.monotonic() + HANG
        while chat.open_connections:
            assert time.monotonic() < deadline, "the connection did not close"
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert chat.connections == 1


def test_asyncllm_outside_an_orchestrator_keeps_one_connection_per_loop(chat):
    # Given AsyncLLM used directly, without an Orchestrator
    chat.script(lambda body, n: reply(f"answer {n}"))
    llm = AsyncLLM(base_url=chat.url, model="scripted-model", api_key=API_KEY, breaker=False)

    async def main() -> list[str]:
        out = []
        for i in range(5):
            response = await llm.acomplete(llm.request(f"q{i}"))
            out.append(response["body"]["choices"][0]["message"]["content"])
        return out

    # When five calls are made on one loop
    answers = asyncio.run(main())
    # Then they reuse one connection, closed when the loop ends
    assert answers == [f"answer {n}" for n in range(5)]
    assert chat.connections == 1
    wait_until(lambda: chat.open_connections == 0, "the connection to close")


def test_a_kept_alive_connection_does_not_keep_the_step_that_opened_it(db_url, chat):
    # Given an async step that opens the loop's connection with a model call and ctx.ahttp
    import gc
    import weakref

    chat.script(lambda body, n: reply(f"answer {n}"))
    llm = AsyncLLM(base_url=chat.url, model="scripted-model", api_key=API_KEY)
    contexts: list[weakref.ref] = []
    wf = Workflow("opens")

    @wf.step(start=True)
    async def ask(ctx, state):
        contexts.append(weakref.ref(ctx))
        answer = await llm.chat(ctx, "hello")
        raw = await ctx.ahttp.post(chat.url + "/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "raw"}]}, headers={"Authorization": f"Bearer {API_KEY}"})
        return {"answer": answer.content, "raw": raw.status_code}

    wf.edge("ask", END)

    async def main(orc: Orchestrator) -> tuple[str, int, list]:
        result = await orc.arun(wf, {}, run_id="k1")
        # (still on the loop: its client and the kept-alive connection are open)
        return result.status, chat.open_connections, [ref() for ref in contexts if ref() is not None]

    with Orchestrator(db_url, workflows=[wf]) as orc:
        # When the run completes with the garbage collector off, the connection kept alive
        gc.collect()
        gc.disable()
        try:
            status, still_open, alive = asyncio.run(main(orc))
        finally:
            gc.enable()
    # Then the connection stayed open, and it did not keep the step's context (nor the run it reaches)
    assert status == "completed"
    assert still_open == 1
    assert alive == [], f"kept alive by the open connection: {alive}"
