"""The pipeline end to end: every event in exactly one batch, order per key, drain, leases."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import ManualClock, NewEvent, Rheo
from rheo_flow.backends import MemoryBackend
from rheo_flow.pipeline import (
    Batcher,
    BatchInfo,
    BatchSize,
    Message,
    Pipeline,
    PipelineHandler,
    Processors,
)

WaitUntil = Callable[..., Awaitable[None]]

LEASE_MS = 30_000


def _sqlite_available() -> bool:
    try:
        from rheo_flow.backends import SQLiteBackend  # noqa: F401
    except (ImportError, AttributeError):
        return False
    return True


@pytest.fixture(params=[
    "memory",
    pytest.param("sqlite", marks=pytest.mark.skipif(not _sqlite_available(),
                                                    reason="SQLite backend not available")),
])
async def db(request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path
             ) -> AsyncIterator[Rheo]:
    """An instance over each backend the pipeline is checked against."""
    if request.param == "memory":
        backend: Any = MemoryBackend(clock=clock)
    else:
        from rheo_flow.backends import SQLiteBackend

        backend = SQLiteBackend(tmp_path / "events.db", clock=clock, synchronous="NORMAL")
    async with Rheo(backend) as rheo:
        yield rheo


def body_size(message: Message) -> int:
    """The size of a message's data as JSON bytes."""
    return len(json.dumps(message.data))


class Recorder(PipelineHandler):
    """Routes every third event to the ``s3`` batcher and records everything it sees."""

    def __init__(self) -> None:
        self.handled: list[tuple[str | None, int, int, int]] = []
        self.batches: list[tuple[str, BatchInfo, list[tuple[int, int, str | None]]]] = []

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        event = message.lease.event
        self.handled.append((event.key, event.partition, event.sequence, message.attempt))
        message.update_data(lambda data: {**data, "seen": True})
        if data_n(message) % 3 == 0:
            message.put_batcher("s3")
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        assert all(m.data["seen"] for m in messages)
        assert batch_info.size == len(messages)
        self.batches.append((batcher, batch_info,
                             [(m.partition, m.sequence, m.key) for m in messages]))
        return messages


def data_n(message: Message) -> int:
    return int(message.lease.event.data["n"])


async def fill(rheo: Rheo, count: int, partitions: int = 8, keys: int = 64) -> None:
    await rheo.create_stream("orders", partitions=partitions)
    for start in range(0, count, 5_000):
        await rheo.append("orders", [
            NewEvent("order.placed", {"n": i, "pad": "x" * (i % 50)}, key=f"customer-{i % keys}")
            for i in range(start, min(count, start + 5_000))
        ])


async def settled(rheo: Rheo) -> bool:
    return await rheo.frontier("orders", "billing") == await rheo.high_water("orders")


async def test_every_event_reaches_exactly_one_batch_in_key_order(
    db: Rheo, clock: ManualClock, wait_until: WaitUntil
) -> None:
    count = 10_000
    await fill(db, count)
    handler = Recorder()
    pipeline = Pipeline(
        db, stream="orders", group="billing", handler=handler, lease_ms=LEASE_MS,
        processors=Processors(concurrency=8, max_demand=20, partition_by="key"),
        batchers={
            "default": Batcher(batch_size=100, batch_timeout=0.05, concurrency=2,
                               partition_by="key"),
            "s3": Batcher(batch_size=BatchSize(max=2_000, size_of=body_size),
                          batch_timeout=0.05, concurrency=2),
        },
    )
    async with pipeline:
        await wait_until(lambda: settled(db), timeout=60, message="frontier == high water")
    assert pipeline.state == "stopped"
    assert not pipeline.producer.inflight

    # Every event handled once, on its first attempt, and in exactly one batch.
    assert len(handler.handled) == count
    assert {attempt for *_, attempt in handler.handled} == {1}
    in_batches = Counter((p, s) for _, _, items in handler.batches for p, s, _ in items)
    assert len(in_batches) == count
    assert set(in_batches.values()) == {1}

    # Batches respect their size settings and the routing.
    for batcher, info, items in handler.batches:
        assert info.batcher == batcher
        assert info.trigger in ("size", "timeout", "drain")
        if batcher == "default":
            assert len(items) <= 100
            assert info.partition in (0, 1)
        else:
            assert info.partition is None
    s3_events = sum(len(items) for b, _, items in handler.batches if b == "s3")
    assert s3_events == len(range(0, count, 3))

    # Order per key: handled, and batched in the partitioned batcher, in sequence order.
    per_key: dict[str | None, list[int]] = defaultdict(list)
    for key, _, sequence, _ in handler.handled:
        per_key[key].append(sequence)
    assert all(seqs == sorted(seqs) for seqs in per_key.values())
    batched: dict[str | None, list[int]] = defaultdict(list)
    for batcher, _, items in handler.batches:
        if batcher == "default":
            for _, sequence, key in items:
                batched[key].append(sequence)
    assert all(seqs == sorted(seqs) for seqs in batched.values())

    # Nothing is left leased: even once every lease would have expired, a competing
    # consumer of the group finds nothing to do.
    stats = pipeline.stats()
    assert (stats.fetched, stats.acked, stats.inflight) == (count, count, 0)
    assert stats.settle_failures == {}
    clock.advance(LEASE_MS + 1)
    assert await db.fetch("orders", "billing", consumer_id="late", limit=100) == []


