"""Errors raised while defining a workflow or evaluating its graph.

    WorkflowError             base of everything in this package
     ├── DefinitionError      the graph or an option is invalid (raised when it is built)
     ├── InputError           a run's input is not a state: a non-string key, or it does not fit the state model
     ├── RoutingError         a router returned something that is not a step, a list of steps or END
     └── ReducerError         a field's reducer could not merge a step's update into the state
"""

from __future__ import annotations

__all__ = ["WorkflowError", "DefinitionError", "InputError", "RoutingError", "ReducerError"]


class WorkflowError(Exception):
    """Base class for workflow definition and evaluation errors."""


class DefinitionError(WorkflowError):
    """The workflow definition is invalid; the message names the step or option at fault."""

    def __init__(self, message: str, *, workflow: str | None = None, step: str | None = None):
        self.workflow = workflow
        self.step = step
        prefix = f"workflow {workflow!r}: " if workflow else ""
        super().__init__(prefix + message)


class RoutingError(WorkflowError):
    """A router returned an unknown step name or a value that is not a route."""

    def __init__(self, message: str, *, step: str | None = None):
        self.step = step
        super().__init__(message)


class ReducerError(WorkflowError):
    """A field's reducer raised while merging an update: the message names the field, the reducer
    and both values; ``field`` is the field's name."""

    def __init__(self, message: str, *, field: str):
        self.field = field
        super().__init__(message)


class InputError(WorkflowError):
    """A run's input does not fit the workflow (its state model); nothing was started."""

    def __init__(self, message: str, *, workflow: str | None = None):
        self.workflow = workflow
        super().__init__((f"workflow {workflow!r}: " if workflow else "") + message)
