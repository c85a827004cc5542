"""The store contract: `store.breakers`, breaker state shared through compare-and-set.
Runs on SQLite and on Postgres."""

from __future__ import annotations

from store_helpers import T0

from store import open_store


def test_unknown_breaker_reads_as_absent(store):
    assert store.breakers.get("search-api") == (None, 0)


def test_breaker_compare_and_set(db_url):
    # Given two workers with their own stores, both having read the breaker at version 0
    a, b = open_store(db_url), open_store(db_url)
    try:
        # When both try to create it
        assert a.breakers.compare_and_set("api", state='{"open": true}', expected_version=0, now=T0) is True
        assert b.breakers.compare_and_set("api", state='{"open": false}', expected_version=0, now=T0) is False
        # Then the first write won, at version 1, and both see it
        assert b.breakers.get("api") == ('{"open": true}', 1)
        # When both update from version 1, the second (now stale) writer loses again
        assert b.breakers.compare_and_set("api", state='{"half": 1}', expected_version=1, now=T0 + 1) is True
        assert a.breakers.compare_and_set("api", state='{"half": 2}', expected_version=1, now=T0 + 1) is False
        assert a.breakers.get("api") == ('{"half": 1}', 2)
    finally:
        a.close()
        b.close()