async def test_drain_flushes_open_batches_and_leaves_nothing_leased(
    rheo: Rheo, clock: ManualClock, wait_until: WaitUntil
) -> None:
    await fill(rheo, 250, partitions=2)
    handler = Recorder()
    pipeline = Pipeline(
        rheo, stream="orders", group="billing", handler=handler,
        processors=Processors(concurrency=2),
        batchers={"default": Batcher(batch_size=1_000, batch_timeout=3_600),
                  "s3": Batcher(batch_size=1_000, batch_timeout=3_600)},
    )
    await pipeline.start()
    await wait_until(lambda: pipeline.stats().in_batchers == 250)
    assert handler.batches == []  # open: neither full nor timed out
    assert await pipeline.drain(timeout=10)
    assert {info.trigger for _, info, _ in handler.batches} == {"drain"}
    assert sum(info.size for _, info, _ in handler.batches) == 250
    assert await settled(rheo)
    assert not pipeline.producer.inflight
    clock.advance(LEASE_MS + 1)
    assert await rheo.fetch("orders", "billing", consumer_id="late", limit=10) == []


async def test_processors_ack_directly_without_batchers(rheo: Rheo, wait_until: WaitUntil
                                                        ) -> None:
    await fill(rheo, 300, partitions=4)

    class Plain(PipelineHandler):
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            context.append(processor)
            return message

    seen: list[str] = []
    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Plain(), context=seen,
                        processors=Processors(concurrency=3, name="workers"))
    async with pipeline:
        await wait_until(lambda: settled(rheo))
    assert seen == ["workers"] * 300
    assert pipeline.stats().acked == 300


async def test_prepare_messages_runs_on_each_processor_chunk(rheo: Rheo, wait_until: WaitUntil
                                                             ) -> None:
    await fill(rheo, 95, partitions=1)
    chunks: list[int] = []

    class Prepared(PipelineHandler):
        async def prepare_messages(self, messages: list[Message], context: Any
                                   ) -> list[Message]:
            chunks.append(len(messages))
            return [m.put_data({"prepared": m.data["n"]}) for m in messages]

        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            assert message.data["prepared"] >= 0
            return message

    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Prepared(),
                        processors=Processors(concurrency=1, max_demand=10))
    async with pipeline:
        await wait_until(lambda: settled(rheo))
    assert sum(chunks) == 95
    assert max(chunks) <= 10


async def test_memory_stays_bounded_by_max_inflight(rheo: Rheo, wait_until: WaitUntil) -> None:
    await fill(rheo, 2_000, partitions=4)
    pipeline = Pipeline(
        rheo, stream="orders", group="billing", handler=Recorder(), max_inflight=50,
        processors=Processors(concurrency=2, max_demand=5),
        # Open batches may hold every inflight message: the timeout emits them.
        batchers={"default": Batcher(batch_size=20, batch_timeout=0.01),
                  "s3": Batcher(batch_size=20, batch_timeout=0.01)},
    )
    async with pipeline:
        await wait_until(lambda: settled(rheo), timeout=30)
    stats = pipeline.stats()
    assert stats.peak_inflight <= 50
    assert stats.peak_in_processors <= 50
    assert stats.acked == 2_000
