"""When a workflow's runs are snapshotted: a policy as a small frozen value, declared per workflow.

    Workflow("research", snapshots=Snapshots(every=100, after_effects=True, gates=["validate"]))

Conditions combine: a snapshot is written when *any* of them says so (a hybrid of periodic and
event-driven is the common case). ``Adaptive`` replaces the fixed ``every`` with one chosen per
run, within bounds, from how the workflow's recent runs fared; the engine journals the choice and
its inputs. Pure: the engine evaluates it; nothing here reads a clock or a database.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from workflows.errors import DefinitionError

__all__ = ["DEFAULT_SNAPSHOTS", "Adaptive", "Snapshots", "snapshots_from"]


def _positive_int(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DefinitionError(f"{what} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Adaptive:
    """Snapshot a workflow's runs more often when its recent runs crashed or were recovered.

    Over the workflow's newest ``window`` runs, ``rate`` is the share that were taken over after
    their owner died (or lie crashed, lease expired). The interval is ``max_every`` at rate 0 and
    falls geometrically to ``min_every`` at ``rate >= full_at``:
    ``every = max_every * (min_every / max_every) ** min(1, rate / full_at)``, rounded.
    """

    min_every: int = 10
    max_every: int = 500
    window: int = 50
    full_at: float = 0.2

    def __post_init__(self) -> None:
        _positive_int(self.min_every, "Adaptive(min_every=...)")
        _positive_int(self.max_every, "Adaptive(max_every=...)")
        _positive_int(self.window, "Adaptive(window=...)")
        if self.max_every < self.min_every:
            raise DefinitionError(f"Adaptive(max_every={self.max_every!r}) must not be below "
                                  f"min_every={self.min_every!r}")
        if isinstance(self.full_at, bool) or not isinstance(self.full_at, (int, float)) or not 0 < self.full_at <= 1:
            raise DefinitionError(f"Adaptive(full_at={self.full_at!r}) must be a number in (0, 1]")

    def choose(self, runs: int, troubled: int) -> int:
        """The interval for a new run, given ``troubled`` of the last ``runs`` runs crashed or recovered."""
        rate = troubled / runs if runs else 0.0
        share = min(1.0, rate / self.full_at)
        every = self.max_every * (self.min_every / self.max_every) ** share
        return max(self.min_every, min(self.max_every, math.floor(every + 0.5)))

    def to_json(self) -> dict[str, Any]:
        return {"min_every": self.min_every, "max_every": self.max_every, "window": self.window,
                "full_at": self.full_at}


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshots:
    """When to snapshot a run (see the module docstring); every condition left unset is off.

    - ``every``: after every N events (``None``: never by count);
    - ``seconds``: once T seconds of the engine's clock passed since the last snapshot, at the
      next commit (run time: a parked run writes nothing while it waits);
    - ``after_effects``: after each completed effect (an effect step, or an effect call inside a
      step), so a recovery never folds past an irreversible call from an older snapshot;
    - ``gates``: after each completion of these steps (checked against the graph: a gate must name
      a step);
    - ``adaptive``: an ``Adaptive`` that chooses ``every`` per run (it replaces ``every``);
    - ``replay_ratio``: a snapshot due by count (``every``, adaptive) waits until the events
      journaled since the last snapshot hold at least this many times that snapshot's bytes: for a
      large state that grows little per step (a long conversation), the snapshot cost per step then
      stays flat, and a recovery replays at most about ``replay_ratio`` times the snapshot's bytes;
    - ``incremental``: write incremental snapshots (only what changed since the previous one: the
      appended tail of a list that only grew, the fields that changed), a full one closing the
      chain after this many incrementals (``None``: every snapshot is full);
    - ``keep``: snapshots kept per run (older ones are pruned as new ones are written, never the
      base chain a kept incremental needs);
    - ``finished_ttl``: seconds after a run finished when ``orc.retention()`` (``agentsaga
      retention``) drops all its snapshots (its journal stays: the state folds from it).

    A snapshot is also written when a run ends, and on demand (``orc.snapshot``), whatever the policy.
    """

    every: int | None = 100
    seconds: float | None = None
    after_effects: bool = False
    gates: tuple[str, ...] = ()
    adaptive: Adaptive | None = None
    replay_ratio: float | None = None
    incremental: int | None = 10
    keep: int = 3
    finished_ttl: float | None = None

    def __post_init__(self) -> None:
        if self.every is not None:
            _positive_int(self.every, "Snapshots(every=...)")
        if self.seconds is not None and (isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float))
                                         or not self.seconds > 0):
            raise DefinitionError(f"Snapshots(seconds=...) must be a positive number of seconds, got {self.seconds!r}")
        if not isinstance(self.after_effects, bool):
            raise DefinitionError(f"Snapshots(after_effects=...) must be True or False, got {self.after_effects!r}")
        gates = (self.gates,) if isinstance(self.gates, str) else self.gates
        try:
            gates = tuple(gates)
        except TypeError:
            raise DefinitionError(f"Snapshots(gates=...) must be step names, got {self.gates!r}") from None
        if not all(isinstance(g, str) and g for g in gates):
            raise DefinitionError(f"Snapshots(gates=...) must be step names, got {self.gates!r}")
        object.__setattr__(self, "gates", gates)
        if self.adaptive is not None and not isinstance(self.adaptive, Adaptive):
            if isinstance(self.adaptive, Mapping):
                object.__setattr__(self, "adaptive", _build(Adaptive, self.adaptive, "Snapshots(adaptive=...)"))
            else:
                raise DefinitionError(f"Snapshots(adaptive=...) must be an Adaptive(...), got {self.adaptive!r}")
        if self.replay_ratio is not None and (isinstance(self.replay_ratio, bool)
                                              or not isinstance(self.replay_ratio, (int, float))
                                              or not self.replay_ratio > 0):
            raise DefinitionError(f"Snapshots(replay_ratio=...) must be a positive number, got {self.replay_ratio!r}")
        if self.finished_ttl is not None and (isinstance(self.finished_ttl, bool)
                                              or not isinstance(self.finished_ttl, (int, float))
                                              or self.finished_ttl < 0):
            raise DefinitionError(f"Snapshots(finished_ttl=...) must be a number of seconds >= 0, "
                                  f"got {self.finished_ttl!r}")
        if self.incremental is not None:
            _positive_int(self.incremental, "Snapshots(incremental=...)")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise DefinitionError(f"Snapshots(keep=...) must be an integer >= 1, got {self.keep!r}")

    def check_gates(self, steps: Iterable[str], workflow: str) -> None:
        """``DefinitionError`` naming a gate that is not a step of the workflow."""
        known = set(steps)
        for gate in self.gates:
            if gate not in known:
                raise DefinitionError(f"snapshot gate {gate!r} names no step (steps: {', '.join(sorted(known))})",
                                      workflow=workflow, step=gate)

    def to_json(self) -> dict[str, Any]:
        """The policy as data (recorded in the snapshot catalog's configuration hash)."""
        return {"every": self.every, "seconds": self.seconds, "after_effects": self.after_effects,
                "gates": list(self.gates), "adaptive": self.adaptive.to_json() if self.adaptive else None,
                "replay_ratio": self.replay_ratio, "incremental": self.incremental, "keep": self.keep,
                "finished_ttl": self.finished_ttl}


#: The policy of a workflow that declares none (the Orchestrator's snapshot_every/keep_snapshots
#: override ``every`` and ``keep`` for such workflows).
DEFAULT_SNAPSHOTS = Snapshots()


def _build(cls: type, options: Mapping[str, Any], what: str) -> Any:
    known = [f.name for f in fields(cls)]
    for key in options:
        if key not in known:
            raise DefinitionError(f"{what}: unknown option {key!r} (known: {', '.join(known)})")
    return cls(**options)


def snapshots_from(value: Snapshots | Mapping[str, Any] | None) -> Snapshots | None:
    """A ``Snapshots`` from itself, or from plain data (``{"every": 50, "gates": ["validate"]}``,
    as read from a configuration file); an unknown option is a ``DefinitionError`` naming it."""
    if value is None or isinstance(value, Snapshots):
        return value
    if isinstance(value, Mapping):
        return _build(Snapshots, value, "snapshots")
    raise DefinitionError(f"snapshots must be a Snapshots(...) or a mapping of its options, got {value!r}")
