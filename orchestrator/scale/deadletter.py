"""Dead-letter: a run whose recovery keeps failing stops being retried, visibly.

A *failed recovery* is either

- an attempt to drive the run that raised something the engine does not handle itself (a step's
  own errors are journaled and routed by the engine; what escapes ``drive`` is a bug, a journal the
  code cannot fold, a store error that outlived its retries, ...): recorded with its error, and the
  run is retried after a backoff (1, 2, 4 ... 60 s) rather than at once; or
- a takeover of a lease whose owner never gave it back: the worker died (killed, out of memory) or
  stalled while driving it. The store counts these (``runs.recoveries``); a run that kills every
  worker that touches it shows up here without anyone having to record anything.

When the count since the run was created (or last retried by hand) exceeds ``max_failures``, the
run moves to status ``dead``: its lease is released, its ``error`` says why with the last errors,
and no worker claims it again. ``agentsaga runs --status dead`` lists such runs,
``orc.dead_letters(run_id)`` shows every failure, and ``orc.retry_dead(run_id)`` /
``agentsaga retry RUN`` puts one back. ``dead`` is not terminal: the run's journal is intact and a
retry continues it from where it was.

The errors recorded here (messages and tracebacks) go through the journal's redaction like any
event (invariant 9): ``redact`` is the Orchestrator's ``JournalRedactor``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from orchestrator.payload.exceptions import error_record
from orchestrator.errors import ConfigurationError
from store import RunRecord, Store

__all__ = ["DeadLetterPolicy", "DEFAULT_MAX_FAILURES"]

_log = logging.getLogger("agentsaga.worker")
DEFAULT_MAX_FAILURES = 10
_LAST = 3  # errors quoted in the dead run's error


class DeadLetterPolicy:
    def __init__(self, store: Store, *, owner: str, clock: Callable[[], float],
                 max_failures: int = DEFAULT_MAX_FAILURES, max_backoff: float = 60.0,
                 redact: Callable[[str], str] | None = None) -> None:
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 0:
            raise ConfigurationError(f"max_failures must be an integer >= 0, got {max_failures!r}")
        self.store = store
        self.owner = owner
        self.clock = clock
        self.max_failures = max_failures
        self.max_backoff = max_backoff
        self.redact = redact or (lambda text: text)

    def _dumps(self, value: Any) -> str:
        return self.redact(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    def _count(self, rec: RunRecord, rows: list[tuple[Any, ...]]) -> tuple[int, list[dict[str, Any]]]:
        """(failures since the last retry, their recorded errors)."""
        baseline, errors = 0, []
        for _at, owner, kind, error, recoveries, _status in rows:
            if kind == "retried":
                baseline, errors = recoveries, []
            elif kind == "error":
                errors.append({"owner": owner, **(json.loads(error) if error else {})})
        return len(errors) + max(0, rec.recoveries - baseline), errors

    def after_claim(self, rec: RunRecord, token: int) -> bool:
        """Called with the run just claimed; True when it went dead instead of being driven."""
        if rec.recoveries == 0:
            return False  # never taken over; errors are judged when they happen (on_error)
        count, errors = self._count(rec, self.store.failures.for_run(rec.run_id))
        if count <= self.max_failures:
            return False
        self._bury(rec, token, count, errors, why=f"its lease was taken over {rec.recoveries} times "
                                                 "(the worker driving it died or stalled)")
        return True

    def on_error(self, rec: RunRecord, token: int, exc: BaseException) -> bool:
        """Record a failed attempt; True when the run went dead (else it is retried after a backoff)."""
        info = json.loads(self._dumps(error_record(exc)))
        count, errors = self._count(rec, self.store.failures.for_run(rec.run_id))
        count += 1
        if count > self.max_failures:
            self._bury(rec, token, count, errors + [{"owner": self.owner, **info}],
                       why=f"{info['type']}: {info['message']}")
            return True
        now = self.clock()
        delay = min(self.max_backoff, 2.0 ** (count - 1))
        self.store.failures.record(rec.run_id, token=token, now=now, owner=self.owner,
                                  error=self._dumps(info), retry_at=now + delay)
        _log.error("run %s: recovery failed (%d of %d allowed), retried in %.0fs: %s: %s", rec.run_id, count,
                   self.max_failures, delay, info["type"], info["message"])
        return False

    def _bury(self, rec: RunRecord, token: int, count: int, errors: list[dict[str, Any]], *, why: str) -> None:
        last = errors[-_LAST:]
        quoted = "; ".join(f"{e.get('type')}: {e.get('message')}" for e in last) or why
        message = f"dead after {count} failed recoveries (more than {self.max_failures}): {quoted}"
        detail = {"failures": count, "max_failures": self.max_failures, "recoveries": rec.recoveries,
                  "why": why, "last_errors": [{k: e.get(k) for k in ("owner", "type", "message")} for e in last]}
        self.store.failures.dead_letter(rec.run_id, token=token, now=self.clock(), owner=self.owner,
                               error=self._dumps(detail), message=json.loads(self._dumps(message))[:2000])
        _log.error("run %s moved to dead: %s (agentsaga retry %s puts it back)", rec.run_id, message, rec.run_id)
