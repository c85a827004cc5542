"""Event kinds: the whole vocabulary of the journal, in one place.

The store sees an event only as a kind string and JSON text; what each kind means is the fold
table in ``orchestrator/engine/fold.py`` (one handler per kind), and the fields each kind carries
are listed in docs/guarantees.md. Reading this module and that table tells the whole meaning of a
journal.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EventKind", "TERMINAL_STATUSES", "ACTIVE_STATUSES"]


class EventKind:
    """Every kind of event a run's journal can hold."""

    # -- a run's life ---------------------------------------------------------------------------
    RUN_STARTED: Final = "RunStarted"            # workflow, version, graph, input, start steps
    RESUMED: Final = "Resumed"                   # a process took the run over (owner, lease, snapshot used)
    SNAPSHOT_REJECTED: Final = "SnapshotRejected"  # a snapshot failed verification and was skipped
    SNAPSHOT_POLICY: Final = "SnapshotPolicy"    # an adaptive policy chose the run's snapshot interval (and why)
    RESTORED: Final = "Restored"                 # the run was brought into this database from a savepoint
    CODE_CHANGED: Final = "CodeChanged"          # on resume: steps whose code differs from the code that ran
    MIGRATED: Final = "Migrated"                 # the state was migrated to a new workflow version
    RUN_COMPLETED: Final = "RunCompleted"
    RUN_FAILED: Final = "RunFailed"
    RUN_CANCELLED: Final = "RunCancelled"

    # -- steps ----------------------------------------------------------------------------------
    STEP_STARTED: Final = "StepStarted"          # durable intent (effects): the idempotency key
    KEY_ISSUED: Final = "KeyIssued"              # an effect attempt's key was read or sent: a re-send is safe
    STEP_COMPLETED: Final = "StepCompleted"      # output, trace, routing decision, timings
    STEP_FAILED: Final = "StepFailed"            # one failed attempt, or the final failure (doubt: its effect may stand)
    STEP_CANCELLED: Final = "StepCancelled"      # the task driving the run was cancelled during an attempt

    # -- inside a step: durable calls, signals, timers ----------------------------------------------
    CALL_COMPLETED: Final = "CallCompleted"      # call i of a step execution returned (model, tool, http)
    CALL_FAILED: Final = "CallFailed"            # call i raised: raised again, not re-performed, in that attempt
    WAIT_STARTED: Final = "WaitStarted"          # the step waits for a signal; the run parks
    SIGNAL_RECEIVED: Final = "SignalReceived"    # a signal was consumed by a waiting step
    WAIT_TIMED_OUT: Final = "WaitTimedOut"        # a wait's timeout passed first: the step was told, and is again
    TIMER_STARTED: Final = "TimerStarted"        # ctx.sleep: the run parks until the wake-up time

    # -- sagas and rollback ---------------------------------------------------------------------
    SAGA_STARTED: Final = "SagaStarted"          # reason failure / cancel / rollback; status compensating
    COMPENSATION_STARTED: Final = "CompensationStarted"
    COMPENSATION_COMPLETED: Final = "CompensationCompleted"
    COMPENSATION_FAILED: Final = "CompensationFailed"
    SAGA_COMPLETED: Final = "SagaCompleted"      # outcome compensated or cancelled
    SAGA_FAILED: Final = "SagaFailed"            # a compensation kept failing: compensation_failed
    SAGA_RETRIED: Final = "SagaRetried"          # orc.compensate: try the remaining compensations again
    ROLLED_BACK: Final = "RolledBack"            # the checkpoint's state is current again


#: A run in one of these never runs a step again.
TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "cancelled", "compensated", "compensation_failed"})
#: Runs that recovery may pick up (once their lease is free or expired; a waiting run once its
#: timer is due or a signal woke it).
ACTIVE_STATUSES: Final = ("pending", "running", "compensating", "waiting")
