"""One measurement of bench/agents.py, in a fresh process: ``python _agents_child.py '<json spec>'``.

spec: ``{"op": "floor" | "plain" | "durable" | "llm" | "conversation", "n": runs, "steps": steps per run,
"model": base URL of the fake model server (ends in /v1), "db": store URL (not for the floor)}``.
Prints one JSON line: ``{"seconds": wall time of the N concurrent runs, "ok": runs that completed}``
(for ``conversation``: ``{"first_ms", "last_ms"}``, the mean step time over the first and last 100).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import resource
import sys
import time
from urllib.parse import urlsplit

from orchestrator import Orchestrator
from orchestrator.agents import AsyncLLM
from workflows import END, Workflow, reducers


class RawClient:
    """The cheapest keep-alive HTTP/1.1 client: one connection, one request at a time, asyncio streams.

    The floor and the plain step both call through it (a client per run, held across its steps), so
    their difference is the engine. (httpx's pool costs grow with its connection count, which at
    a thousand concurrent calls would be measured instead of the engine.)
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname, parts.port, parts.path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: dict) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        self.writer.write(f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        payload = json.loads(await self.reader.readexactly(length))
        if status != 200:
            raise RuntimeError(f"model server answered {status}: {payload}")
        return payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


#: the plain steps' clients, one per run (the step holds its run's client across its steps)
CLIENTS: dict[str, RawClient] = {}


def _body(tag: str) -> dict:
    return {"model": "bench", "messages": [{"role": "user", "content": tag}]}


def chain(name: str, steps: int, make) -> Workflow:
    wf = Workflow(name)
    for i in range(steps):
        step = make(f"s{i}")
        step.__name__ = f"s{i}"
        wf.step(name=f"s{i}", start=i == 0)(step)
        if i:
            wf.edge(f"s{i - 1}", f"s{i}")
    wf.edge(f"s{steps - 1}", END)
    return wf


def plain_flow(model: str, steps: int) -> Workflow:
    url = model + "/chat/completions"

    def make(name: str):
        async def step(ctx, state):
            client = CLIENTS.get(ctx.run_id)
            if client is None:
                client = CLIENTS[ctx.run_id] = RawClient(url)
            reply = await client.post(_body(f"run={ctx.run_id} step={name}"))
            return {name: len(reply["choices"][0]["message"]["content"])}
        return step

    return chain("agents_plain", steps, make)


def durable_flow(model: str, steps: int) -> Workflow:
    """The plain step's call made through ``ctx.adurable_call`` (its whole reply journaled): what
    journaling a model's answer before the step goes on costs, with no model client of the project's."""
    url = model + "/chat/completions"

    def make(name: str):
        async def step(ctx, state):
            client = CLIENTS.get(ctx.run_id)
            if client is None:
                client = CLIENTS[ctx.run_id] = RawClient(url)
            body = _body(f"run={ctx.run_id} step={name}")
            reply = await ctx.adurable_call("llm", body, lambda: client.post(body))
            return {name: len(reply["choices"][0]["message"]["content"])}
        return step

    return chain("agents_durable", steps, make)


def llm_flow(model: str, steps: int) -> Workflow:
    llm = AsyncLLM(base_url=model, model="bench", api_key="bench")

    def make(name: str):
        async def step(ctx, state):
            result = await llm.chat(ctx, f"run={ctx.run_id} step={name}")
            return {name: len(result.content or "")}
        return step

    return chain("agents_llm", steps, make)


async def floor(model: str, n: int, steps: int) -> dict:
    url = model + "/chat/completions"

    async def one(r: int) -> None:
        client = RawClient(url)
        try:
            for i in range(steps):
                reply = await client.post(_body(f"run=floor{r} step=s{i}"))
                len(reply["choices"][0]["message"]["content"])
        finally:
            client.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(r) for r in range(n)))
    return {"seconds": time.perf_counter() - t0, "ok": n}


async def engine(op: str, model: str, db: str, n: int, steps: int) -> dict:
    flows = {"plain": plain_flow, "durable": durable_flow, "llm": llm_flow}
    wf = flows[op](model, steps)
    orc = Orchestrator(db, workflows=[wf])
    try:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(orc.arun(wf, {}, run_id=f"{op}-{r}") for r in range(n)))
        seconds = time.perf_counter() - t0
        for client in CLIENTS.values():
            client.close()
        return {"seconds": seconds, "ok": sum(1 for r in results if r.status == "completed"),
                "statuses": sorted({r.status for r in results})}
    finally:
        orc.close()


async def conversation(db: str, steps: int) -> dict:
    """One run whose state grows by one ~2 KB message per step: the per-step cost, first vs last 100."""
    marks: list[float] = []
    # The step journals only its new message (an append reducer): what grows is the state, not the event.
    wf = Workflow("agents_conversation", max_visits=steps + 1, reducers={"messages": reducers.append})

    @wf.step(start=True)
    async def talk(ctx, state):
        marks.append(time.perf_counter())
        turn = len(state.get("messages", []))
        return {"messages": [{"role": "assistant", "content": f"turn {turn} " + "x" * 2000}]}

    wf.route("talk", lambda s: "talk" if len(s["messages"]) < steps else END, targets=["talk", END])
    orc = Orchestrator(db, workflows=[wf])
    try:
        t0 = time.perf_counter()
        result = await orc.arun(wf, {})
        marks.append(time.perf_counter())
    finally:
        orc.close()
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(marks)]
    k = min(100, len(gaps) // 2)
    return {"first_ms": sum(gaps[:k]) / k, "last_ms": sum(gaps[-k:]) / k, "status": result.status,
            "seconds": marks[-1] - t0}


def main() -> None:
    spec = json.loads(sys.argv[1])
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per concurrent run
    op = spec["op"]
    if op == "floor":
        out = asyncio.run(floor(spec["model"], spec["n"], spec["steps"]))
    elif op == "conversation":
        out = asyncio.run(conversation(spec["db"], spec["steps"]))
    else:
        out = asyncio.run(engine(op, spec["model"], spec["db"], spec["n"], spec["steps"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
