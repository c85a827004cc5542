"""Plain helpers shared by the exactly-once tests (test_exactly_once_*.py).

The suite runs with --import-mode=importlib, so the test modules put this directory on sys.path
to import it; the module name is unique to the suite.
"""

from __future__ import annotations

from store import StoreUnavailableError


class Died(BaseException):
    """Stands for the process dying at this point (nothing after it runs)."""


def kinds(orc, run_id):
    return [e["kind"] for e in orc.history(run_id)]


def seqs(orc, run_id):
    return [e["seq"] for e in orc.history(run_id)]


def fail_append_once(orc, when):
    """Make the store's append raise StoreUnavailableError once, the first time ``when(events)`` holds."""
    real = orc.store.append
    state = {"failed": False}

    def append(run_id, events, **kw):
        if not state["failed"] and when(events):
            state["failed"] = True
            raise StoreUnavailableError("injected: the database went away during this append")
        return real(run_id, events, **kw)

    orc.store.append = append
    return state
