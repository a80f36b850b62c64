"""Workers waiting for work, woken one at a time.

An event that all of a group's idle workers wait on wakes every one of them for
each batch: with handlers that finish without suspending, the first worker takes
the whole batch and the others wake to nothing, one wasted task switch per
worker. :class:`IdleWorkers` wakes one; a woken worker that takes a lease and
sees more waiting wakes the next, so the wake-ups spread to as many workers as
the handlers keep busy, and a batch of instant handlers costs two.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["IdleWorkers"]


class IdleWorkers:
    """The workers waiting for leases, in the order they began to wait."""

    __slots__ = ("_waiting", "_waking")

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        """Workers woken that have not run yet: while one is, no other is woken."""

    async def wait(self) -> None:
        """Wait until :meth:`wake_one` picks this worker."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        finally:
            if waiter.done() and not waiter.cancelled():
                self._waking -= 1

    def wake_one(self) -> None:
        """Wake the longest-waiting worker, unless one woken earlier has not run yet."""
        if self._waking:
            return
        waiting = self._waiting
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():  # not cancelled
                waiter.set_result(None)
                self._waking += 1
                return
