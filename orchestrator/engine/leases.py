"""Lease heartbeats on a background thread.

Steps may block the event loop (a sync step runs inline), so renewals cannot ride on the loop: a
daemon thread renews every held lease every ``ttl / 3`` seconds, all of them in one statement
(``store.leases.renew_many``), with its own store connection. A
renewal refused as stale marks the run lost; the driver checks that flag before each step and
abandons the run (invariant 6). Appends are fenced by the store in any case: the flag only stops
work early.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from store import Store, StoreError

__all__ = ["Heartbeat"]

_log = logging.getLogger("agentsaga.lease")


class Heartbeat:
    def __init__(self, store: Store, *, ttl: float, clock: Callable[[], float],
                 interval: float | None = None) -> None:
        self._store = store
        self._ttl = ttl
        self._interval = interval if interval is not None else ttl / 3.0
        self._clock = clock
        self._held: dict[str, int] = {}
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def hold(self, run_id: str, token: int) -> None:
        with self._lock:
            self._held[run_id] = token
            self._lost.discard(run_id)
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, name="agentsaga-heartbeat", daemon=True)
                self._thread.start()

    def drop(self, run_id: str, *, token: int | None = None) -> None:
        """Stop renewing the run's lease (only the one of ``token``, when given: a newer lease on the
        run, taken since, is kept)."""
        with self._lock:
            if token is not None and self._held.get(run_id) != token:
                return
            self._held.pop(run_id, None)
            self._lost.discard(run_id)

    def holds(self, run_id: str) -> bool:
        """Whether this process is driving the run now (its lease is being renewed here)."""
        with self._lock:
            return run_id in self._held

    def lost(self, run_id: str) -> bool:
        return run_id in self._lost

    def abandon(self, run_id: str) -> None:
        """Make the driver of a held run stop at its next step boundary, as if the lease were lost
        (a worker handing the run back at shutdown); the lease itself is the caller's to release."""
        with self._lock:
            if run_id in self._held:
                self._lost.add(run_id)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._thread = None
        self._wake.clear()

    def renew_all(self) -> None:
        """One round of renewals (the thread calls this; tests may call it directly)."""
        with self._lock:
            held = dict(self._held)
        if not held:
            return
        try:  # one statement for every held lease (a thousand runs: one round trip, not a thousand)
            lost = self._store.leases.renew_many(held, ttl=self._ttl, now=self._clock())
        except StoreError as exc:  # the database is away: keep trying; appends are fenced anyway
            _log.warning("could not renew the leases of %d run(s): %s", len(held), exc)
            return
        for run_id in lost:
            _log.warning("lease on run %s lost: token %d is no longer current (taken over, or the run is gone)",
                         run_id, held[run_id])
            with self._lock:
                if self._held.get(run_id) == held[run_id]:
                    self._held.pop(run_id, None)
                    self._lost.add(run_id)

    def _loop(self) -> None:
        interval = max(self._interval, 0.05)
        while not self._stopping:
            if self._wake.wait(interval):
                break
            with self._lock:
                if not self._held:
                    continue
            self.renew_all()
