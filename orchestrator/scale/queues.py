"""Putting work on queues for workers, and taking it off the dead-letter status by hand.

``QueueMixin`` is mixed into ``Orchestrator``:

- ``enqueue(workflow, input, queue=, priority=, dedup_key=, run_id=)`` journals a pending run that
  workers claim (``agentsaga worker``). Exactly-once starts: a ``dedup_key`` already used by a run,
  or a ``run_id`` that exists, returns that run's id and starts nothing (as DBOS does with workflow
  ids and Temporal with workflow-id reuse). On Postgres the insert notifies idle workers at once.
- ``retry_dead(run_id)`` puts a run that went ``dead`` (its recovery failed too often; see
  ``orchestrator/scale/deadletter.py``) back to the status it had; workers pick it up again and its
  failure count starts from zero. ``dead_letters(run_id)`` shows why it died.
- ``stats()``: runs by status, queue depths, recoveries, step latency (``orchestrator/audit/stats.py``).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from orchestrator.audit.stats import Stats, collect_stats
from orchestrator.errors import ConfigurationError, RunStateError
from store import DuplicateRunError

if TYPE_CHECKING:
    from orchestrator.engine.driver import Engine, Live
    from store import Store
    from workflows import Workflow

__all__ = ["QueueMixin", "DEFAULT_QUEUE"]

DEFAULT_QUEUE = "default"


_QUEUE_NAME = re.compile(r"^[^\s=]{1,200}$")  # no '=': the CLI spells limits QUEUE=N


def check_queue_name(queue: Any) -> str:
    if not isinstance(queue, str) or not _QUEUE_NAME.match(queue):
        raise ConfigurationError(f"a queue name must be a non-empty string of at most 200 characters, without "
                                 f"spaces or '=', got {queue!r}")
    return queue


class QueueMixin:
    store: Store
    engine: Engine

    if TYPE_CHECKING:  # provided by Orchestrator
        def _create(self, workflow: Workflow, input: Any, *, run_id: str | None, lease: bool,
                    **placement: Any) -> Live | None: ...

    def enqueue(self, workflow: Workflow, input: Any = None, *, queue: str = DEFAULT_QUEUE, priority: int = 0,
                dedup_key: str | None = None, run_id: str | None = None) -> str:
        """Journal a pending run of ``workflow`` on ``queue`` for workers; returns its run id.

        Higher ``priority`` is claimed first (then oldest first). With a ``dedup_key`` (or a
        ``run_id``) already taken, nothing is started and the existing run's id is returned.
        """
        check_queue_name(queue)
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**31 - 1:
            raise ConfigurationError(f"priority must be an integer (32-bit), got {priority!r}")
        if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key or len(dedup_key) > 200):
            raise ConfigurationError(f"dedup_key must be a non-empty string of at most 200 characters, got {dedup_key!r}")
        try:
            live = self._create(workflow, input, run_id=run_id, lease=False, queue=queue, priority=priority,
                                dedup_key=dedup_key)
        except DuplicateRunError as dup:
            if dup.existing_run_id is None:
                raise  # the clashing run was deleted in between: nothing to return
            return dup.existing_run_id
        if live is None:  # the run id exists (and is of this workflow): that run is the start
            assert run_id is not None
            return run_id
        return live.run_id

    def retry_dead(self, run_id: str) -> str:
        """Put a ``dead`` run back to the status it had before, for workers to pick up now; returns
        that status. Its failure count starts again from zero."""
        restored = self.store.failures.revive(run_id, now=self.engine.cfg.clock(), by=self.engine.cfg.owner)
        if restored is None:
            status = self.store.get_run(run_id).status
            raise RunStateError(f"run {run_id!r} is {status}, not dead; only a dead run can be retried this way "
                                "(resume it to continue it now)")
        return restored

    def dead_letters(self, run_id: str) -> list[dict[str, Any]]:
        """The run's failed recoveries, dead-lettering and retries, oldest first:
        ``{"at", "owner", "kind", "error", "recoveries", "status"}``."""
        return [{"at": at, "owner": owner, "kind": kind, "error": json.loads(error) if error else None,
                 "recoveries": recoveries, "status": status}
                for at, owner, kind, error, recoveries, status in self.store.failures.for_run(run_id)]

    def stats(self, *, runs: int = 500) -> Stats:
        """Runs by status, queue depths, recoveries and step latency percentiles (over the newest
        ``runs`` runs)."""
        return collect_stats(self.store, now=self.engine.cfg.clock(), runs=runs)
