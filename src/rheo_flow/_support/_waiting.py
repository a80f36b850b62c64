"""Waiting in the runtimes: for an event within a timeout, for the first of several
awaitables, and for cancelled tasks to end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterable
from typing import Any

__all__ = ["cancel_and_wait", "first_of", "wait_event"]


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True when set.

    Built on ``asyncio.timeout`` rather than ``asyncio.wait_for``, which on
    Python 3.11 can swallow a cancellation arriving just as the event is set
    (a runtime's stop must never be lost that way).
    """
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()


async def first_of(*awaitables: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    """Run ``awaitables`` until the first of them ends, then cancel the others and wait
    for them; returns their futures, in order (each done, cancelled or not)."""
    futures: list[asyncio.Future[Any]] = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
    return futures


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel every task given (``None`` stands for none) and wait until they all ended."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    if live:
        await asyncio.wait(live)
