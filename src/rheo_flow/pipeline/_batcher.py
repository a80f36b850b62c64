"""The batcher stage: groups messages per batch key and runs ``handle_batch`` on each batch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from .. import _telemetry
from .._model._errors import InvalidArgument, StaleLease
from .._runtime._inflight import Inflight
from .._runtime._options import BATCHER
from ._acknowledger import Acknowledger
from ._handler import Callbacks, run_handle_failed
from ._message import BatchInfo, BatchTrigger, Message, fail_on_error
from ._partition import PartitionBy, router
from ._stage_tasks import StageTasks

__all__ = ["BatchSize", "Batcher", "BatcherStage"]

log = logging.getLogger("rheo_flow.pipeline")

DEADLINE_MARGIN = 1 / 3
"""A batch is flushed early once its oldest lease has less than this share of
``lease_ms`` left (renewal normally keeps every lease far from it)."""


@dataclass(frozen=True, slots=True)
class BatchSize:
    """A batch size measured by a function of each message, e.g. bytes::

        BatchSize(max=1_000_000, size_of=lambda m: len(m.data["body"]))

    A batch is emitted when adding the next message would pass ``max`` (that
    message opens the next batch) or once it reaches ``max``; a single message
    larger than ``max`` makes a batch of its own. ``max_messages`` also emits a
    batch once it holds that many messages (bytes and count together).
    """

    max: int
    size_of: Callable[[Message], int]
    max_messages: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < 1:
            raise InvalidArgument(f"BatchSize max must be a positive integer, got {self.max!r}")
        if not callable(self.size_of):
            raise InvalidArgument("BatchSize size_of must be a function of the message")
        count = self.max_messages
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or not 1 <= count <= 100_000):
            raise InvalidArgument(
                f"BatchSize max_messages must be an integer in 1..100000, got {count!r}")


@dataclass(frozen=True, slots=True)
class Batcher:
    """Settings of one batcher.

    Messages are grouped per batch key (:meth:`Message.put_batch_key`); a batch
    is emitted when it reaches ``batch_size`` (a count, or a :class:`BatchSize`),
    when ``batch_timeout`` seconds passed since its first message, when a
    message in ``flush`` mode joins it, when its oldest lease nears its
    deadline, or when the pipeline drains. ``concurrency`` tasks run
    ``handle_batch``. Without ``partition_by`` any idle task takes the next
    batch; with it, messages are split by the hash of their value over
    ``concurrency`` partitions, each with its own batches and its own task, so
    equal values are batched and handled in order.
    """

    batch_size: int | BatchSize = 100
    batch_timeout: float = 1.0
    concurrency: int = 1
    partition_by: PartitionBy | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, BatchSize):
            BATCHER.validate("batch_size", self.batch_size)
        BATCHER.resolve({"batch_timeout": self.batch_timeout, "concurrency": self.concurrency})
        if self.partition_by is not None:
            router(self.partition_by, 1, "batcher")

    @property
    def max_messages(self) -> int | None:
        """The batch size when it is a count (or a :class:`BatchSize`'s ``max_messages``)."""
        size = self.batch_size
        return size if isinstance(size, int) else size.max_messages


class _Open:
    """A batch being filled."""

    __slots__ = ("batch_key", "handle", "messages", "partition", "size", "timeout_at")

    def __init__(self, partition: int | None, batch_key: Hashable, timeout_at: float) -> None:
        self.partition = partition
        self.batch_key = batch_key
        self.timeout_at = timeout_at
        self.messages: list[Message] = []
        self.size = 0
        self.handle: asyncio.TimerHandle | None = None


class BatcherStage(StageTasks[tuple[list[Message], BatchInfo]]):
    """One named batcher: its open batches and its batch processor tasks."""

    kind = "batcher"
    _label = "batcher"
    _failure_log = "%s %s failed on a batch of %d; leaving their leases to expire"

    def __init__(
        self,
        name: str,
        config: Batcher,
        callbacks: Callbacks,
        context: Any,
        acknowledger: Acknowledger,
        *,
        inflight: Inflight | None = None,
        lease_ms: int | None = None,
        on_batch: Callable[[BatchInfo, list[Message]], None] | None = None,
    ) -> None:
        super().__init__(name, config.concurrency, config.partition_by, acknowledger)
        self.name = name
        self.config = config
        self._callbacks = callbacks
        self._context = context
        self._inflight = inflight
        self._margin = None if lease_ms is None else lease_ms / 1000 * DEADLINE_MARGIN
        self._on_batch = on_batch
        self._count = config.max_messages
        self._measure = None if isinstance(config.batch_size, int) else config.batch_size
        self._open: dict[tuple[int, Hashable], _Open] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.emitted = 0

    def start(self) -> None:
        """Start the batch processor tasks."""
        self._loop = asyncio.get_running_loop()
        super().start()

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        """The loop :meth:`start` ran on (batches time out on it)."""
        if self._loop is None:
            raise RuntimeError(f"batcher {self.name!r} is not started: call start() first")
        return self._loop

    # Filling -----------------------------------------------------------------

    def add(self, m: Message) -> bool:
        """Put a successful message into its open batch (emitting full batches)."""
        part = 0 if self._route is None else self._route(m)
        key = (part, m.batch_key)
        measure = self._measure
        weight = 0 if measure is None else int(measure.size_of(m))
        batch = self._open.get(key)
        if batch is None:
            batch = self._new(key, part, m)
        elif measure is not None and batch.size + weight > measure.max:
            self._emit(key, batch, "size")
            batch = self._new(key, part, m)
        batch.messages.append(m)
        self.pending += 1  # what _queued(1) does, without a call per message
        if self.pending > self.peak:
            self.peak = self.pending
        if measure is None:
            if len(batch.messages) >= self._count:  # type: ignore[operator]
                self._emit(key, batch, "size")
                return True
        else:
            batch.size += weight
            if batch.size >= measure.max or (
                    measure.max_messages is not None
                    and len(batch.messages) >= measure.max_messages):
                self._emit(key, batch, "size")
                return True
        if m.batch_mode == "flush":
            self._emit(key, batch, "flush")
        return True

    def _new(self, key: tuple[int, Hashable], part: int, first: Message) -> _Open:
        now = self._started_loop().time()
        batch = _Open(None if self._route is None else part, key[1],
                      now + self.config.batch_timeout)
        self._open[key] = batch
        self._schedule(key, batch, now, self._expiry(first))
        return batch

    def _expiry(self, m: Message) -> float | None:
        if self._inflight is None:
            return None
        return self._inflight.expires_at(m.lease.lease_id)

    def _schedule(self, key: tuple[int, Hashable], batch: _Open, now: float,
                  oldest: float | None) -> None:
        when = batch.timeout_at
        margin = self._margin
        if oldest is not None and margin is not None:
            # Re-check at least every margin/2: later messages may hold older leases.
            when = min(when, oldest - margin, now + margin / 2)
        batch.handle = self._started_loop().call_at(max(when, now), self._on_timer, key, batch)

    def _on_timer(self, key: tuple[int, Hashable], batch: _Open) -> None:
        if self._open.get(key) is not batch:
            return
        now = self._started_loop().time()
        batch.handle = None
        if now >= batch.timeout_at:
            self._emit(key, batch, "timeout")
            return
        oldest = None
        if self._inflight is not None:
            oldest = self._inflight.oldest_expiry(m.lease.lease_id for m in batch.messages)
        if oldest is not None and self._margin is not None and oldest - now <= self._margin:
            log.warning("batcher %s: flushing a batch of %d early, its oldest lease expires "
                        "in %.3fs", self.name, len(batch.messages), oldest - now)
            self._emit(key, batch, "deadline")
            return
        self._schedule(key, batch, now, oldest)

    def _emit(self, key: tuple[int, Hashable], batch: _Open, trigger: BatchTrigger) -> None:
        del self._open[key]
        if batch.handle is not None:
            batch.handle.cancel()
            batch.handle = None
        info = BatchInfo(self.name, batch.batch_key, batch.partition, len(batch.messages),
                         trigger)
        self.emitted += 1
        queue = self._queues[0 if batch.partition is None else batch.partition]
        queue.put_nowait((batch.messages, info))

    def flush_all(self, trigger: BatchTrigger = "drain") -> int:
        """Emit every open batch now; returns how many."""
        items = list(self._open.items())
        for key, batch in items:
            self._emit(key, batch, trigger)
        return len(items)

    @property
    def open_batches(self) -> int:
        """How many batches are being filled."""
        return len(self._open)

    # Batch processors ----------------------------------------------------------

    async def close(self) -> None:
        """Flush open batches (trigger ``drain``), let the tasks finish, then end them."""
        self.flush_all("drain")
        await super().close()

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the tasks and timers (what they hold is left to expire); returns the tasks."""
        for batch in self._open.values():
            if batch.handle is not None:
                batch.handle.cancel()
                batch.handle = None
        return super().cancel()

    def _messages(self, item: tuple[list[Message], BatchInfo]) -> list[Message]:
        return item[0]

    async def _handle(self, item: tuple[list[Message], BatchInfo]) -> None:
        messages, info = item
        if self._on_batch is not None:
            self._on_batch(info, messages)
        with _telemetry.process_messages(messages, "batcher", self.name, info):
            await self._process(messages, info)

    async def _process(self, messages: list[Message], info: BatchInfo) -> None:
        handle_batch = self._callbacks.handle_batch
        if handle_batch is None:
            await self._acknowledger.settle(messages, ())
            return
        try:
            returned = await handle_batch(self.name, messages, info, self._context)
            if returned is not messages:
                if not isinstance(returned, list) or not all(
                        isinstance(m, Message) for m in returned):
                    raise TypeError("handle_batch must return the list of messages, got "
                                    f"{type(returned).__name__}")
                seen = {id(m) for m in returned}
                missing = [m for m in messages if id(m) not in seen]
                if missing:
                    log.error("batcher %s: handle_batch did not return %d of its messages; "
                              "settling them by their status", self.name, len(missing))
                    returned = returned + missing
        except Exception as exc:
            fail_on_error(messages, "batch_error", exc, f"batcher {self.name}")
            returned = self._without_lost(messages, exc)
        successful: list[Message] = []
        failed: list[Message] = []
        for m in returned:
            (successful if m.status == "ok" else failed).append(m)
        if failed:
            failed = await run_handle_failed(self._callbacks, failed, self._context, log)
        await self._acknowledger.settle(successful, failed)

    def _without_lost(self, messages: list[Message], exc: Exception) -> list[Message]:
        """The failed batch's messages to settle: not those whose leases the handler's own
        transaction found stale (Rheo.transaction rolled back; another consumer holds
        them now), which are released unsettled."""
        if not isinstance(exc, StaleLease):
            return messages
        lost_ids = {lease.lease_id for lease in exc.leases}
        lost = [m for m in messages if m.lease.lease_id in lost_ids]
        self._acknowledger.abandon(lost)
        return [m for m in messages if m.lease.lease_id not in lost_ids]
