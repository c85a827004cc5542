"""Many runs on many machines: ``Worker`` processes that claim runs with leases, queue limits and
rates, dead-lettering of runs whose recovery keeps failing, and LISTEN/NOTIFY wake-ups."""

# Imported on first use (PEP 562): the CLI's verbs read the limits and the dead-letter policy,
# and only ``worker`` needs the worker (and the engine it drives runs with).
from orchestrator._lazy import lazy_exports

_LAZY = {
    "DeadLetterPolicy": "orchestrator.scale.deadletter",
    "Limits": "orchestrator.scale.limits",
    "QueueLimit": "orchestrator.scale.limits",
    "Worker": "orchestrator.scale.worker",
}

__all__ = [
    "Worker",
    "Limits",
    "QueueLimit",
    "DeadLetterPolicy",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
