"""Waiting until a consumer group has caught up with the backlog it saw at the start."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._rheo import Partitions, Rheo
from ._lifecycle import Lifecycle, State

if TYPE_CHECKING:
    from ._producer import Producer

__all__ = ["run_until_empty", "wait_caught_up", "wait_producer_caught_up"]


class _Runtime(Protocol):
    async def start(self) -> Any: ...
    async def drain(self, timeout: float | None = None, *, hand_back: bool = False
                    ) -> bool: ...
    async def stop(self) -> None: ...


async def wait_caught_up(
    rheo: Rheo,
    stream: str,
    group: str,
    partitions: Partitions,
    *,
    interval: float,
    stopped: Callable[[], bool],
) -> bool:
    """Wait until the group's frontier reaches the high water seen now, on every
    consumed partition: every event appended before the call is settled (acked or
    dead-lettered, by any consumer of the group).

    Checks every ``interval`` seconds; returns True once caught up, False as soon
    as ``stopped()`` is true (the runtime ended first). Events appended after the
    call are not waited for, so a steady producer cannot keep it running forever.
    """
    high = await rheo.high_water(stream)
    targets = {p: s for p, s in high.items() if partitions == "all" or p in partitions}
    while True:
        frontier = await rheo.frontier(stream, group)
        if all(frontier.get(p, 0) >= s for p, s in targets.items()):
            return True
        if stopped():
            return False
        await asyncio.sleep(interval)


async def wait_producer_caught_up(producer: Producer, *, stopped: Callable[[], bool]) -> bool:
    """:func:`wait_caught_up` for what ``producer`` consumes, checking every poll
    interval (at most every second): the wait of a runtime's ``run_until_empty``."""
    return await wait_caught_up(producer.rheo, producer.stream, producer.group,
                                producer.partitions,
                                interval=min(producer.poll_ms / 1000, 1.0), stopped=stopped)


async def run_until_empty(runtime: _Runtime, life: Lifecycle, producer: Producer,
                          timeout: float | None, *, stopped: Callable[[], bool]) -> bool:
    """The ``run_until_empty`` of every runtime: start it unless started, wait until the
    backlog seen now is settled (or ``stopped()``), drain handing back what no handler
    started, stop. True when the backlog was settled and the drain was clean; False
    when ``timeout`` seconds passed first or the runtime stopped on its own; the
    runtime's fatal error, if one stopped it, is raised."""
    if life.state is State.NEW:
        await runtime.start()
    reached = False
    try:
        async with asyncio.timeout(timeout):
            reached = await wait_producer_caught_up(producer, stopped=stopped)
            if reached and life.state is State.RUNNING:
                reached = await runtime.drain(hand_back=True)
    except TimeoutError:
        reached = False
    finally:
        await runtime.stop()
    life.raise_failure()
    return reached
