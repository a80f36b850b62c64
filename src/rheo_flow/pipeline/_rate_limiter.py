"""Rate limiting: at most ``allowed_messages`` leave the producer per ``interval_ms``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .._model._errors import InvalidArgument
from .._support._waiting import first_of

__all__ = ["RateLimit", "RateLimiter"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Allow ``allowed_messages`` messages into the pipeline per ``interval_ms`` window."""

    allowed_messages: int
    interval_ms: int = 1000

    def __post_init__(self) -> None:
        for name in ("allowed_messages", "interval_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    1 <= value <= 1_000_000_000):
                raise InvalidArgument(f"rate limit {name} must be a positive integer, "
                                      f"got {value!r}")


class RateLimiter:
    """Fixed windows of ``interval_ms``: each lets ``allowed_messages`` through.

    Messages are counted when the producer hands them to the processors, so no
    window ever lets more than ``allowed_messages`` through. ``clock`` (seconds)
    and ``sleep`` default to the event loop's; tests may pass a manual pair.
    """

    def __init__(
        self,
        limit: RateLimit,
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        if not isinstance(limit, RateLimit):
            raise InvalidArgument(f"expected a RateLimit, got {type(limit).__name__}")
        self._limit = limit
        self._clock = clock
        self._sleep = sleep or asyncio.sleep
        self._window_start: float | None = None
        self._used = 0
        self._changed = asyncio.Event()

    @property
    def limit(self) -> RateLimit:
        """The current setting."""
        return self._limit

    def update(self, allowed_messages: int | None = None, interval_ms: int | None = None
               ) -> RateLimit:
        """Change the setting now; the current window keeps what it already let through."""
        self._limit = RateLimit(
            self._limit.allowed_messages if allowed_messages is None else allowed_messages,
            self._limit.interval_ms if interval_ms is None else interval_ms,
        )
        self._changed.set()
        return self._limit

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _roll(self, now: float) -> float:
        """Start a new window if the current one is over; returns when it ends."""
        interval = self._limit.interval_ms / 1000
        start = self._window_start
        if start is None or now >= start + interval:
            self._window_start = start = now
            self._used = 0
        return start + interval

    def remaining(self) -> int:
        """How many messages the current window still lets through."""
        self._roll(self._now())
        return max(0, self._limit.allowed_messages - self._used)

    async def available(self) -> int:
        """Wait until the current window lets something through; returns how much."""
        while True:
            now = self._now()
            end = self._roll(now)
            left = self._limit.allowed_messages - self._used
            if left > 0:
                return left
            self._changed.clear()
            if self._clock is not None:
                await self._sleep(end - now)
                continue
            # Real time: an update may raise the limit before the window ends.
            await first_of(self._sleep(end - now), self._changed.wait())

    def consume(self, count: int) -> None:
        """Count ``count`` messages against the current window."""
        self._roll(self._now())
        self._used += count
