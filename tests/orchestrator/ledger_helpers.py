"""The outside world of the rollback and fork tests: a ledger of bookings by idempotency key."""

from __future__ import annotations


class Ledger:
    """Bookings by idempotency key (a repeated key books nothing new), and cancellations."""

    def __init__(self) -> None:
        self.booked: dict[str, str] = {}
        self.cancelled: list[str] = []

    def book(self, kind: str, key: str) -> str:
        return self.booked.setdefault(key, f"{kind}-{len(self.booked) + 1}")

    def cancel(self, ref: str) -> None:
        self.cancelled.append(ref)

    def in_force(self, run_id: str | None = None) -> set[str]:
        """The bookings not cancelled (only the run's, whose keys start with ``run_id:``, when given)."""
        refs = {ref for key, ref in self.booked.items() if run_id is None or key.startswith(f"{run_id}:")}
        return refs - set(self.cancelled)
