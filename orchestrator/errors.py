"""Errors raised by the engine. Store errors (``RunNotFoundError``, ``FencedError``, ...) come from
``store.errors`` and are re-exported by ``orchestrator``; workflow definition errors from
``workflows.errors``.

    OrchestratorError            base of the engine's errors
     ├── ConfigurationError      an Orchestrator option is invalid
     ├── WorkflowNotFoundError   the run's workflow is not registered here, or a named app cannot be imported
     ├── GraphChangedError       the workflow's graph or version differs from the one the run started with
     ├── CodeChangedError        a step's code differs from the code that ran, and the workflow refuses that
     ├── MigrationError          a declared state migration raised or returned a state that cannot be used
     ├── EncodingError           a value cannot be journaled as JSON (names where it is and its type)
     ├── StepTimeoutError        a step ran longer than its timeout
     ├── LoopLimitError          a step would run more often than its max_visits bound
     │    └── ToolLoopLimitError the model kept calling tools for max_iterations calls without answering
     ├── RunStateError           the run's status does not allow the operation (e.g. cancel a finished run)
     ├── JournalDamagedError     a run's journal cannot be folded (names the run and the event's seq)
     ├── SavepointError          a savepoint file cannot be written, read or trusted (names the first bad link)
     ├── RunFailedError          raised by ``RunResult.raise_for_status()`` for a run that did not complete
     ├── InDoubtError            an effect may or may not have happened and can be neither checked nor re-sent
     ├── WaitTimeoutError        ctx.wait_for's timeout passed before the signal arrived (also a TimeoutError)
     ├── PromptError             a prompt template cannot be loaded, parsed or rendered
     ├── CallChangedError        a durable call's request differs from the one journaled at its position
     ├── CallFailedError         a durable call failed earlier in this attempt; raised again, not re-performed
     ├── ReplayError             replaying against a cassette went wrong
     │    ├── ReplayMismatchError  the request made differs from the one recorded (the message shows the diff)
     │    └── ReplayMissingError   the cassette holds no response for this call
     └── ToolError               a call to the outside world failed
          ├── RetryableToolError connect error, timeout, 429 or 5xx: worth retrying (carries retry_after)
          ├── PermanentToolError another 4xx, or an auth failure: retrying will not help
          └── CircuitOpenError   the breaker guarding the tool is open: failing fast
"""

from __future__ import annotations

__all__ = [
    "OrchestratorError",
    "ConfigurationError",
    "WorkflowNotFoundError",
    "GraphChangedError",
    "CodeChangedError",
    "MigrationError",
    "EncodingError",
    "StepTimeoutError",
    "LoopLimitError",
    "ToolLoopLimitError",
    "PromptError",
    "RunStateError",
    "JournalDamagedError",
    "SavepointError",
    "RunFailedError",
    "InDoubtError",
    "WaitTimeoutError",
    "CallChangedError",
    "CallFailedError",
    "ReplayError",
    "ReplayMismatchError",
    "ReplayMissingError",
    "ToolError",
    "RetryableToolError",
    "PermanentToolError",
    "CircuitOpenError",
]


class OrchestratorError(Exception):
    """Base class for engine errors."""


class ConfigurationError(OrchestratorError):
    """An Orchestrator option is invalid."""


class WorkflowNotFoundError(OrchestratorError):
    """The run's workflow is not registered with this Orchestrator, or a named app or target cannot be imported."""


class GraphChangedError(OrchestratorError):
    """The workflow's graph or version differs from the run's; the message lists the differences."""

    def __init__(self, message: str, *, differences: list[str] | None = None):
        self.differences = differences or []
        super().__init__(message)


class CodeChangedError(OrchestratorError):
    """A run's steps ran under code that the registered workflow has changed, and the workflow
    declares ``on_code_change="refuse"``; ``changed`` maps each step to its recorded and current hash."""

    def __init__(self, message: str, *, changed: dict[str, dict[str, str]] | None = None):
        super().__init__(message)
        self.changed = changed or {}


class MigrationError(OrchestratorError):
    """A declared state migration raised, or returned a state that is not a dict, does not encode
    or does not validate; the run was left as it was."""


class EncodingError(OrchestratorError):
    """A value cannot be journaled as JSON; the message names the step, the path and the type."""

    def __init__(self, message: str, *, path: str | None = None, type_name: str | None = None):
        self.path = path
        self.type_name = type_name
        super().__init__(message)


class StepTimeoutError(OrchestratorError):
    """A step ran longer than its ``timeout``."""


