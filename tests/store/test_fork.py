"""A store inherited across fork(): parent and child must not share a connection.

multiprocessing forks by default on Linux, so a worker pool started after `open_store` hands
every child the parent's store object. Sharing the parent's Postgres socket or SQLite handle
would interleave two processes' protocol traffic and file locks.
"""

from __future__ import annotations

import os
import sys

import pytest
from store_helpers import T0, ev, new_run

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_parent_and_forked_child_use_one_store_concurrently(store):
    # Given a store that has already been used (so the parent has a live connection)
    parent_token = new_run(store, "parent")
    child_token = new_run(store, "child")
    # When the process forks and both sides append 200 events at the same time
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only, never return into pytest
        code = 1
        try:
            for seq in range(2, 202):
                store.append("child", [ev(seq)], token=child_token, now=T0)
            code = 0
        except BaseException as exc:
            print(f"child failed: {exc!r}", file=sys.stderr)
        finally:
            os._exit(code)
    for seq in range(2, 202):
        store.append("parent", [ev(seq)], token=parent_token, now=T0)
    _, status = os.waitpid(pid, 0)
    # Then both succeeded and both journals are complete
    assert os.waitstatus_to_exitcode(status) == 0
    assert [e.seq for e in store.events("parent")] == list(range(1, 202))
    assert [e.seq for e in store.events("child")] == list(range(1, 202))
