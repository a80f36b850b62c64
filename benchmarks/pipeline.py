"""Suite ``pipeline``: pipeline throughput against a bare asyncio-queue pipeline.

Both consume the same backlog on the in-memory backend with no-op handlers and
the same shape: one fetching task -> N processor tasks -> a batcher -> M
batch tasks that ack each batch in one call. The bare one is plain
``asyncio.Queue`` plumbing around ``rheo.fetch`` / ``rheo.ack`` (no inflight
tracking, renewal, message objects or failure handling): what the pipeline's
machinery costs is the gap between the two. Rounds alternate between the two
on a fresh backend each; the median of each is reported.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from rheo_flow import NewEvent, Rheo
from rheo_flow.pipeline import Batcher, BatchInfo, Message, Pipeline, PipelineHandler, Processors

from ._common import Result

PARTITIONS = 8
PROCESSORS = 4
MAX_DEMAND = 10
BATCH_SIZE = 100
BATCH_TIMEOUT = 1.0
BATCH_CONCURRENCY = 2
MAX_INFLIGHT = PROCESSORS * MAX_DEMAND * 2 + BATCH_SIZE * (BATCH_CONCURRENCY + 1)


async def backlog(events: int) -> Rheo:
    """A fresh in-memory instance with ``events`` events over PARTITIONS partitions."""
    rheo = await Rheo("memory://").open()
    await rheo.create_stream("bench", partitions=PARTITIONS)
    chunk = 50_000
    for start in range(0, events, chunk):
        await rheo.append("bench", [
            NewEvent("bench.event", {"n": i}, key=f"k{i % 1000}")
            for i in range(start, min(events, start + chunk))
        ])
    return rheo


class NoOp(PipelineHandler):
    """Passes every message and batch through; ``done`` is set once ``expected`` messages
    went through ``handle_batch``."""

    def __init__(self, expected: int = 0) -> None:
        self.expected = expected
        self.batched = 0
        self.done = asyncio.Event()

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        self.batched += len(messages)
        if self.batched >= self.expected:
            self.done.set()
        return messages


async def run_pipeline(rheo: Rheo, events: int, **processor_options: Any) -> float:
    """Events per second through a :class:`Pipeline`."""
    handler = NoOp(events)
    pipeline = Pipeline(
        rheo, stream="bench", group="pipeline", handler=handler,
        processors=Processors(concurrency=PROCESSORS, max_demand=MAX_DEMAND,
                              **processor_options),
        batchers={"default": Batcher(batch_size=BATCH_SIZE, batch_timeout=BATCH_TIMEOUT,
                                     concurrency=BATCH_CONCURRENCY)},
        max_inflight=MAX_INFLIGHT,
    )
    started = time.perf_counter()
    await pipeline.start()
    await handler.done.wait()
    if not await pipeline.drain(10):  # settles the last batches
        raise RuntimeError("pipeline did not drain")
    elapsed = time.perf_counter() - started
    if pipeline.producer.stats().acked != events:
        raise RuntimeError("not every event was acked")
    return events / elapsed


async def run_bare(rheo: Rheo, events: int) -> float:
    """Events per second through plain asyncio queues of the same shape."""
    to_processors: asyncio.Queue[Any] = asyncio.Queue(PROCESSORS * MAX_DEMAND * 2)
    to_batcher: asyncio.Queue[Any] = asyncio.Queue(BATCH_SIZE * BATCH_CONCURRENCY)
    to_ackers: asyncio.Queue[Any] = asyncio.Queue(BATCH_CONCURRENCY)
    done = asyncio.Event()
    acked = 0
    consumer = rheo.new_consumer_id()

    async def produce() -> None:
        while True:
            leases = await rheo.fetch("bench", "bare", consumer_id=consumer, limit=BATCH_SIZE)
            if not leases:
                await rheo.wait_for_append("bench", 0.2)
                continue
            for lease in leases:
                await to_processors.put(lease)

    async def handle(lease: Any) -> Any:
        return lease

    async def process() -> None:
        while True:
            lease = await to_processors.get()
            await to_batcher.put(await handle(lease))

    async def batch() -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await to_batcher.get()]
            deadline = loop.time() + BATCH_TIMEOUT
            while len(items) < BATCH_SIZE:
                if not to_batcher.empty():
                    items.append(to_batcher.get_nowait())
                    continue
                try:
                    async with asyncio.timeout_at(deadline):
                        items.append(await to_batcher.get())
                except TimeoutError:
                    break
            await to_ackers.put(items)

    async def ack() -> None:
        nonlocal acked
        while True:
            items = await to_ackers.get()
            await rheo.ack(items)
            acked += len(items)
            if acked >= events:
                done.set()

    started = time.perf_counter()
    tasks = [asyncio.create_task(produce()), asyncio.create_task(batch())]
    tasks += [asyncio.create_task(process()) for _ in range(PROCESSORS)]
    tasks += [asyncio.create_task(ack()) for _ in range(BATCH_CONCURRENCY)]
    await done.wait()
    elapsed = time.perf_counter() - started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return events / elapsed


async def run(quick: bool) -> list[Result]:
    """Alternate bare and pipeline rounds; report medians and ratios."""
    events = 30_000 if quick else 100_000
    rounds = 3 if quick else 5
    bare: list[float] = []
    piped: list[float] = []
    keyed: list[float] = []
    for _ in range(rounds):
        for target, runner in ((bare, run_bare), (piped, run_pipeline)):
            rheo = await backlog(events)
            try:
                target.append(await runner(rheo, events))
            finally:
                await rheo.close()
        rheo = await backlog(events)
        try:
            keyed.append(await run_pipeline(rheo, events, partition_by="key"))
        finally:
            await rheo.close()
    baseline = statistics.median(bare)
    note = f"{events} events, {PROCESSORS} processors, batch {BATCH_SIZE}x{BATCH_CONCURRENCY}"
    return [
        Result("bare asyncio queues", "memory", baseline, "events/s", note=note),
        Result.compared("pipeline", "memory", statistics.median(piped), "events/s", baseline,
                        note),
        Result.compared("pipeline partition_by=key", "memory", statistics.median(keyed),
                        "events/s", baseline, note),
    ]
