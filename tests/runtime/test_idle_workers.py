"""Idle workers woken one at a time, the wake-ups spreading as handlers stay busy."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rheo_flow import ACK, Event, NewEvent, Rheo, consumer
from rheo_flow._runtime._idle_workers import IdleWorkers
from rheo_flow.backends import MemoryBackend

WaitUntil = Callable[..., Awaitable[None]]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_worker_is_woken_until_it_has_run() -> None:
    idle = IdleWorkers()
    idle.wake_one()  # nobody waits: nothing happens, nothing is remembered
    woken: list[int] = []

    async def worker(n: int) -> None:
        await idle.wait()
        woken.append(n)

    tasks = [asyncio.create_task(worker(n)) for n in range(3)]
    await _settle()
    idle.wake_one()
    idle.wake_one()  # the first one woken has not run yet: no second
    await _settle()
    assert woken == [0]
    idle.wake_one()
    await _settle()
    assert woken == [0, 1]
    tasks[2].cancel()
    await _settle()
    idle.wake_one()  # a cancelled waiter is passed over, and nobody else waits
    await _settle()
    assert woken == [0, 1]
    worker_3 = asyncio.create_task(worker(3))
    await _settle()
    idle.wake_one()
    await asyncio.wait_for(worker_3, 5)
    assert woken == [0, 1, 3]


async def test_busy_handlers_spread_over_every_worker(wait_until: WaitUntil) -> None:
    async with Rheo(MemoryBackend()) as rheo:
        await rheo.create_stream("orders")
        await rheo.append("orders", [NewEvent("order", {"n": n}) for n in range(8)])
        release = asyncio.Event()
        running = 0

        @consumer(stream="orders", group="billing", concurrency=8, max_demand=8)
        async def handle(event: Event, context: Mapping[str, Any]) -> Any:
            nonlocal running
            running += 1
            await release.wait()
            return ACK

        async with handle.start(rheo) as group:
            # Each worker woken takes one lease and wakes the next while it waits.
            await wait_until(lambda: running == 8, message="8 handlers running at once")
            release.set()
            await wait_until(lambda: group.stats.acked == 8)
