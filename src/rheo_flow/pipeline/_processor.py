"""The processor stage: ``concurrency`` tasks running ``handle_message`` on every message."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _telemetry
from .._runtime._options import PROCESSORS
from ._acknowledger import Acknowledger
from ._handler import Callbacks, run_handle_failed
from ._message import Message, fail_on_error, failure_reason
from ._partition import PartitionBy, router
from ._stage_tasks import StageTasks

__all__ = ["ProcessorStage", "Processors"]

log = logging.getLogger("rheo_flow.pipeline")


@dataclass(frozen=True, slots=True)
class Processors:
    """Settings of the processor stage.

    ``concurrency`` tasks run ``handle_message``; each takes up to
    ``max_demand`` messages at a time (also the list ``prepare_messages``
    receives). Without ``partition_by`` any idle task takes the next messages;
    with it, every message goes to the task its value hashes to, so messages
    with an equal value are handled one after the other, in the order fetched
    (``partition_by="key"`` keeps each key in sequence order).
    """

    concurrency: int = 4
    max_demand: int = 10
    partition_by: PartitionBy | None = None
    name: str = "default"
    """The name handlers receive as ``processor``."""

    def __post_init__(self) -> None:
        PROCESSORS.resolve({"concurrency": self.concurrency, "max_demand": self.max_demand,
                            "name": self.name})
        if self.partition_by is not None:
            router(self.partition_by, 1, "processors")


class ProcessorStage(StageTasks[list[Message]]):
    """The running processor tasks and their inboxes."""

    kind = "processor"
    _label = "processors"

    def __init__(
        self,
        config: Processors,
        callbacks: Callbacks,
        context: Any,
        acknowledger: Acknowledger,
        forward: Callable[[Message], bool] | None,
    ) -> None:
        super().__init__(config.name, config.concurrency, config.partition_by, acknowledger)
        self.config = config
        self._callbacks = callbacks
        self._context = context
        self._forward = forward
        """Hands a successful message to its batcher; False when there is no such batcher.
        ``None``: no batchers, successful messages are acked by the processor."""

    def submit(self, messages: list[Message]) -> None:
        """Queue fetched messages for the processors (never blocks: the producer's
        ``max_demand`` already bounds how many exist)."""
        size = len(messages)
        if not size:
            return
        self._queued(size)
        demand = self.config.max_demand
        route = self._route
        if route is None:
            # Spread small fetches over idle tasks; cap each share at max_demand.
            step = min(demand, -(-size // self.config.concurrency))
            put = self._queues[0].put_nowait
            if step >= size:
                put(messages)
                return
            for i in range(0, size, step):
                put(messages[i:i + step])
            return
        parts: dict[int, list[Message]] = {}
        for m in messages:
            index = route(m)
            bucket = parts.get(index)
            if bucket is None:
                parts[index] = [m]
            else:
                bucket.append(m)
        for index, bucket in parts.items():
            put = self._queues[index].put_nowait
            for i in range(0, len(bucket), demand):
                put(bucket[i:i + demand])

    def withdraw(self) -> list[Message]:
        """Take the messages no processor has started out of the queues (call before
        :meth:`close`); the caller settles them."""
        taken: list[Message] = []
        for queue in self._queues:
            kept: list[list[Message] | None] = []
            while not queue.empty():
                chunk = queue.get_nowait()
                if chunk is None:
                    kept.append(chunk)
                else:
                    taken.extend(chunk)
            for item in kept:
                queue.put_nowait(item)
        self.pending -= len(taken)
        return taken

    def _messages(self, item: list[Message]) -> list[Message]:
        return item

    async def _handle(self, item: list[Message]) -> None:
        with _telemetry.process_messages(item, "processor", self.config.name):
            await self._process(item)

    async def _process(self, chunk: list[Message]) -> None:
        callbacks = self._callbacks
        context = self._context
        messages = chunk
        if callbacks.prepare_messages is not None:
            try:
                messages = await callbacks.prepare_messages(chunk, context)
                if not isinstance(messages, list) or not all(
                        isinstance(m, Message) for m in messages):
                    raise TypeError(f"prepare_messages must return a list of messages, "
                                    f"got {type(messages).__name__}")
            except Exception as exc:
                fail_on_error(chunk, "handler_error", exc,
                              f"prepare_messages of processor {self.config.name}")
                await self._fail(chunk)
                return
            if len(messages) != len(chunk):
                seen = {id(m) for m in messages}
                dropped = [m for m in chunk if id(m) not in seen]
                for m in dropped:
                    m.failed("handler_error: prepare_messages dropped the message")
                if dropped:
                    await self._fail(dropped)
        handle = callbacks.handle_message
        name = self.config.name
        forward = self._forward
        failed: list[Message] = []
        done: list[Message] = []
        for m in messages:
            try:
                out = await handle(name, m, context)
                if out is not m:
                    if not isinstance(out, Message):
                        m.failed(failure_reason(
                            f"handler_error: handle_message returned {type(out).__name__}, "
                            "not a Message"))
                        failed.append(m)
                        continue
                    m = out
                if m.status != "ok":
                    failed.append(m)
                elif forward is None:
                    done.append(m)
                elif not forward(m):
                    m.failed(f"handler_error: no batcher named {m.batcher!r}")
                    failed.append(m)
            except Exception as exc:
                fail_on_error([m], "handler_error", exc, f"processor {name}")
                failed.append(m)
        if failed:
            await self._fail(failed)
        if done:
            await self._acknowledger.settle(done, ())

    async def _fail(self, messages: list[Message]) -> None:
        messages = await run_handle_failed(self._callbacks, messages, self._context, log)
        await self._acknowledger.settle((), messages)
