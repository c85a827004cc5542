"""The workflows bench/scale.py enqueues (workers import them as ``bench/_scale_flows.py:NAME``).

- ``ten``: ten trivial steps in a row: the unit of throughput (what is measured is the engine and
  the database, not the steps).
- ``sleepy``: thirty steps of 0.1 s: long enough to be in flight when its worker is killed.
"""

from __future__ import annotations

import time

from workflows import END, Workflow


def _chain(name: str, n: int, pause: float) -> Workflow:
    wf = Workflow(name)
    for i in range(n):
        def step(ctx, state, i=i):
            if pause:
                time.sleep(pause)
            return {"i": i + 1}

        step.__name__ = f"s{i}"
        wf.step(name=f"s{i}", start=i == 0)(step)
        if i:
            wf.edge(f"s{i - 1}", f"s{i}")
    wf.edge(f"s{n - 1}", END)
    return wf


ten = _chain("ten", 10, 0.0)
sleepy = _chain("sleepy", 30, 0.1)
