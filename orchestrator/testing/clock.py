"""A fake clock for tests: ``Orchestrator(clock=fake.clock, sleep=fake.sleep)``.

Sleeping advances the clock at once and is recorded, so retries with backoff, durable timers and
lease expiries are exact and instant in a test; ``advance`` moves time forward by hand (a timer
coming due, a lease expiring).
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """An injected clock (epoch seconds) and async sleep that never waits."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = float(start)
        #: every sleep asked for, in order (a retry's backoff, a step's wait)
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(0.0, seconds)

    def advance(self, seconds: float) -> float:
        """Move time forward; returns the new time."""
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"<FakeClock now={self.now}>"
