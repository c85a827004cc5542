"""A real process of the SIGKILL sample: it drives one explorer flow and SIGKILLs itself at crash point K.

    python tests/explorer/explorer_child.py DB_URL RUN_ID FLOW K API CHAT_URL LEDGER

For the ``group`` flow (three runs driven together, see explorer_group.py), RUN_ID is the base of
the runs' ids and K names the moment: ``NTH|TARGET`` (the NTH point answering to TARGET).

API and CHAT_URL are the parent's booking service and scripted model (they outlive this process);
LEDGER is the file where each step execution is written (fsynced) before the step goes on. The
process kills itself with SIGKILL when it reaches point K (no cleanup, no atexit, no flush); if it
reaches the end instead it exits 3, which the parent reports as a point never reached.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))

from explorer_calls import outgoing_calls_instrumented
from explorer_flows import FLOWS
from explorer_group import Group, drive_group, new_process, run_ids
from explorer_harness import World, drive, make_orchestrator
from explorer_process import T0, Plan, Process

from orchestrator.testing import FakeClock


def main(argv: list[str]) -> int:
    url, run_id, name, k, api, chat_url, ledger = argv
    world = World(service=SimpleNamespace(url=api), clock=FakeClock(T0), chat_url=chat_url or None,
                  ledger_path=ledger)
    if name == "group":
        nth, _, target = k.partition("|")
        group = Group(world)
        process = new_process("gen0", Plan(target=target, nth=int(nth), what="kill"))
        orc = make_orchestrator(url, process, world, [group.workflow])
        with outgoing_calls_instrumented():
            drive_group(group, world, orc, process, run_ids(run_id))
        return 3
    flow = FLOWS[name](world)
    process = Process("gen0", Plan(at=int(k), what="kill"))
    orc = make_orchestrator(url, process, world, [flow.workflow])
    with outgoing_calls_instrumented():
        drive(flow, world, orc, process, run_id)
    return 3  # SIGKILL never came: the point was not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
