"""Many runs on many machines: ``Worker`` processes that claim runs with leases, queue limits and
rates, dead-lettering of runs whose recovery keeps failing, and LISTEN/NOTIFY wake-ups."""

from orchestrator.scale.deadletter import DeadLetterPolicy
from orchestrator.scale.limits import Limits, QueueLimit
from orchestrator.scale.worker import Worker

__all__ = [
    "Worker",
    "Limits",
    "QueueLimit",
    "DeadLetterPolicy",
]
