"""``Worker``: claims runnable runs from the store and drives up to N of them at once.

    worker = Worker("postgresql://db/agents", ["mypkg.agents"], concurrency=8, queues=["default"])
    worker.run()          # until SIGTERM / SIGINT (or worker.stop() from another thread)

Runnable means: new (pending), a timer due or a signal arrived (waiting, ``wake_at`` passed), or a
lease expired (its worker died or stalled). Claims are one statement (``FOR UPDATE SKIP LOCKED``
on Postgres, ``BEGIN IMMEDIATE`` on SQLite), so many workers on many machines never take the same
run; queue limits are checked in that same transaction (``orchestrator/scale/limits.py``).

How the work is laid out, and why:

- **One event loop per concurrency slot, each in its own thread.** Steps may be sync and block
  (a sync step runs inline on its run's loop), so asyncio tasks on one shared loop would let one
  slow sync step stall every other run, and the claims too. Threads give each run its own loop;
  sync steps doing I/O overlap (the GIL is released), and the engine commits each run under its
  own lock, so runs never wait on each other's commits. CPU-bound steps do not scale with
  threads: run more worker processes (one per core) for those.
- **One claimer.** The thread that called ``run()`` claims for every free slot in one statement
  and hands runs to the slots through a queue: one round trip for a batch of runs, one place that
  applies the limits, one LISTEN connection.
- **No busy loops.** An idle worker waits on an event that is set when a slot frees, when Postgres
  NOTIFYs that a run became claimable (``store.wakeups.listener()``; a trigger sends it on enqueue,
  signal, hand-back and retry), or at the next moment the store says something comes due (a lease
  expiry, a timer: ``store.next_due``). Without NOTIFY (SQLite, or while the LISTEN connection is
  being re-established) it polls, backing off from 50 ms to ``poll`` seconds.
- **Leases and fencing.** Each claimed run is leased; the engine's heartbeat thread renews every
  held lease every ``heartbeat`` seconds (default ``lease_ttl / 3``). A worker that loses a lease
  (paused past it, partitioned) gets ``FencedError`` on its next append and abandons the run; the
  run's new owner restores it from its snapshot (invariant 6).
- **Stopping.** On SIGTERM or SIGINT the worker stops claiming and lets in-flight runs finish for
  up to ``drain`` seconds; then it hands the rest back: each stops at its next step boundary (an
  awaiting async step is cancelled) and its lease is released, so another worker takes it at once
  instead of after the lease expires. A step still running then is in doubt like after a crash
  (effects are re-sent with the same idempotency key). A second signal skips the wait.
  A lease is released only once no code of this process can act for the run any more (invariant
  6). A sync step running on a thread cannot be stopped: its run's lease is kept (renewed) until the
  thread ends, then released (engine/driver.py), and the worker waits up to ``hand_back_grace``
  for that. A sync step running inline holds its slot: the worker waits as long for it. A run still
  in such a step after the grace is *abandoned*: this process writes nothing more of it
  (``JournalWriter.revoke``), and its lease is not released: the step may still be sending (a
  request in flight) until the process exits, and nothing releases a lease after that. A worker
  that closes its Orchestrator stops renewing it, so it expires ``lease_ttl`` after its last renewal
  and another worker takes the run then; with an Orchestrator given (it stays open), it is renewed
  until the step ends and released then. A step that returns after its run was abandoned is
  neither a failure nor a completion: it is logged, counted nowhere else.
- **Runs it cannot drive.** A worker drives only the workflows it was given (registered code,
  invariant 11: a run names its workflow, never a module to import). A run of another workflow (or
  whose graph changed) is released, not failed, with an error in the log, and this worker does not
  claim it again for ``skip_for`` seconds: another worker, with the code, takes it.
- **Runs that keep failing** go to status ``dead`` (``orchestrator/scale/deadletter.py``).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import queue as queue_mod
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from compensations import Compensations
from orchestrator._orchestrator import Orchestrator
from orchestrator.contrib.otel import Tracing
from orchestrator.engine.config import default_owner
from orchestrator.engine.events import ACTIVE_STATUSES, TERMINAL_STATUSES
from orchestrator.engine.loader import AppCode, load_app_code
from orchestrator.engine.queues import check_queue_name
from orchestrator.errors import (
    CodeChangedError,
    ConfigurationError,
    GraphChangedError,
    MigrationError,
    WorkflowNotFoundError,
)
from orchestrator.scale.deadletter import DEFAULT_MAX_FAILURES, DeadLetterPolicy
from orchestrator.scale.limits import Limits, QueueLimit
from orchestrator.scale.wakeups import NotifyListener
from store import FencedError, RunNotFoundError, StoreError, StoreUnavailableError
from workflows import Workflow

__all__ = ["Worker"]

_log = logging.getLogger("agentsaga.worker")
_MIN_IDLE = 0.05  # first poll interval when polling (no NOTIFY)
_HAND_BACK_GRACE = 5.0  # after asking in-flight runs to stop, how long to wait for them


def _seconds(value: Any, what: str, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero):
        raise ConfigurationError(f"{what} must be a {'non-negative' if zero else 'positive'} number of seconds, "
                                 f"got {value!r}")
    return float(value)


class _Slot(threading.Thread):
    """One concurrency slot: a thread with its own event loop, driving one run at a time."""

    def __init__(self, worker: Worker, index: int) -> None:
        super().__init__(name=f"agentsaga-slot-{index}", daemon=True)
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task[Any] | None = None

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        inbox = self.worker._inbox
        try:
            while True:
                item = inbox.get()
                if item is None:
                    return
                run_id, token, queue = item
                try:
                    self.worker._drive(self, run_id, token)
                except BaseException:  # a bug in the worker itself: log it, keep the slot alive
                    _log.exception("run %s: unexpected error in the worker", run_id)
                finally:
                    self.worker._finished(run_id, queue)
        finally:
            self.loop.close()

    def drive(self, coro: Any) -> Any:
        self.task = self.loop.create_task(coro)
        try:
            return self.loop.run_until_complete(self.task)
        finally:
            self.task = None

    def cancel(self) -> None:
        task = self.task
        if task is not None:
            self.loop.call_soon_threadsafe(task.cancel)


class Worker:
    """Claims runs and drives them; see the module docstring for how.

    ``orc_or_url``: an ``Orchestrator`` (its store, workflows and settings are used; it stays
    open) or a database URL (None: ``AGENTSAGA_DB``). ``targets``: the workflows this worker drives,
    as ``Workflow`` objects or apps to import (``"mypkg.agents"``, ``"flows.py"``, either with
    ``":attr"``: see ``orchestrator.engine.loader.load_app``); with an Orchestrator, its registered
    workflows too. Runs of any other workflow are left for other workers. Keyword-only options:

    - ``compensations`` (with a URL only): a ``compensations.Compensations`` registry, as for
      ``Orchestrator``; the registries at the top level of the apps named in ``targets`` are added
      to it (``Compensations.combine``). With an Orchestrator, its own compensations are used
    - ``concurrency`` (4): runs driven at once by this worker
    - ``queues`` (None: every queue, and runs with none): the queues this worker serves
    - ``lease_ttl`` (30 s; with a URL only): a lease expires this long after its last renewal
    - ``heartbeat`` (``lease_ttl / 3``): how often held leases are renewed
    - ``poll`` (2 s): the longest an idle worker waits between looks when NOTIFY is not available
    - ``limits``: a ``Limits`` (queue concurrency and rate, in-flight calls per tool)
    - ``max_failures`` (10): failed recoveries before a run goes ``dead``
    - ``drain`` (20 s): on stop, how long in-flight runs may take to finish before being handed back
    - ``hand_back_grace`` (5 s): then, how long a sync step that cannot be interrupted (inline, or on
      a thread) may take to end before its run is abandoned with its lease kept (docs/scale.md)
    - ``skip_for`` (60 s): how long a run this worker cannot import is left to other workers
    - ``tracing`` (False): OpenTelemetry spans per run and step (needs the ``otel`` extra); True
      for the global tracer provider, or a provider
    - ``redact`` / ``redact_fields`` (with a URL only): extra redaction, as for ``Orchestrator``
    """

    def __init__(self, orc_or_url: Orchestrator | str | None = None, targets: Iterable[str | Workflow] = (), *,
                 concurrency: int = 4, queues: Sequence[str] | None = None, lease_ttl: float | None = None,
                 heartbeat: float | None = None, poll: float = 2.0, limits: Limits | None = None,
                 max_failures: int = DEFAULT_MAX_FAILURES, drain: float = 20.0, skip_for: float = 60.0,
                 hand_back_grace: float = _HAND_BACK_GRACE, tracing: Any = False, owner: str | None = None,
                 store_options: dict[str, Any] | None = None, redact: Iterable[str] = (),
                 redact_fields: Iterable[str] = (), compensations: Compensations | None = None) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if isinstance(queues, str):
            raise ConfigurationError(f"queues must be a list of queue names, got the string {queues!r}")
        self.queues = None if queues is None else [check_queue_name(q) for q in dict.fromkeys(queues)]
        if self.queues == []:
            raise ConfigurationError("queues is empty: give at least one queue name, or None for every queue")
        self.poll = _seconds(poll, "poll")
        self.drain = _seconds(drain, "drain", zero=True)
        self.hand_back_grace = _seconds(hand_back_grace, "hand_back_grace", zero=True)
        self.skip_for = _seconds(skip_for, "skip_for", zero=True)
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigurationError(f"limits must be a Limits, got {limits!r}")
        self.limits = limits or Limits()
        if self.queues is not None:
            unserved = sorted(set(self.limits.queues) - set(self.queues))
            if unserved:
                _log.warning("limits name queues this worker does not serve: %s", ", ".join(unserved))
        if isinstance(targets, (str, Workflow)):
            targets = [targets]
        if compensations is not None and not isinstance(compensations, Compensations):
            raise ConfigurationError(f"compensations must be a compensations.Compensations registry, "
                                     f"got {compensations!r}")
        code = AppCode(compensations=(compensations,) if compensations is not None else ())
        for t in targets:
            app = load_app_code(t) if isinstance(t, str) else AppCode((t,))
            for wf in app.workflows:
                if not isinstance(wf, Workflow):
                    raise ConfigurationError(f"targets must be app modules ('mypkg.agents', 'flows.py', "
                                             f"'module:attr') or Workflow objects, got {wf!r}")
            code += app
        workflows = list(code.workflows)
        beat = None if heartbeat is None else _seconds(heartbeat, "heartbeat")
        if isinstance(orc_or_url, Orchestrator):
            self.orc, self._owns_orc = orc_or_url, False
            _check_given(orc_or_url, lease_ttl=lease_ttl, heartbeat=beat, limits=self.limits, tracing=tracing,
                         owner=owner, store_options=store_options, redact=tuple(redact) or tuple(redact_fields),
                         compensations=compensations)
            self.orc.register(*workflows)
            found = [o for o in orc_or_url.engine.journal.observers if isinstance(o, Tracing)]
            self.tracing = found[0] if found else None
        else:
            ttl = 30.0 if lease_ttl is None else _seconds(lease_ttl, "lease_ttl")
            if beat is not None and beat >= ttl:
                raise ConfigurationError(f"heartbeat ({beat:g}s) must be shorter than lease_ttl ({ttl:g}s)")
            owner = owner or default_owner()
            self.tracing = Tracing(None if tracing is True else tracing, owner=owner) if tracing else None
            self.orc = Orchestrator(orc_or_url, workflows=workflows, lease_ttl=ttl, heartbeat=beat, owner=owner,
                                    store_options=store_options, tool_limits=self.limits.tool_limits,
                                    compensations=code.registry(),
                                    redact=redact, redact_fields=redact_fields,
                                    observers=[self.tracing] if self.tracing is not None else ())
            self._owns_orc = True
        self.store = self.orc.store
        self.owner = self.orc.owner
        self.concurrency = concurrency
        self.dead = DeadLetterPolicy(self.store, owner=self.owner, clock=self.orc.engine.config.clock,
                                     max_failures=max_failures, redact=self.orc.engine.journal.redact)
        self._inbox: queue_mod.Queue[tuple[str, int, str | None] | None] = queue_mod.Queue()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._hurry = False
        self._running: dict[str, tuple[int, _Slot | None]] = {}  # run_id -> (token, slot)
        self._by_queue: dict[str, int] = {}
        self._handing_back: set[str] = set()
        #: runs handed back whose lease the engine keeps while a sync step of them runs on a thread
        self._thread_held: dict[str, int] = {}  # run_id -> token
        #: runs given up at shutdown while a step of them still ran here (see "Stopping" above)
        self._abandoned: set[str] = set()
        self._skip: dict[str, float] = {}  # run_id -> monotonic time until which it is left alone
        self._slots: list[_Slot] = []
        self._listener: NotifyListener | None = None
        self._rotate = 0
        #: counters for `stats` and benchmarks (this process only)
        self.counts = {"claimed": 0, "completed": 0, "handed_back": 0, "fenced": 0, "failed_recoveries": 0,
                       "dead": 0, "skipped": 0, "abandoned": 0}

    # -- lifecycle ---------------------------------------------------------------------------------
    def run(self, *, install_signals: bool = True) -> None:
        """Claim and drive until ``stop()`` (or SIGTERM / SIGINT when called in the main thread)."""
        restore = self._install_signals() if install_signals else {}
        try:
            self._start()
            self._loop()
        finally:
            self._shutdown()
            for sig, handler in restore.items():
                signal.signal(sig, handler)

    def stop(self, *, hurry: bool = False) -> None:
        """Stop claiming; in-flight runs get ``drain`` seconds (none with ``hurry``) before hand-back."""
        if self._stopping.is_set():
            hurry = True  # asked twice
        self._hurry = self._hurry or hurry
        self._stopping.set()
        self._wake.set()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame: self.stop())
        return previous

    def _start(self) -> None:
        for i in range(self.concurrency):
            slot = _Slot(self, i)
            slot.start()
            self._slots.append(slot)
        listener_ok = self.store.dialect == "postgresql"
        if listener_ok:
            self._listener = NotifyListener(self.store, wake=self._wake, stop=self._stopping, queues=self.queues,
                                       max_backoff=self.poll)
            self._listener.start()
        _log.info("worker %s ready: concurrency %d, queues %s, lease %gs, %s", self.owner, self.concurrency,
                  ", ".join(self.queues) if self.queues else "all", self.orc.engine.config.lease_ttl,
                  "LISTEN/NOTIFY" if listener_ok else f"polling up to every {self.poll:g}s")

    @property
    def _listening_now(self) -> bool:
        return self._listener is not None and self._listener.listening

    # -- claiming ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        idle = _MIN_IDLE
        while not self._stopping.is_set():
            free = self.concurrency - len(self._running)
            found, blocked = 0, False
            if free > 0:
                try:
                    found, blocked = self._claim(free)
                except StoreError as exc:  # the database is away: try again later
                    _log.warning("claiming failed: %s", exc)
                    blocked = True
            if found and found == free:
                idle = _MIN_IDLE
                continue  # slots are full now; the next round waits for one to free
            if found:
                idle = _MIN_IDLE
            timeout = self._idle_timeout(free, found, blocked, idle)
            if not self._listening_now or blocked:
                idle = min(self.poll, idle * 2)
            self._wake.wait(timeout)
            self._wake.clear()

    def _idle_timeout(self, free: int, found: int, blocked: bool, idle: float) -> float | None:
        if free <= 0:
            return None if self._listening_now else self.poll  # a finishing run wakes us
        # While LISTEN works, new work announces itself and next_due covers leases and timers seen so
        # far; a lease taken since without a NOTIFY (a run started by orc.run elsewhere) is caught
        # within one lease length by this longest sleep.
        safety_net = max(self.poll, self.orc.engine.config.lease_ttl)
        limit = idle if (not self._listening_now or blocked) else safety_net
        # Asked after a partial claim too: a dead worker's leases expire one by one (each was renewed
        # at its own moment), and the next one must be taken when it expires, not a safety net later.
        try:
            due = self.store.wakeups.next_due(now=self.orc.engine.config.clock(), statuses=ACTIVE_STATUSES, queues=self.queues)
        except StoreError:
            return limit
        if due is None:
            return limit
        return max(0.0, min(limit, due - self.orc.engine.config.clock() + 0.01))

    def _claim(self, free: int) -> tuple[int, bool]:
        """Claim up to ``free`` runs (limited queues first, in turn) and hand them to the slots.
        Returns (runs claimed, whether a limit held some back)."""
        cfg = self.orc.engine.config
        skip = self._skipped()
        limited = {q: lim for q, lim in self.limits.queues.items() if self.queues is None or q in self.queues}
        names = list(limited)
        if names:
            self._rotate = (self._rotate + 1) % len(names)
            names = names[self._rotate:] + names[:self._rotate]
        got: list[tuple[str, int, str | None]] = []
        blocked = False
        for q in names:
            lim: QueueLimit = limited[q]
            room = free - len(got)
            if lim.worker_concurrency is not None:
                local = lim.worker_concurrency - self._by_queue.get(q, 0)
                blocked = blocked or local <= 0
                room = min(room, local)
            if room <= 0:
                continue
            if lim.shared:
                claimed, cut = self.store.queues.claim_from(q, owner=self.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                                           statuses=ACTIVE_STATUSES, limit=room,
                                                           concurrency=lim.concurrency, rate=lim.rate, not_runs=skip)
                # Room frees when another worker's run ends, which nobody announces: poll then.
                blocked = blocked or cut
            else:
                claimed = self.store.queues.claim_some(owner=self.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                                statuses=ACTIVE_STATUSES, limit=room, queues=[q], not_runs=skip)
            got += [(run_id, token, q) for run_id, token in claimed]
        room = free - len(got)
        others = None if self.queues is None else [q for q in self.queues if q not in limited]
        if room > 0 and others != []:
            claimed = self.store.queues.claim_some(owner=self.owner, ttl=cfg.lease_ttl, now=cfg.clock(),
                                            statuses=ACTIVE_STATUSES, limit=room, queues=others,
                                            not_queues=list(limited) if others is None else (), not_runs=skip)
            got += [(run_id, token, None) for run_id, token in claimed]
        with self._lock:
            for run_id, token, q in got:
                self._running[run_id] = (token, None)
                if q is not None:
                    self._by_queue[q] = self._by_queue.get(q, 0) + 1
        for item in got:
            self._inbox.put(item)
        self._count("claimed", len(got))
        return len(got), blocked

    def _skipped(self) -> list[str]:
        if not self._skip:
            return []
        now = time.monotonic()
        with self._lock:
            for run_id in [r for r, until in self._skip.items() if until <= now]:
                del self._skip[run_id]
            return list(self._skip)[-500:]  # bounded: the claim's NOT IN list stays small

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def _finished(self, run_id: str, queue: str | None) -> None:
        with self._lock:
            self._running.pop(run_id, None)
            self._handing_back.discard(run_id)
            if queue is not None:
                self._by_queue[queue] = max(0, self._by_queue.get(queue, 0) - 1)
        self._wake.set()

    # -- driving (on a slot's thread) ---------------------------------------------------------------
    def _drive(self, slot: _Slot, run_id: str, token: int) -> None:
        with self._lock:
            if run_id in self._running:
                self._running[run_id] = (token, slot)
        orc, store = self.orc, self.store
        clock = orc.engine.config.clock
        try:
            rec = store.get_run(run_id)
            if self.dead.after_claim(rec, token):
                self._count("dead")
                return
        except (StoreError, RunNotFoundError) as exc:
            _log.warning("run %s: could not read it after claiming: %s", run_id, exc)
            return
        if self.tracing is not None:
            self.tracing.start_run(run_id, rec.workflow, clock(), token=token)
        status, error = "abandoned", None
        try:
            if run_id in self._handing_back or (self._stopping.is_set() and self._hurry):
                raise asyncio.CancelledError  # claimed just before the stop: give it straight back
            orc.workflows.for_run(rec)  # registered here, or WorkflowNotFoundError: another worker's
            result = slot.drive(orc.engine.drive_claimed(run_id, token))
            status, error = result.status, result.error
            if status not in TERMINAL_STATUSES and status != "waiting":
                self._release(run_id, token)  # a run the journal says is not runnable: do not sit on it
            self._count("completed", int(status in TERMINAL_STATUSES))
        except (FencedError, asyncio.CancelledError) as exc:
            if run_id in self._abandoned:
                self._returned_late(run_id, token, exc)
            elif run_id in self._handing_back or isinstance(exc, asyncio.CancelledError):
                status = "handed_back"
                if orc.engine.heartbeat.holds(run_id):
                    # A cancelled drive keeps the lease (still renewed) while a sync step's thread
                    # that cannot be stopped runs, and releases it when that thread ends: never
                    # release under that thread. _hand_back waits for it.
                    with self._lock:
                        self._thread_held[run_id] = token
                    _log.info("run %s handed back; its lease is kept until its step's thread ends", run_id)
                else:
                    self._release(run_id, token)
                    self._count("handed_back")
                    _log.info("run %s handed back (lease released for another worker)", run_id)
            else:
                self._count("fenced")
                _log.warning("run %s: lease lost, abandoned (%s: %s)", run_id, type(exc).__name__, exc)
        except (WorkflowNotFoundError, GraphChangedError, CodeChangedError, MigrationError) as exc:
            # Not this run's failure: this worker's code cannot drive it (another workflow, a changed
            # graph, step code the workflow refuses to mix, a migration that fails). Another worker
            # with the run's code can; counting it as a failed recovery would dead-letter it.
            with self._lock:
                self._skip[run_id] = time.monotonic() + self.skip_for
            self._count("skipped")
            _log.error("run %s left for another worker: this one cannot drive it: %s", run_id, exc)
            self._release(run_id, token)
        except StoreUnavailableError as exc:
            if run_id in self._abandoned:
                self._returned_late(run_id, token, exc)
                return
            _log.error("run %s: the database is unavailable; its lease will expire and it will be recovered: %s",
                       run_id, exc)
        except Exception as exc:
            if run_id in self._abandoned:  # e.g. its next store call met the store closed at shutdown
                self._returned_late(run_id, token, exc)
                return
            self._count("failed_recoveries")
            error = f"{type(exc).__name__}: {exc}"
            try:
                if self.dead.on_error(rec, token, exc):
                    self._count("dead")
            except StoreError as store_exc:
                _log.error("run %s failed (%s) and the failure could not be recorded: %s", run_id, error, store_exc)
        finally:
            if self.tracing is not None:
                self.tracing.end_run(run_id, status, clock(), error=error)

    def _returned_late(self, run_id: str, token: int, exc: BaseException) -> None:
        """A step of a run abandoned at shutdown returned after all. Not the run's failure (nothing of
        it was journaled: the run is as the journal had it, resumable), and counted nowhere: the run
        was counted as abandoned. With an Orchestrator that stays open, nothing of this process acts
        for the run any more now: its lease is released. Otherwise it is left to expire."""
        if self._owns_orc:
            _log.info("run %s: its step returned after the worker gave the run up; nothing of it was journaled "
                      "(%s: %s)", run_id, type(exc).__name__, exc)
            return
        self._release(run_id, token)
        _log.info("run %s: its step returned after the worker gave the run up; nothing of it was journaled, "
                  "its lease is released now (%s: %s)", run_id, type(exc).__name__, exc)

    def _release(self, run_id: str, token: int) -> None:
        try:
            self.store.leases.release(run_id, token=token, now=self.orc.engine.config.clock())
        except FencedError:
            pass  # someone else holds it already: nothing of ours to give back
        except StoreError as exc:
            _log.warning("run %s: could not release its lease (it expires on its own): %s", run_id, exc)

    # -- stopping -----------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        deadline = time.monotonic() + (0.0 if self._hurry else self.drain)
        if self._running:
            _log.info("stopping: %d run(s) in flight; waiting up to %.0fs for them", len(self._running),
                      max(0.0, deadline - time.monotonic()))
        while self._running and time.monotonic() < deadline and not self._hurry:
            self._wake.wait(0.1)
            self._wake.clear()
        kept: dict[str, str] = {}
        if self._running:
            kept = self._hand_back()
        for _ in self._slots:
            self._inbox.put(None)
        with self._lock:
            stuck = {slot for _token, slot in self._running.values()}
        end = time.monotonic() + 2.0
        for slot in self._slots:
            if slot not in stuck:  # a slot stuck in a sync step is a daemon thread: leave it behind
                slot.join(timeout=max(0.0, end - time.monotonic()))
        if self._owns_orc:
            self.orc.engine.heartbeat.stop()  # no more renewals: a lease kept runs out from its last one
            for run_id, where in kept.items():
                _log.warning("run %s: a step was still running %s when the worker stopped; its lease is kept "
                             "until it expires%s, not released while the step could still act (a request "
                             "in flight); another worker takes the run then", run_id, where, self._expiry(run_id))
            self.orc.close()
        else:
            for run_id, where in kept.items():
                _log.warning("run %s: a step was still running %s when the worker stopped; its lease is kept, "
                             "renewed by this process, until the step ends, and released then", run_id, where)
        _log.info("worker %s stopped: %s", self.owner, self.counts)

    def _expiry(self, run_id: str) -> str:
        """' at <UTC time> (in N s)' for a run's lease held by this worker, or '' if it cannot tell."""
        try:
            rec = self.store.get_run(run_id)
        except (StoreError, RunNotFoundError):
            return ""
        if rec.lease_owner != self.owner or rec.lease_expires_at is None:
            return ""
        at = datetime.datetime.fromtimestamp(rec.lease_expires_at, datetime.timezone.utc)
        left = rec.lease_expires_at - self.orc.engine.config.clock()
        return f" at {at.isoformat(timespec='seconds').replace('+00:00', 'Z')} (in {max(0.0, left):.0f}s)"

    def _hand_back(self) -> dict[str, str]:
        """Ask every run in flight to stop, wait up to the grace for each to be given back, and abandon
        the rest (a step of them still runs in this process). Returns {run_id: where its step runs}
        for the runs abandoned, whose leases are kept."""
        heartbeat = self.orc.engine.heartbeat
        with self._lock:
            running = dict(self._running)
            self._handing_back.update(running)
        for run_id, (_token, slot) in running.items():
            heartbeat.abandon(run_id)
            if slot is not None:
                slot.cancel()
        end = time.monotonic() + self.hand_back_grace
        while True:
            self._settle_threads()
            if (not self._running and not self._thread_held) or time.monotonic() >= end:
                break
            self._wake.wait(0.05)
            self._wake.clear()
        # Still running: inline in a slot (a sync step cannot be interrupted), or on a thread. The step
        # may still act (a request in flight) until this process exits, and nothing can release the
        # lease after that: keep it. Nothing more of the run is journaled here from now on.
        with self._lock:
            kept = {run_id: (token, "inline") for run_id, (token, _slot) in self._running.items()}
            kept.update({run_id: (token, "on a thread") for run_id, token in self._thread_held.items()})
            self._abandoned.update(kept)
        for run_id, (token, _where) in kept.items():
            self.orc.engine.journal.revoke(run_id, token)
        self._settle_threads()  # a thread that ended just now has released its run's lease
        with self._lock:
            kept = {run_id: v for run_id, v in kept.items() if v[1] == "inline" or run_id in self._thread_held}
        self._count("abandoned", len(kept))
        return {run_id: where for run_id, (_token, where) in kept.items()}

    def _settle_threads(self) -> None:
        """Runs handed back while a step thread ran, whose thread has ended: the engine released the
        lease as it ended (or it was lost meanwhile): handed back now."""
        heartbeat = self.orc.engine.heartbeat
        with self._lock:
            stopped = [(run_id, token) for run_id, token in self._thread_held.items() if not heartbeat.holds(run_id)]
        # The step thread stops the renewals before it gives the lease back: only a lease the store no
        # longer holds for this worker is handed back (the thread may still be releasing it).
        ended = [run_id for run_id, token in stopped if self._gone(run_id, token)]
        with self._lock:
            for run_id in ended:
                self._thread_held.pop(run_id, None)
        for run_id in ended:
            self._count("handed_back")
            _log.info("run %s: its step's thread ended; handed back (lease released for another worker)", run_id)


    def _gone(self, run_id: str, token: int) -> bool:
        """Whether the store no longer holds the run's lease ``token`` for this worker (released, or
        taken over). Unknown while the store cannot be read: not gone."""
        try:
            rec = self.store.get_run(run_id)
        except RunNotFoundError:
            return True
        except StoreError:
            return False
        return rec.lease_owner != self.owner or rec.lease_token != token


