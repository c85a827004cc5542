"""One store shared by many threads (each gets its own connection). SQLite and Postgres."""

from __future__ import annotations

import threading

from store_helpers import T0, ev, new_run


def test_threads_appending_to_different_runs(store):
    # Given eight runs, one per thread
    tokens = {f"r{n}": new_run(store, f"r{n}") for n in range(8)}
    start = threading.Barrier(len(tokens))
    failures: list[BaseException] = []

    def worker(run_id: str) -> None:
        try:
            start.wait()
            for seq in range(2, 42):
                store.append(run_id, [ev(seq)], token=tokens[run_id], now=T0 + seq)
                if seq % 10 == 0:  # interleave a multi-statement append and a read
                    store.append(run_id, [], token=tokens[run_id], now=T0 + seq, status="running")
                    assert store.last_seq(run_id) == seq
        except BaseException as exc:  # collected: a thread's failure must fail the test
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(run_id,)) for run_id in tokens]
    # When all append at once through the same store
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every journal is complete and in order, and nothing failed
    assert failures == []
    for run_id in tokens:
        assert [e.seq for e in store.events(run_id)] == list(range(1, 42))
        assert store.get_run(run_id).status == "running"


def test_threads_racing_on_one_seq_only_one_wins(store):
    # Given one run, and eight threads that all try to append seq 2
    token = new_run(store, "r1")
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def worker(n: int) -> None:
        start.wait()
        try:
            store.append("r1", [ev(2, data=f'{{"writer": {n}}}')], token=token, now=T0)
            outcomes.append("ok")
        except Exception as exc:  # the expected loss is ConflictError; anything else shows up
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then exactly one append landed and the other seven saw a conflict
    assert sorted(outcomes) == ["ConflictError"] * 7 + ["ok"]
    assert store.last_seq("r1") == 2
