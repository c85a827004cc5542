"""Retrying a step: its ``Retry`` policy on tenacity, with the engine's injected sleep and random
source, and step timeouts.

Failed attempts are journaled one by one (``StepFailed`` with the delay before the next attempt),
so the attempt count survives a crash: ``prior`` is the number already journaled, and the backoff
continues where a crashed process left it. A step that runs once (the default policy) skips
tenacity entirely, which keeps the common path short.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_base

from orchestrator.errors import (
    CircuitOpenError,
    EncodingError,
    InDoubtError,
    PermanentToolError,
    RetryableToolError,
    StepTimeoutError,
)
from store import StoreError
from workflows import Retry

__all__ = ["NEVER_RETRY", "StopAttempts", "attempts", "not_before", "with_timeout"]


class StopAttempts(Exception):
    """Raised from inside an attempt when no further attempt may follow (the step gave up, or an
    in-doubt attempt was settled): never retried, whatever the policy says."""

#: Errors a retry cannot fix, whatever the step's policy says: the tool answered "no", the effect is
#: in doubt, the output cannot be journaled, or the journal itself could not be written (the run
#: stops; a resume continues it from the journal).
NEVER_RETRY = (PermanentToolError, InDoubtError, EncodingError, StoreError, StopAttempts)


class _PolicyWait(wait_base):
    """tenacity wait strategy reading the step's Retry policy and the injected random source."""

    def __init__(self, policy: Retry, offset: int, rng: random.Random, clock: Callable[[], float] | None) -> None:
        self.policy = policy
        self.offset = offset
        self.rng = rng
        self.clock = clock

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = self.policy.backoff(self.offset + retry_state.attempt_number, self.rng.random())
        error = retry_state.outcome.exception() if retry_state.outcome else None
        return not_before(delay, error, self.clock)


def not_before(delay: float, error: BaseException | None, clock: Callable[[], float] | None) -> float:
    """``delay``, or longer when ``error`` says when the other side can be asked again: a server's
    Retry-After, or an open breaker's next probe (``retry_at`` on ``clock``, the engine's). An
    attempt sooner would only fail again, spending the policy's attempts while the service is
    still refusing. Steps' retries and compensations' retries both wait this way."""
    if isinstance(error, RetryableToolError) and error.retry_after is not None:
        return max(delay, error.retry_after)  # the server said when: never call back sooner
    if isinstance(error, CircuitOpenError) and error.retry_at is not None and clock is not None:
        return max(delay, error.retry_at - clock())
    return delay


def attempts(once: Callable[[], Awaitable[Any]], policy: Retry, *, prior: int, rng: random.Random,
             sleep: Callable[[float], Awaitable[None]],
             on_retry: Callable[[BaseException | None, float], None],
             clock: Callable[[], float] | None = None) -> Awaitable[Any]:
    """Call ``once`` until it succeeds or the policy gives up (then its last error is raised); await
    what this returns.

    ``prior`` attempts were journaled before (by this or a crashed process); ``on_retry(error,
    delay)`` journals a failed attempt before the engine sleeps ``delay`` seconds. ``clock``: the
    clock an open breaker's ``retry_at`` is on (the engine's), so a retry waits the breaker out.
    """
    remaining = policy.attempts - prior
    if remaining <= 1:
        return once()  # the last attempt (the default policy's only one): no retry loop around it
    return _retrying(once, policy, prior, remaining, rng=rng, sleep=sleep, on_retry=on_retry, clock=clock)


async def _retrying(once: Callable[[], Awaitable[Any]], policy: Retry, prior: int, remaining: int, *,
                    rng: random.Random,
                    sleep: Callable[[float], Awaitable[None]],
                    on_retry: Callable[[BaseException | None, float], None],
                    clock: Callable[[], float] | None = None) -> Any:
    async def before_sleep(state: RetryCallState) -> None:
        on_retry(state.outcome.exception() if state.outcome else None, state.upcoming_sleep)

    retrying = AsyncRetrying(
        sleep=sleep,
        stop=stop_after_attempt(remaining),
        wait=_PolicyWait(policy, prior, rng, clock),
        retry=retry_if_exception(lambda e: isinstance(e, Exception) and not isinstance(e, NEVER_RETRY)
                                 and policy.should_retry(e)),
        before_sleep=before_sleep,
        reraise=True,
    )
    return await retrying(once)


async def with_timeout(awaitable: Awaitable[Any], timeout: float, name: str,
                       on_timeout: Callable[[], None] | None = None) -> Any:
    """``awaitable`` bounded by ``timeout`` seconds; ``StepTimeoutError`` names the step.
    ``on_timeout`` runs first (it revokes the abandoned attempt's context)."""
    try:
        async with asyncio.timeout(timeout) as scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            if on_timeout is not None:
                on_timeout()
            raise StepTimeoutError(f"step {name!r} timed out after {timeout:g}s") from None
        raise
