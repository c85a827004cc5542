"""The store's edge towards the driver: connections per thread, error translation, retries.

Every public method of the Store and its parts runs its database work as
`boundary.run(op, work)` (`op` names the method, e.g. "append" or "leases.acquire"), where
`work(conn)` is plain driver code. This is the one place that
- hands each thread its own DBAPI connection (or, for SQLite :memory:, serialises all threads
  on the single connection that holds the database);
- translates driver exceptions: `StoreError`s raised by `work` pass through, a driver error is
  classified by the dialect and becomes a retry, `StoreUnavailableError`, `SchemaVersionError`
  (a table or column missing: the schema was changed outside agentsaga), or `StoreError`
  (with the driver exception kept as `__cause__`, never raised itself);
- retries transient failures with exponential backoff and jitter (tenacity) for `retry_for`
  seconds, replacing connections that broke.

The first attempt runs outside tenacity: building a `Retrying` costs microseconds on every
call, and the hot path should cost one INSERT+COMMIT, not one plus bookkeeping.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import RetryError, Retrying, retry_if_exception_type, stop_before_delay
from tenacity import wait_exponential_jitter

from ._dialect import Dialect, ErrorKind
from .errors import StoreError, StoreUnavailableError

__all__ = ["Boundary"]

T = TypeVar("T")


class _Retryable(Exception):
    """Internal: a transient failure; never leaves this module."""

    def __init__(self, cause: BaseException, kind: ErrorKind):
        super().__init__(str(cause))
        self.cause = cause
        self.kind = kind


class _Slot:
    """One open connection and the thread it belongs to (None when shared)."""

    __slots__ = ("conn", "thread")

    def __init__(self, conn: Any, thread: threading.Thread | None):
        self.conn = conn
        self.thread = thread


class Boundary:
    def __init__(
        self, dialect: Dialect, *, retry_for: float, sleep: Callable[[float], None] = time.sleep
    ):
        self._d = dialect
        self._retry_for = retry_for
        self._sleep = sleep
        self._local = threading.local()
        self._slots: list[_Slot] = []  # every open connection, so close() reaches them all
        self._slots_lock = threading.Lock()
        self._shared_lock = threading.RLock() if dialect.shared else None
        self._shared: _Slot | None = None
        self._inherited: list[_Slot] = []  # see _forget_after_fork
        self._closed = False
        _LIVE.add(self)

    # -- running work --------------------------------------------------------------------------

    def run(
        self,
        op: str,
        work: Callable[[Any], T],
        *,
        on_disconnect: Callable[[], None] | None = None,
    ) -> T:
        """`work(conn)` with translation and retries; `on_disconnect` hears of lost sessions."""
        if self._closed:
            raise StoreError(f"{op}: the store for {self._d.url} is closed")
        try:
            return self._attempt(op, work, on_disconnect)
        except _Retryable as first:
            if self._retry_for <= 0:
                raise self._unavailable(first) from first.cause
        try:
            for attempt in Retrying(
                stop=stop_before_delay(self._retry_for),
                wait=wait_exponential_jitter(multiplier=0.01, max=1.0, jitter=0.05),
                retry=retry_if_exception_type(_Retryable),
                sleep=self._sleep,
            ):
                with attempt:
                    if self._closed:
                        raise StoreError(f"{op}: the store for {self._d.url} is closed")
                    return self._attempt(op, work, on_disconnect)
        except RetryError as gave_up:
            last = gave_up.last_attempt.exception()
            assert isinstance(last, _Retryable)
            raise self._unavailable(last) from last.cause
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _attempt(
        self, op: str, work: Callable[[Any], T], on_disconnect: Callable[[], None] | None
    ) -> T:
        lock = self._shared_lock
        if lock is not None:
            with lock:
                return self._attempt_unlocked(op, work, on_disconnect)
        return self._attempt_unlocked(op, work, on_disconnect)

    def _attempt_unlocked(
        self, op: str, work: Callable[[Any], T], on_disconnect: Callable[[], None] | None
    ) -> T:
        d = self._d
        conn = None
        try:
            conn = self._conn()
            return work(conn)
        except StoreError:
            raise
        except d.driver_errors as exc:
            kind = d.classify(exc, conn)
            if conn is not None and (kind is ErrorKind.DISCONNECT or d.is_broken(conn)):
                self._discard(conn)
            if kind is ErrorKind.DISCONNECT and on_disconnect is not None:
                on_disconnect()
            if kind in (ErrorKind.TRANSIENT, ErrorKind.DISCONNECT):
                raise _Retryable(exc, kind) from exc
            if kind is ErrorKind.UNAVAILABLE:
                raise StoreUnavailableError(
                    f"{op}: database {d.url} is unavailable (not retried: it cannot help): {str(exc).strip()}",
                    url=d.url,
                ) from exc
            if kind is ErrorKind.SCHEMA:
                raise d.schema_error(exc, op) from exc
            raise StoreError(f"{op} failed on {d.url}: {type(exc).__name__}: {exc}") from exc

    def _unavailable(self, last: _Retryable) -> StoreUnavailableError:
        cause = last.cause
        return StoreUnavailableError(
            f"database {self._d.url} is unavailable after retrying for {self._retry_for:g} s: "
            f"{type(cause).__name__}: {str(cause).strip()}",
            url=self._d.url,
        )

    # -- connections ---------------------------------------------------------------------------

    def _conn(self) -> Any:
        slot = self._shared if self._shared_lock is not None else getattr(self._local, "slot", None)
        if slot is None:
            slot = self._open()
        return slot.conn

    def _open(self) -> _Slot:
        conn = self._d.connect()
        shared = self._shared_lock is not None
        slot = _Slot(conn, None if shared else threading.current_thread())
        with self._slots_lock:
            if self._closed:  # close() ran while we were connecting
                self._d.close(conn)
                raise StoreError(f"the store for {self._d.url} is closed")
            dead = [s for s in self._slots if s.thread is not None and not s.thread.is_alive()]
            for s in dead:
                self._slots.remove(s)
            self._slots.append(slot)
        for s in dead:
            self._close_quietly(s.conn)
        if shared:
            self._shared = slot
        else:
            self._local.slot = slot
        return slot

    def _discard(self, conn: Any) -> None:
        with self._slots_lock:
            self._slots = [s for s in self._slots if s.conn is not conn]
        if self._shared is not None and self._shared.conn is conn:
            self._shared = None
        if getattr(self._local, "slot", None) is not None and self._local.slot.conn is conn:
            self._local.slot = None
        self._close_quietly(conn)

    def _close_quietly(self, conn: Any) -> None:
        try:
            self._d.close(conn)
        except self._d.driver_errors:
            # Only for connections already known to be dead or abandoned: the error that made
            # us drop it is being reported or retried, and a failed close cannot lose data.
            pass

    def close(self) -> None:
        """Close every connection; idempotent. Later calls raise `StoreError`."""
        with self._slots_lock:
            self._closed = True
            slots, self._slots = self._slots, []
        self._shared = None
        errors: list[BaseException] = []
        for slot in slots:
            try:
                self._d.close(slot.conn)
            except self._d.driver_errors as exc:
                errors.append(exc)
        if errors:
            first = errors[0]
            raise StoreError(f"closing connections to {self._d.url} failed: {first}") from first

    def _forget_after_fork(self) -> None:
        # A forked child must not use its parent's connections (they share the socket or the
        # file locks), and must not close them either: closing would end the parent's Postgres
        # session or drop its SQLite locks. Keep them referenced, unused, and open new ones.
        if self._shared_lock is not None:
            return  # a :memory: database is the child's own copy; keep using it
        self._inherited.extend(self._slots)
        self._slots = []
        self._local = threading.local()
        self._slots_lock = threading.Lock()


_LIVE: weakref.WeakSet[Boundary] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for boundary in list(_LIVE):
        boundary._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
