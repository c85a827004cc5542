"""What wakes an idle worker on Postgres: a thread LISTENing for the store's NOTIFY.

The trigger created with the schema NOTIFies the schema's channel, with the run's queue as payload,
whenever a run may have become claimable (``store/_wakeups.py``). This thread turns a relevant
notification into ``wake.set()``. When the connection is lost (Postgres restarting) it says so
(``listening`` goes False, so the worker polls meanwhile) and reconnects with backoff; once back it
wakes the worker once, since notifications sent while away are gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from store import Store, StoreError

__all__ = ["NotifyListener"]

_log = logging.getLogger("agentsaga.worker")
_WAIT = 5.0  # how often the thread looks at the stop flag while nothing arrives


class NotifyListener(threading.Thread):
    def __init__(self, store: Store, *, wake: threading.Event, stop: threading.Event,
                 queues: Sequence[str] | None, max_backoff: float) -> None:
        super().__init__(name="agentsaga-listen", daemon=True)
        self.store = store
        self.wake = wake
        self.stop = stop
        self.queues = None if queues is None else set(queues)
        self.max_backoff = max_backoff
        self.listening = False  # read by the worker: poll while this is False

    def run(self) -> None:
        backoff, lost = 0.1, False
        listener = None
        while not self.stop.is_set():
            if listener is None:
                try:
                    listener = self.store.wakeups.listener()
                except StoreError:
                    self.listening = False
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                if listener is None:
                    return  # no LISTEN on this backend
                if lost:
                    _log.info("LISTEN connection re-established")
                backoff, lost = 0.1, False
                self.listening = True
                self.wake.set()  # notifications may have been missed while away: look once
            try:
                payloads = listener.wait(_WAIT)
            except StoreError as exc:
                _log.warning("LISTEN connection lost, polling until it is back: %s", exc)
                self.listening, lost, listener = False, True, None
                self.wake.set()
                continue
            if payloads and (self.queues is None or not self.queues.isdisjoint(payloads)):
                self.wake.set()
        if listener is not None:
            listener.close()
