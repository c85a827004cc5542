"""DBOS's queue under bench/scale.py's workload: a workflow of ten trivial steps, enqueued by a
client and dequeued by worker processes, on the same Postgres as agentsaga (a schema of its own).

    python bench/_scale_dbos.py worker URL SCHEMA CONCURRENCY     # runs until SIGTERM
    python bench/_scale_dbos.py enqueue URL SCHEMA N [DELAY_S]

How DBOS is set up, and why this is its fast configuration: the queue is polled every 50 ms
(its default is 1 s, which would cap a short workflow's latency, not its throughput, but costs
nothing here to lower); ``worker_concurrency`` caps each process like agentsaga's
``--concurrency``; the admin server is off and logging at WARNING. Each step is a
``@DBOS.step`` (checkpointed before the workflow goes on), which is DBOS's durability unit, as a
step is agentsaga's.
"""

from __future__ import annotations

import signal
import sys
import threading

from dbos import DBOS, DBOSClient


@DBOS.step()
def inc(i: int) -> int:
    return i + 1


@DBOS.workflow()
def ten(start: int) -> int:
    i = start
    for _ in range(10):
        i = inc(i)
    return i


def main(argv: list[str]) -> int:
    mode, url, schema = argv[:3]
    if mode == "enqueue":
        client = DBOSClient(system_database_url=url, dbos_system_schema=schema)
        delay = float(argv[4]) if len(argv) > 4 else 0.0
        for i in range(int(argv[3])):
            client.enqueue({"queue_name": "bench", "workflow_name": ten.__qualname__, "delay_seconds": delay}, i)
        client.destroy()
        return 0
    DBOS(config={"name": "agentsaga-scale-bench", "system_database_url": url, "dbos_system_schema": schema,
                  "run_admin_server": False, "log_level": "WARNING"})
    DBOS.launch()
    DBOS.register_queue("bench", worker_concurrency=int(argv[3]), polling_interval_sec=0.05)
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
