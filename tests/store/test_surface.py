"""The Store's shape: a facade that keeps runs and the journal, and one part per idea.

Pinned like `store.__all__` (tests/test_exported_members_store.py): a method added to, moved
between or dropped from a part is a change to docs/internals-store.md too.
"""

from __future__ import annotations

import inspect

from store import Store, open_store

STORE_METHODS = {
    "create_run", "create_runs", "get_run", "list_runs", "count_by_status", "append", "append_many", "events", "last_seq",
    "snapshots", "snapshot", "snapshot_catalog", "mark_snapshot", "prune_snapshots", "delete_runs", "info", "close", "url", "dialect",
}
PARTS = {
    "leases": {"acquire", "renew", "renew_many", "release", "tokens"},
    "queues": {"claim", "claim_some", "claim_from", "in_flight"},
    "wakeups": {"park", "wake", "next_due", "listener"},
    "signals": {"send", "pending", "consume"},
    "breakers": {"get", "compare_and_set"},
    "slots": {"acquire", "renew", "release", "held"},
    "failures": {"record", "for_run", "dead_letter", "revive"},
    "stats": {"queue_depths", "recovery_totals", "recent_event_data", "failure_counts", "snapshot_totals",
              "recent_event_data_by_workflow", "failed_recoveries_by_workflow"},
}


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_the_store_keeps_runs_and_the_journal_and_has_one_attribute_per_part():
    with open_store("sqlite://") as store:
        assert _public(store) == STORE_METHODS | set(PARTS)


def test_each_part_offers_exactly_its_methods():
    with open_store("sqlite://") as store:
        for name, methods in PARTS.items():
            assert _public(getattr(store, name)) == methods, name


def test_store_and_parts_are_composed_not_mixed_in():
    with open_store("sqlite://") as store:
        assert Store.__mro__ == (Store, object)
        for name in PARTS:
            part = type(getattr(store, name))
            assert part.__mro__ == (part, object), name
            assert inspect.getmodule(part).__name__ == f"store._{name}", name
