"""agentsaga under the benchmark workloads, configured as a user gets it: the defaults.

One step ``inc`` routed back to itself until ``n`` reaches the target (``max_visits`` raised to
fit). SQLite is the store's default (WAL, ``synchronous=FULL``); Postgres goes through psycopg 3
with the tables in a fresh schema (``options=-csearch_path=...`` in the URL). Resume is
``Orchestrator(url, workflows=[wf]).resume(run_id)`` in a new process.
"""

from __future__ import annotations

from orchestrator import Orchestrator
from workflows import END, Workflow

import _hooks

# The longest run is 10,000 steps; the loop bound must let it finish.
MAX_VISITS = 20_000

wf = Workflow("bench_count", version="1", max_visits=MAX_VISITS)


@wf.step(start=True)
def inc(ctx, state):
    return _hooks.step_body(state["n"])


wf.route("inc", lambda s: "inc" if s["n"] < s["target"] else END)


def effect_workflow() -> tuple[Workflow | None, str | None]:
    """The same counter with ``effect=True`` and a compensation registered (durable intent before
    each step, the result after it), if supported."""
    try:
        ewf = Workflow("bench_count_effect", version="1", max_visits=MAX_VISITS)

        def undo(ctx, effect):  # registered, never called: the run does not fail
            return None

        @ewf.step(start=True, effect=True, compensate=undo)
        def inc_effect(ctx, state):
            return _hooks.step_body(state["n"])

        ewf.route("inc_effect", lambda s: "inc_effect" if s["n"] < s["target"] else END)
        return ewf, None
    except Exception as exc:  # effect steps land with the saga issue; report why, don't fail
        return None, f"effect steps not available: {type(exc).__name__}: {exc}"


def nested_doc(kb: int) -> dict:
    """A nested state of about ``kb`` KB of JSON (sections of paragraphs, tags and numbers), which no
    step changes: what a step costs for carrying it is the per-step copy of the state it is shown."""
    sections = []
    while len(str(sections)) < kb * 1024:
        i = len(sections)
        sections.append({"title": f"section {i}", "paras": [f"paragraph {j} of section {i}, some words" for j in range(3)],
                         "meta": {"i": i, "score": i / 7, "tags": ["alpha", "beta"], "ok": True}})
    return {"sections": sections}


class System:
    def __init__(self, *, backend: str, target: dict, snapshot_every: int | None = None,
                 effect: bool = False, store_options: dict | None = None, state_kb: int = 0) -> None:
        self.backend = backend
        #: carry a nested state of this many KB through every step (0: the tiny counter state only)
        self.state_kb = state_kb
        self.target = target
        self.url = "sqlite:///" + target["path"] if backend == "sqlite" else target["url_with_schema"]
        self.kwargs: dict = {} if snapshot_every is None else {"snapshot_every": snapshot_every}
        if store_options:  # only profile_step.py uses this (synchronous=OFF to split CPU from fsync)
            self.kwargs["store_options"] = store_options
        self.wf = wf
        if effect:
            ewf, reason = effect_workflow()
            if ewf is None:
                raise RuntimeError(reason)
            self.wf = ewf
        self.orc = None
        if backend == "pg":
            # The store imports psycopg lazily, on the first Postgres Orchestrator (about 30 ms here).
            # Import it now, outside the timed resume, as every engine's driver is: the
            # process-start column still pays it.
            import psycopg  # noqa: F401

    def prepare(self) -> None:
        pass

    def open(self) -> None:
        self.orc = Orchestrator(self.url, workflows=[self.wf], **self.kwargs)

    def describe(self) -> dict:
        return dict(self.kwargs)

    def run(self, run_id: str, n: int) -> dict:
        start = {"n": 0, "pad": "", "target": n}
        if self.state_kb:
            start["doc"] = nested_doc(self.state_kb)
        res = self.orc.run(self.wf, start, run_id=run_id)
        if res.status != "completed":
            raise RuntimeError(f"run {run_id} ended {res.status}")
        return dict(res.state)

    def resume(self, run_id: str) -> dict:
        res = self.orc.resume(run_id)
        if res.status != "completed":
            raise RuntimeError(f"resume of {run_id} ended {res.status}")
        return dict(res.state)

    def close(self) -> None:
        close = getattr(self.orc, "close", None)
        if close is not None:
            close()
        self.orc = None
