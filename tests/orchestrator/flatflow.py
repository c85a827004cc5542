"""A step whose durable calls are all top-level, for the journals written before calls could nest.

``data/flat-journal.savepoint.json`` is a run of ``flat`` parked at its ``wait_for`` after two
calls, and ``data/flat.cassette.json`` the cassette of a whole run: both written by agentsaga as it
was before calls were numbered under the call that made them (commit c40e196), by running this
file with that version first on the path::

    git worktree add /tmp/agentsaga-c40e196 c40e196
    PYTHONPATH=/tmp/agentsaga-c40e196:tests/orchestrator python tests/orchestrator/flatflow.py tests/orchestrator/data

(the savepoint is kept as its JSON, uncompressed, so that a diff of it can be read).
"""

from __future__ import annotations

import gzip
import sys
import tempfile
from pathlib import Path

from workflows import END, Workflow

#: what each call's perform was asked for, in this process
performed: list[str] = []

flat = Workflow("flat", version="1")


def _answer(prompt: str, text: str):
    def perform() -> str:
        performed.append(prompt)
        return text
    return perform


@flat.step(start=True)
def ask(ctx, state):
    first = ctx.durable_call("llm", {"prompt": "first"}, _answer("first", "one"))
    second = ctx.durable_call("llm", {"prompt": "second"}, _answer("second", "two"))
    by = ctx.wait_for("go")["by"] if state.get("wait") else None
    third = ctx.durable_call("llm", {"prompt": "third"}, _answer("third", "three"))
    return {"answers": [first, second, third], "by": by}


flat.edge("ask", END)


def main(out: str) -> None:
    from orchestrator import Orchestrator
    from orchestrator.agents import Cassette

    with tempfile.TemporaryDirectory() as tmp, Orchestrator(f"sqlite:///{tmp}/flat.db", workflows=[flat]) as orc:
        assert orc.run(flat, {"wait": True}, run_id="flat-parked").status == "waiting"
        orc.savepoint("flat-parked", name="parked before calls could nest", path=f"{tmp}/parked.savepoint")
        Path(out, "flat-journal.savepoint.json").write_bytes(gzip.decompress(Path(tmp, "parked.savepoint").read_bytes()))
        assert orc.run(flat, {"wait": False}, run_id="flat-whole").status == "completed"
        Cassette.from_run(orc, "flat-whole").save(Path(out, "flat.cassette.json"))


if __name__ == "__main__":
    main(sys.argv[1])
