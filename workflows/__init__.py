"""Defining workflows: steps, the graph, validation and policies as data. Pure: no I/O."""

from workflows import reducers
from workflows._graph import Workflow
from workflows._policies import END, NO_RETRY, Retry
from workflows._reducers import MISSING
from workflows._snapshots import Adaptive, Snapshots
from workflows._step import Step
from workflows.errors import DefinitionError, InputError, ReducerError, RoutingError, WorkflowError

__all__ = [
    "END",
    "MISSING",
    "NO_RETRY",
    "Adaptive",
    "DefinitionError",
    "InputError",
    "Retry",
    "ReducerError",
    "RoutingError",
    "Snapshots",
    "Step",
    "Workflow",
    "WorkflowError",
    "reducers",
]
