"""Clocks: wall time in epoch milliseconds, and a manual clock for deterministic tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeAlias

__all__ = ["Clock", "ManualClock", "system_clock"]

Clock: TypeAlias = Callable[[], int]
"""A function returning the current time in milliseconds since the Unix epoch."""


def system_clock() -> int:
    """The system's wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to: ``clock.advance(ms)``.

    Pass it to the in-memory backend to test lease expiry without waiting.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def __call__(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        """Move time forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError("a clock does not go backwards")
        self._now += ms
