"""The fetch-failure schedule shared by consumer groups and producers.

Built on tenacity's exponential-with-jitter wait strategy, driven by hand: the
runtimes decide themselves when to retry (they keep renewing meanwhile), they
only need the next delay.
"""

from __future__ import annotations

import tenacity

__all__ = ["Backoff"]


class Backoff:
    """Exponential backoff with jitter: ``initial_ms`` doubling up to ``max_ms``.

    Call :meth:`next_delay` after each failure and :meth:`reset` after a success.
    """

    def __init__(self, *, initial_ms: int = 100, max_ms: int = 5_000, jitter_ms: int = 100) -> None:
        if initial_ms <= 0 or max_ms < initial_ms or jitter_ms < 0:
            raise ValueError("backoff needs 0 < initial_ms <= max_ms and jitter_ms >= 0")
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        # wait_exponential + wait_random rather than wait_exponential_jitter, whose
        # ``initial`` argument is deprecated in recent tenacity and ``multiplier``
        # missing in older ones.
        self._wait = tenacity.wait_exponential(
            multiplier=initial_ms / 1000, max=max_ms / 1000, exp_base=2
        ) + tenacity.wait_random(0, jitter_ms / 1000)
        self._state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last success."""
        return self._failures

    def next_delay(self) -> float:
        """Record a failure and return how long to wait before the next attempt, in seconds."""
        self._failures += 1
        self._state.attempt_number = self._failures
        return min(float(self._wait(self._state)), self.max_ms / 1000)

    def reset(self) -> None:
        """Record a success: the next failure starts the schedule again."""
        self._failures = 0