class LoopLimitError(OrchestratorError):
    """A step would run more often than its ``max_visits`` bound."""


class ToolLoopLimitError(LoopLimitError):
    """The model kept calling tools for ``max_iterations`` model calls without giving an answer."""


class PromptError(OrchestratorError):
    """A prompt template cannot be loaded, parsed or rendered (names the template and the problem)."""


class RunStateError(OrchestratorError):
    """The run's status does not allow the operation."""


class JournalDamagedError(OrchestratorError):
    """A run's journal cannot be folded: an event that is not JSON, of an unknown kind, lacking a
    field its kind needs, or out of sequence. ``run_id`` and ``seq`` name the event; nothing was
    written. ``agentsaga verify RUN`` reports every problem of the run."""

    def __init__(self, message: str, *, run_id: str, seq: int | None = None):
        self.run_id = run_id
        self.seq = seq
        super().__init__(message)


class SavepointError(OrchestratorError):
    """A savepoint cannot be written, read or trusted: truncated, tampered with (the first bad link
    of its hash chain is named), of a newer format, unsigned or wrongly signed under a key, or for
    a workflow or run the target cannot take. Nothing was written to the target database."""


class RunFailedError(OrchestratorError):
    """The run ended without doing its work (``RunResult.raise_for_status``): ``run_id``, ``status``,
    ``step`` (the step whose failure ended it, when one did) and ``error`` (``"Type: message"``)."""

    def __init__(self, message: str, *, run_id: str, status: str, step: str | None = None,
                 error: str | None = None):
        self.run_id = run_id
        self.status = status
        self.step = step
        self.error = error
        super().__init__(message)


class InDoubtError(OrchestratorError):
    """An effect's intent was journaled but not its result, and it has no ``check`` hook and does
    not declare its idempotency key honoured, so it can be neither checked nor safely re-sent.
    ``reason``: why it could not be settled, in a few words (what the journal's ``doubt`` says)."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        self.reason = reason
        super().__init__(message)


class ToolError(OrchestratorError):
    """A call to the outside world failed. ``tool`` names it (a breaker name, a host, a tool)."""

    def __init__(self, message: str, *, tool: str | None = None, status: int | None = None) -> None:
        self.tool = tool
        self.status = status
        super().__init__(message)


class RetryableToolError(ToolError):
    """Connect error, timeout, 429 or 5xx: worth retrying; ``retry_after`` (seconds) if the server said."""

    def __init__(self, message: str, *, tool: str | None = None, status: int | None = None,
                 retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message, tool=tool, status=status)


class PermanentToolError(ToolError):
    """A 4xx other than 429 (including 401/403): retrying will not help."""


class CircuitOpenError(ToolError):
    """The breaker guarding this tool is open: the call failed fast without leaving the process.
    ``retry_at`` is when the breaker will let a probe through (epoch seconds)."""

    def __init__(self, message: str, *, tool: str | None = None, retry_at: float | None = None) -> None:
        self.retry_at = retry_at
        super().__init__(message, tool=tool)


class WaitTimeoutError(OrchestratorError, TimeoutError):
    """``ctx.wait_for(name, timeout=...)``'s timeout passed before the signal arrived. Raised in the
    step when it runs again after the timeout: catch it there to go on without the signal (the
    step completes), or let it fail the step (its ``Retry`` and failure route apply, as to any
    error). ``step``, ``signal`` and ``timeout_at`` (epoch seconds) say which wait it was."""

    def __init__(self, message: str, *, step: str | None = None, signal: str | None = None,
                 timeout_at: float | None = None) -> None:
        self.step = step
        self.signal = signal
        self.timeout_at = timeout_at
        super().__init__(message)


class CallChangedError(OrchestratorError):
    """A durable call's request differs from the one journaled at its position (the code changed);
    the message shows the difference."""


class CallFailedError(OrchestratorError):
    """A durable call failed earlier in this attempt (before a crash); its recorded error is raised
    again instead of performing the call twice. ``type_name`` names the original exception type; when
    that is a builtin one (``KeyError``, ``ValueError``, ``ConnectionError``...), the error raised is
    also an instance of it, so the ``except`` that caught it the first time catches it again."""

    def __init__(self, message: str, *, type_name: str) -> None:
        self.type_name = type_name
        super().__init__(message)


class ReplayError(OrchestratorError):
    """Replaying a run against recorded responses went wrong."""


class ReplayMismatchError(ReplayError):
    """The request made differs from the one recorded; the message shows the difference."""


class ReplayMissingError(ReplayError):
    """The cassette holds no recorded response for this call."""
