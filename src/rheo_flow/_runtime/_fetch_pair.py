"""Two fetches under way while a backlog lasts: a runtime's lead fetcher and its follower.

A consumer's fetch is a round trip (one durable commit on PostgreSQL and SQLite).
While fetches come back full there is more to fetch: a second one goes out beside
the first (``Producer._demand_more``), so that each call's round trip overlaps the
other's and the handling of the batch before; ``max_demand`` still bounds the
leases held. When a fetch comes back short (the backlog is drained), the follower
waits until the lead brings a full one again: an idle consumer polls once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["Backlog", "lead_and_follow"]


class Backlog:
    """Whether the last fetch came back full: the follower fetches only then."""

    __slots__ = ("_full",)

    def __init__(self) -> None:
        self._full = asyncio.Event()

    def saw(self, fetched: int, size: int) -> None:
        """Record a fetch that returned ``fetched`` leases of the ``size`` it asked for."""
        if fetched >= size:
            self._full.set()
        else:
            self._full.clear()

    async def wait(self) -> None:
        """Wait until a fetch came back full."""
        await self._full.wait()

    def __bool__(self) -> bool:
        return self._full.is_set()


async def lead_and_follow(lead: Coroutine[Any, Any, None],
                          follow: Coroutine[Any, Any, None]) -> None:
    """Run ``lead`` with ``follow`` beside it until the lead ends; an error of either
    ends both and is raised, and cancelling this cancels both."""
    first = asyncio.ensure_future(lead)
    second = asyncio.ensure_future(follow)
    try:
        done, _ = await asyncio.wait((first, second), return_when=asyncio.FIRST_COMPLETED)
        if first not in done:
            second.result()  # its error, if any; else it stopped with the producer
        await first
    finally:
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
