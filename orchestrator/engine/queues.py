"""Putting runs on queues for workers, and taking a run off the dead-letter status by hand.

``Queues`` is the Orchestrator's producer part (``orc.queues``; ``orc.enqueue`` and
``orc.retry_dead`` delegate to it). Every Orchestrator has it, not only workers: a web handler
enqueues and returns, workers (``orchestrator.scale``) claim.

- ``enqueue(workflow, input, queue=, priority=, dedup_key=, run_id=)`` journals a pending run that
  workers claim. Exactly-once starts: a ``dedup_key`` already used by a run, or a ``run_id`` that
  exists, returns that run's id and starts nothing. On Postgres the insert notifies idle workers.
- ``retry_dead(run_id)`` puts a run that went ``dead`` (its recovery failed too often; see
  ``orchestrator/scale/deadletter.py``) back to the status it had; workers pick it up again and
  its failure count starts from zero.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.engine.names import name_problem, shown
from orchestrator.errors import ConfigurationError, RunStateError
from store import DuplicateRunError, Store
from workflows import Workflow

if TYPE_CHECKING:
    from orchestrator.engine.journal import ActiveRun

__all__ = ["Queues", "DEFAULT_QUEUE", "check_queue_name"]

DEFAULT_QUEUE = "default"


_QUEUE_NAME = re.compile(r"^[^\s=]{1,200}$")  # no '=': the CLI spells limits QUEUE=N


def check_queue_name(queue: Any) -> str:
    if not isinstance(queue, str) or not _QUEUE_NAME.match(queue) or name_problem(queue) is not None:
        raise ConfigurationError(f"a queue name must be a non-empty string of at most 200 characters, without "
                                 f"spaces, '=' or control characters, got {shown(queue)}")
    return queue


class Queues:
    """The producer side of queues (see the module docstring). ``create_run`` is ``Engine.create``."""

    def __init__(self, store: Store, *, create_run: Callable[..., ActiveRun | None], clock: Callable[[], float],
                 owner: str) -> None:
        self.store = store
        self._create_run = create_run
        self.clock = clock
        self.owner = owner

    def enqueue(self, workflow: Workflow, input: Any = None, *, queue: str = DEFAULT_QUEUE, priority: int = 0,
                dedup_key: str | None = None, run_id: str | None = None) -> str:
        """Journal a pending run of ``workflow`` on ``queue`` for workers; returns its run id.

        Higher ``priority`` is claimed first (then oldest first). With a ``dedup_key`` (or a
        ``run_id``) already taken, nothing is started and the existing run's id is returned.
        """
        check_queue_name(queue)
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 2**31 - 1:
            raise ConfigurationError(f"priority must be an integer (32-bit), got {priority!r}")
        if dedup_key is not None and (problem := name_problem(dedup_key)) is not None:
            raise ConfigurationError(f"dedup_key must be {problem}, got {shown(dedup_key)}")
        try:
            created = self._create_run(workflow, input, run_id=run_id, lease=False, queue=queue,
                                       priority=priority, dedup_key=dedup_key)
        except DuplicateRunError as dup:
            if dup.existing_run_id is None:
                raise  # the clashing run was deleted in between: nothing to return
            return dup.existing_run_id
        if created is None:  # the run id exists (and is of this workflow): that run is the start
            assert run_id is not None
            return run_id
        return created.run_id

    def retry_dead(self, run_id: str) -> str:
        """Put a ``dead`` run back to the status it had before, for workers to pick up now; returns
        that status. Its failure count starts again from zero."""
        restored = self.store.failures.revive(run_id, now=self.clock(), by=self.owner)
        if restored is None:
            status = self.store.get_run(run_id).status
            raise RunStateError(f"run {run_id!r} is {status}, not dead; only a dead run can be retried this way "
                                "(resume it to continue it now)")
        return restored
