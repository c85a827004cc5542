"""Public reducers for state fields: ``Workflow(reducers={"log": reducers.append})``."""

from workflows._reducers import MISSING, Reducer, add, append, extend, merge, replace

__all__ = ["MISSING", "Reducer", "add", "append", "extend", "merge", "replace"]
