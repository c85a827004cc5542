"""DBOS 3.x under the benchmark workloads.

How it is configured, and why that is its durable best:
- The workflow is one ``@DBOS.workflow`` looping over a ``@DBOS.step``; DBOS checkpoints every
  step's output to its system database before the workflow goes on, which is its durability unit.
- SQLite "default": ``system_database_url="sqlite:///FILE"`` and nothing else. DBOS leaves
  SQLite's journal mode alone, so that is a rollback journal (``journal_mode=DELETE``) with the
  library default ``synchronous=FULL``.
- SQLite "wal": the same, on a file put in WAL mode before DBOS opens it (WAL mode is stored in the
  file, so DBOS's own connections inherit it); ``synchronous`` stays FULL (checked at run time).
- Postgres: ``system_database_url`` is the server, ``dbos_system_schema`` a fresh schema.
- The admin HTTP server is off and logging is at WARNING, so neither costs anything per step.
Recovery is DBOS's own: ``DBOS.launch()`` finds the interrupted workflow of this executor and
application version and re-runs it in the background; recorded steps return their stored outputs.
"""

from __future__ import annotations

import sqlite3

from dbos import DBOS, SetWorkflowID

import _hooks


@DBOS.step()
def inc(n: int) -> dict:
    return _hooks.step_body(n)


@DBOS.workflow()
def count(target: int) -> dict:
    state = {"n": 0, "pad": ""}
    while state["n"] < target:
        state = inc(state["n"])
    return state


class System:
    def __init__(self, *, backend: str, wal: bool = False, target: dict) -> None:
        self.backend = backend
        self.wal = wal
        self.target = target
        self.config: dict = {"name": "agentsaga-bench", "run_admin_server": False, "log_level": "WARNING"}
        if backend == "sqlite":
            self.config["system_database_url"] = "sqlite:///" + target["path"]
        else:
            self.config["system_database_url"] = target["url"]
            self.config["dbos_system_schema"] = target["schema"]
            import psycopg  # noqa: F401  (the driver is imported outside the timed region, as for every engine)

    def prepare(self) -> None:
        """Before the timed part of a fresh run: put the file in WAL mode for the wal variant."""
        if self.backend == "sqlite" and self.wal:
            conn = sqlite3.connect(self.target["path"])
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.close()
            assert mode == "wal", mode

    def open(self) -> None:
        DBOS(config=self.config)
        DBOS.launch()

    def describe(self) -> dict:
        """The pragmas on DBOS's own connection (read through a private attribute: report only)."""
        if self.backend != "sqlite":
            return {}
        try:
            import dbos._dbos as internals

            engine = internals._dbos_global_instance._sys_db.engine
            with engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                return {
                    "journal_mode": raw.execute("PRAGMA journal_mode").fetchone()[0],
                    "synchronous": raw.execute("PRAGMA synchronous").fetchone()[0],
                }
        except Exception as exc:  # a DBOS release that moved the attribute: say so, don't fail
            return {"describe_error": repr(exc)}

    def run(self, run_id: str, n: int) -> dict:
        with SetWorkflowID(run_id):
            return count(n)

    def resume(self, run_id: str) -> dict:
        # open() has already launched DBOS, whose startup recovery is re-running the workflow.
        return DBOS.retrieve_workflow(run_id).get_result()

    def close(self) -> None:
        DBOS.destroy()