def _check_given(orc: Orchestrator, *, lease_ttl: Any, heartbeat: float | None, limits: Limits, tracing: Any,
                 owner: str | None, store_options: Any, redact: Any = (), compensations: Any = None) -> None:
    """With an Orchestrator given, what shapes driving is the Orchestrator's own setting."""
    config = orc.engine.config
    if lease_ttl is not None and lease_ttl != config.lease_ttl:
        raise ConfigurationError("lease_ttl is the Orchestrator's: pass Orchestrator(..., lease_ttl=...)")
    if heartbeat is not None and heartbeat != config.heartbeat:
        raise ConfigurationError("heartbeat is the Orchestrator's: pass Orchestrator(..., heartbeat=...)")
    if limits.tools and (orc.tools.call_limits is None or orc.tools.call_limits.limits != dict(limits.tools)):
        raise ConfigurationError("tool limits are the Orchestrator's: pass Orchestrator(..., tool_limits=...)")
    if tracing:
        raise ConfigurationError("with an Orchestrator, pass Orchestrator(..., observers=[Tracing(...)]); the worker "
                                 "uses it for run spans")
    if owner is not None or store_options is not None:
        raise ConfigurationError("owner and store_options are the Orchestrator's when one is given")
    if redact:
        raise ConfigurationError("redaction is the Orchestrator's: pass Orchestrator(..., redact=..., redact_fields=...)")
    if compensations is not None:
        raise ConfigurationError("compensations are the Orchestrator's: pass Orchestrator(..., compensations=...)")
