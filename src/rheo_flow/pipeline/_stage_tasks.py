"""What the processor and batcher stages share: their tasks and the queues feeding them.

A stage runs ``concurrency`` tasks. Without ``partition_by`` they take their
work from one shared queue (any idle task takes the next item); with it, each
task has a queue of its own, which the stage routes to by the hash of each
message's value, so that equal values are handled one after the other. A
failure the stage's own code did not catch leaves the messages' leases to
expire instead of ending the task.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import ClassVar, Generic, TypeVar

from ._acknowledger import Acknowledger
from ._message import Message
from ._partition import PartitionBy, Router, router

__all__ = ["StageTasks"]

log = logging.getLogger("rheo_flow.pipeline")

Item = TypeVar("Item")


class StageTasks(ABC, Generic[Item]):
    """The tasks of one stage and their queues.

    A subclass names its :attr:`kind`, handles one queued item in :meth:`_handle`
    and says which messages it carries in :meth:`_messages`; it counts the
    messages it queues with :meth:`_queued`.
    """

    kind: ClassVar[str]
    """``processor`` or ``batcher`` (in task names and logs)."""
    _label: ClassVar[str]
    """The stage's name in ``partition_by`` errors."""
    _failure_log: ClassVar[str] = "%s %s failed on %d messages; leaving their leases to expire"
    """What is logged (with the kind, the name and the count) when :meth:`_handle` raises."""

    def __init__(self, name: str, concurrency: int, partition_by: PartitionBy | None,
                 acknowledger: Acknowledger) -> None:
        self._name = name
        self._concurrency = concurrency
        self._acknowledger = acknowledger
        self._route: Router | None = (
            None if partition_by is None else router(partition_by, concurrency, self._label)
        )
        self._queues: list[asyncio.Queue[Item | None]] = [
            asyncio.Queue() for _ in range(concurrency if self._route is not None else 1)
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self.pending = 0
        """Messages queued or being handled, not yet passed on or settled."""
        self.peak = 0
        """The most :attr:`pending` has been."""

    def _queued(self, count: int) -> None:
        self.pending += count
        if self.pending > self.peak:
            self.peak = self.pending

    def start(self) -> None:
        """Start the tasks."""
        for i in range(self._concurrency):
            queue = self._queues[i] if self._route is not None else self._queues[0]
            self._tasks.append(asyncio.create_task(
                self._run(queue), name=f"rheo-{self.kind}-{self._name}-{i}"))

    async def close(self) -> None:
        """Let the tasks finish what is queued, then end them."""
        if self._route is None:
            for _ in self._tasks:
                self._queues[0].put_nowait(None)
        else:
            for queue in self._queues:
                queue.put_nowait(None)
        await asyncio.gather(*self._tasks)
        self._tasks.clear()

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the tasks (what they hold is left to expire); returns them."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        return tasks

    async def _run(self, queue: asyncio.Queue[Item | None]) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            messages = self._messages(item)
            try:
                await self._handle(item)
            except Exception:
                log.exception(self._failure_log, self.kind, self._name, len(messages))
                self._acknowledger.abandon(messages)
            finally:
                self.pending -= len(messages)

    @abstractmethod
    def _messages(self, item: Item) -> list[Message]:
        """The messages of a queued item."""

    @abstractmethod
    async def _handle(self, item: Item) -> None:
        """Handle one queued item: run the stage's callbacks, pass on or settle."""
