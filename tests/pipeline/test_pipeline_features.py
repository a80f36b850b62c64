"""The pipeline's surface: the Message API, rate limiting, topology, the test helpers
and the validation of its settings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rheo_flow import AlreadyStarted, InvalidArgument, NewEvent, Rheo
from rheo_flow._model._event import _DATA_SLOT, _Pending
from rheo_flow.pipeline import (
    Batcher,
    BatchInfo,
    BatchSize,
    Message,
    Pipeline,
    PipelineHandler,
    Processors,
    RateLimit,
    RateLimiter,
    ack_immediately,
)
from rheo_flow.pipeline.testing import test_batch, test_message

WaitUntil = Callable[..., Awaitable[None]]


class Echo(PipelineHandler):
    """Doubles ``data`` and routes odd values to the ``odd`` batcher."""

    def __init__(self) -> None:
        self.seen: list[BatchInfo] = []

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        if message.data == "boom":
            raise ValueError("boom")
        if message.data == "reject":
            return message.configure_ack(on_failure="reject").failed("rejected by rule")
        if message.data == "early":
            return await message.ack_immediately()
        message.update_data(lambda d: d * 2)
        if message.data % 4 == 2:
            message.put_batcher("odd")
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        self.seen.append(batch_info)
        if batcher == "odd" and context == "fail-odd":
            raise RuntimeError("odd sink down")
        return messages


# Message -----------------------------------------------------------------------


async def test_message_api_chains_and_validates() -> None:
    result = await test_message(Echo(), 2, key="k1", partition=3,
                                headers={"h": "v"}, metadata={"extra": 1},
                                batchers={"default": Batcher(), "odd": Batcher()})
    [m] = result.successful
    assert m.data == 4
    assert m.outcome == "ack"
    assert m.status == "ok"
    assert m.reason is None
    meta = m.metadata
    assert (meta["stream"], meta["partition"], meta["sequence"], meta["key"]) == (
        "test", 3, 1, "k1")
    assert (meta["attempt"], meta["headers"], meta["extra"], meta["type"]) == (
        1, {"h": "v"}, 1, "test")
    assert meta["appended_at"].tzinfo is not None
    assert (m.partition, m.sequence, m.key, m.attempt) == (3, 1, "k1", 1)
    assert "outcome='ack'" in repr(m)

    assert m.put_data(1).update_data(lambda d: d + 1).data == 2
    assert m.put_batcher("x").put_batch_key(("a", 1)).put_batch_mode("flush") is m
    assert (m.batcher, m.batch_key, m.batch_mode) == ("x", ("a", 1), "flush")
    with pytest.raises(InvalidArgument, match="batcher"):
        m.put_batcher("")
    with pytest.raises(InvalidArgument, match="hashable"):
        m.put_batch_key(["not", "hashable"])
    with pytest.raises(InvalidArgument, match="batch mode"):
        m.put_batch_mode("eager")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="on_failure"):
        m.configure_ack(on_failure="requeue")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="retry_delay_ms"):
        m.configure_ack(retry_delay_ms=-1)
    assert m.failed("").reason == "failed"
    assert len(m.failed("x" * 5_000).reason or "") == 2_000


async def test_ack_immediately_needs_a_pipeline() -> None:
    result = await test_message(Echo(), "early")
    [m] = result.messages
    m.outcome = None
    m._acknowledger = None
    with pytest.raises(InvalidArgument, match="not in a pipeline"):
        await ack_immediately([m])


# Test helpers -------------------------------------------------------------------


async def test_test_message_reports_failures_with_their_outcome() -> None:
    failed = await test_message(Echo(), "boom")
    assert failed.successful == []
    [m] = failed.failed
    assert (m.outcome, m.reason) == ("nack", "handler_error: ValueError: boom")
    assert failed.nacked == [m]

    rejected = await test_message(Echo(), "reject")
    assert [(x.outcome, x.reason) for x in rejected.rejected] == [("reject", "rejected by rule")]

    early = await test_message(Echo(), "early")
    assert [x.outcome for x in early.acked] == ["ack"]


async def test_test_batch_runs_the_batchers_with_their_triggers() -> None:
    handler = Echo()
    result = await test_batch(handler, [2, 4, 6, 8, 10],
                              batchers={"default": Batcher(batch_size=2), "odd": Batcher()})
    assert sorted(m.data for m in result.acked) == [4, 8, 12, 16, 20]
    assert [(i.batcher, i.size, i.trigger) for i, _ in result.batches] == [
        ("default", 2, "size"), ("default", 2, "size"), ("default", 1, "drain")]
    assert [[m.data for m in ms] for _, ms in result.batches] == [[4, 8], [12, 16], [20]]

    flushed = await test_batch(handler, [2, 4], batch_mode="flush",
                               batchers={"default": Batcher(batch_size=10)})
    assert [(i.size, i.trigger) for i, _ in flushed.batches] == [(1, "flush"), (1, "flush")]


async def test_test_batch_with_a_pipeline_uses_its_settings(rheo: Rheo) -> None:
    await rheo.create_stream("numbers")
    pipeline = Pipeline(rheo, stream="numbers", group="g", handler=Echo(), context="fail-odd",
                        batchers={"default": Batcher(batch_size=3), "odd": Batcher()},
                        on_failure="reject")
    result = await test_batch(pipeline, [1, 2, 3])  # 2 and 6 go to "odd", which fails
    assert [m.data for m in result.acked] == [4]
    assert sorted(m.data for m in result.rejected) == [2, 6]
    assert {m.reason for m in result.rejected} == {"batch_error: RuntimeError: odd sink down"}
    assert pipeline.state == "new"  # the helper never starts the pipeline


async def test_test_batch_checks_its_input() -> None:
    with pytest.raises(InvalidArgument, match="at least one"):
        await test_batch(Echo(), [])
    with pytest.raises(InvalidArgument, match="instance"):
        await test_message(Echo, 1)


async def test_size_function_batches() -> None:
    class Passthrough(PipelineHandler):
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            return message

        async def handle_batch(self, batcher: str, messages: list[Message],
                               batch_info: BatchInfo, context: Any) -> list[Message]:
            return messages

    by_bytes = {"default": Batcher(batch_size=BatchSize(max=10, size_of=lambda m: len(m.data)))}
    result = await test_batch(Passthrough(), ["aaaa", "bbbb", "cc", "dddddddddddd", "e", "ff"],
                              batchers=by_bytes)
    assert [[m.data for m in ms] for _, ms in result.batches] == [
        ["aaaa", "bbbb", "cc"], ["dddddddddddd"], ["e", "ff"]]
    assert [i.trigger for i, _ in result.batches] == ["size", "size", "drain"]


async def test_batch_keys_and_batcher_partitions() -> None:
    class Keyed(PipelineHandler):
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            return message.put_batch_key(message.data % 2)

        async def handle_batch(self, batcher: str, messages: list[Message],
                               batch_info: BatchInfo, context: Any) -> list[Message]:
            assert {m.data % 2 for m in messages} == {batch_info.batch_key}
            return messages

    result = await test_batch(Keyed(), list(range(10)), batchers={
        "default": Batcher(batch_size=3, concurrency=2, partition_by=lambda m: m.data % 3)})
    assert sum(i.size for i, _ in result.batches) == 10
    for info, messages in result.batches:
        assert {m.data % 3 % 2 for m in messages} == {info.partition}  # over 2 tasks


# Rate limiting -------------------------------------------------------------------


class FakeTime:
    """A clock that moves only when the limiter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds


async def test_rate_limiter_windows() -> None:
    time = FakeTime()
    limiter = RateLimiter(RateLimit(5, interval_ms=100), clock=time.clock, sleep=time.sleep)
    assert await limiter.available() == 5
    limiter.consume(3)
    assert limiter.remaining() == 2
    limiter.consume(2)
    assert await limiter.available() == 5  # waited for the next window
    assert (time.sleeps, time.now) == (1, pytest.approx(0.1))
    limiter.consume(5)
    assert limiter.update(allowed_messages=8) == RateLimit(8, 100)
    assert limiter.remaining() == 3  # the window keeps what it already let through
    assert await limiter.available() == 3


class CountingLimiter(RateLimiter):
    """Records how many messages each window let through."""

    def __init__(self, limit: RateLimit, time: FakeTime) -> None:
        super().__init__(limit, clock=time.clock, sleep=time.sleep)
        self.time = time
        self.per_window: Counter[int] = Counter()
        self.limits: dict[int, int] = {}

    def consume(self, count: int) -> None:
        window = round(self.time.now / (self.limit.interval_ms / 1000))
        self.per_window[window] += count
        self.limits[window] = self.limit.allowed_messages
        super().consume(count)


async def test_pipeline_respects_the_rate_limit_and_its_updates(
    rheo: Rheo, wait_until: WaitUntil
) -> None:
    await rheo.create_stream("numbers", partitions=2)
    await rheo.append("numbers", [NewEvent("n", i) for i in range(60)])
    limiter = CountingLimiter(RateLimit(5, interval_ms=1_000), FakeTime())

    class Counting(PipelineHandler):
        handled = 0

        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            self.handled += 1
            if self.handled == 20:  # raise the limit from inside the running pipeline
                context["pipeline"].update_rate_limit(allowed_messages=12)
            return message

    handler = Counting()
    context: dict[str, Pipeline] = {}
    pipeline = Pipeline(rheo, stream="numbers", group="g", handler=handler, context=context,
                        rate_limit=limiter, max_inflight=5)
    context["pipeline"] = pipeline
    async with pipeline:
        await wait_until(lambda: handler.handled == 60)
    assert sum(limiter.per_window.values()) == 60
    assert all(count <= limiter.limits[w] for w, count in limiter.per_window.items())
    assert limiter.per_window[0] == 5
    assert max(limiter.per_window.values()) > 5  # the raised limit was used
    assert pipeline.rate_limit == RateLimit(12, 1_000)


async def test_drain_does_not_wait_for_the_next_rate_window(rheo: Rheo, wait_until: WaitUntil
                                                            ) -> None:
    await rheo.create_stream("numbers")
    await rheo.append("numbers", [NewEvent("n", i) for i in range(5)])
    seen: list[int] = []

    class Recording(PipelineHandler):
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            seen.append(message.data)
            return message

    pipeline = Pipeline(rheo, stream="numbers", group="g", handler=Recording(),
                        rate_limit=RateLimit(2, interval_ms=3_600_000))
    await pipeline.start()
    await wait_until(lambda: len(seen) == 2)
    assert await pipeline.drain(timeout=5)  # the hour-long window is not waited for
    assert len(seen) == 2


async def test_update_rate_limit_sets_a_first_limit(rheo: Rheo) -> None:
    await rheo.create_stream("numbers")
    pipeline = Pipeline(rheo, stream="numbers", group="g", handler=Echo())
    assert pipeline.rate_limit is None
    with pytest.raises(InvalidArgument, match="allowed_messages"):
        pipeline.update_rate_limit(interval_ms=10)
    assert pipeline.update_rate_limit(allowed_messages=50) == RateLimit(50, 1_000)
    assert pipeline.update_rate_limit(interval_ms=500) == RateLimit(50, 500)
    with pytest.raises(InvalidArgument, match="allowed_messages"):
        pipeline.update_rate_limit(allowed_messages=0)
    assert pipeline.topology().producer.rate_limit == RateLimit(50, 500)


# Topology and settings ---------------------------------------------------------------


def by_customer(message: Message) -> str:
    return str(message.key)


async def test_topology_lists_every_stage(rheo: Rheo) -> None:
    await rheo.create_stream("orders", partitions=4)
    pipeline = Pipeline(
        rheo, stream="orders", group="billing", handler=Echo(), consumer_id="worker-1",
        processors=Processors(concurrency=8, max_demand=20, partition_by="key"),
        batchers={"default": Batcher(batch_size=100, batch_timeout=2, concurrency=2),
                  "s3": Batcher(batch_size=BatchSize(1_000_000, size_of=len),
                                partition_by=by_customer)},
        rate_limit=RateLimit(1_000), lease_ms=10_000, partitions=[0, 2],
    )
    topology = pipeline.topology()
    producer = topology.producer
    assert (producer.stream, producer.group, producer.consumer_id) == (
        "orders", "billing", "worker-1")
    assert (producer.max_demand, producer.lease_ms, producer.partitions) == (
        8 * 20 * 2 + 100 * 3 + 100 * 2, 10_000, [0, 2])
    [processors] = topology.processors
    assert (processors.name, processors.concurrency, processors.max_demand,
            processors.partition_by) == ("default", 8, 20, "key")
    default, s3 = topology.batchers
    assert (default.name, default.concurrency, default.batch_size, default.batch_size_unit,
            default.batch_timeout) == ("default", 2, 100, "messages", 2.0)
    assert (s3.name, s3.batch_size, s3.batch_size_unit, s3.partition_by) == (
        "s3", 1_000_000, "len", "by_customer")
    assert topology.as_dict()["batchers"][0]["name"] == "default"


async def test_settings_are_validated(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    for bad, match in [
        (lambda: Processors(concurrency=0), "concurrency"),
        (lambda: Processors(max_demand=True), "max_demand"),
        (lambda: Processors(partition_by="color"), "partition_by"),
        (lambda: Batcher(batch_size=0), "batch_size"),
        (lambda: Batcher(batch_timeout=0), "batch_timeout"),
        (lambda: Batcher(concurrency=0), "concurrency"),
        (lambda: BatchSize(max=0, size_of=len), "max"),
        (lambda: RateLimit(0), "allowed_messages"),
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=Echo,  # type: ignore
                          ), "instance"),
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=object()),  # type: ignore
         "handle_message"),
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=Echo(),
                          batchers={"x": 1}), "Batcher"),  # type: ignore[dict-item]
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=Echo(),
                          on_failure="drop"), "on_failure"),  # type: ignore[arg-type]
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=Echo(),
                          max_inflight=0), "max_inflight"),
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=Echo(),
                          max_inflight=10, fetch_size=11),
         r"fetch_size \(11\) cannot exceed max_inflight \(10\)"),
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=Echo(),
                          fetch_size=81),  # the computed max_inflight is 80
         r"fetch_size \(81\) cannot exceed max_inflight \(80, computed"),
        (lambda: Pipeline(rheo, stream="orders", group="g", handler=Echo(),
                          fetch_size=0), "fetch_size"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            bad()

    class Sync(PipelineHandler):
        def handle_message(self, processor: str, message: Message, context: Any
                           ) -> Message:  # type: ignore[override]
            return message

    with pytest.raises(InvalidArgument, match="async def"):
        Pipeline(rheo, stream="orders", group="g", handler=Sync())

    class Missing(PipelineHandler):
        pass

    with pytest.raises(InvalidArgument, match="must implement handle_message"):
        Pipeline(rheo, stream="orders", group="g", handler=Missing())


async def test_fetch_size_caps_each_fetch(rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("t", i) for i in range(30)])
    sizes: list[int] = []
    fetch = rheo.backend.fetch

    async def sized_fetch(*args: Any, **kwargs: Any) -> Any:
        leases = await fetch(*args, **kwargs)
        sizes.append(len(leases))
        return leases

    rheo.backend.fetch = sized_fetch  # type: ignore[method-assign]
    pipeline = Pipeline(rheo, stream="orders", group="g", handler=Echo(),
                        max_inflight=20, fetch_size=4, poll_ms=10)
    async with pipeline:
        await wait_until(lambda: pipeline.stats().acked == 30)
    assert max(sizes) == 4, sizes
    assert sum(sizes) == 30


async def test_lifecycle(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    pipeline = Pipeline(rheo, stream="orders", group="g", handler=Echo())
    assert await pipeline.drain()  # never started: nothing to do
    started = await Pipeline(rheo, stream="orders", group="g2", handler=Echo()).start()
    with pytest.raises(AlreadyStarted):
        await started.start()
    await started.stop()
    assert started.state == "stopped"
    assert await started.drain()
    missing = Pipeline(rheo, stream="nope", group="g", handler=Echo())
    with pytest.raises(InvalidArgument, match="unknown stream"):
        await missing.start()
    assert missing.state == "stopped"


async def test_a_duck_typed_handler_works(rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("n", i) for i in range(3)])

    class Duck:
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            return message

    pipeline = Pipeline(rheo, stream="orders", group="g", handler=Duck(),
                        batchers={"default": Batcher(batch_size=3)})
    async with pipeline:
        await wait_until(lambda: pipeline.stats().acked == 3)
    assert pipeline.stats().batches == 1


def _decoded(event: Any) -> bool:
    """Whether an event's data was decoded from its JSON text already."""
    return _DATA_SLOT.__get__(event, type(event)).__class__ is not _Pending


async def test_a_message_decodes_its_data_only_when_read(rheo: Rheo) -> None:
    await rheo.create_stream("lazy")
    await rheo.append("lazy", [NewEvent("t", {"n": 1}), NewEvent("t", {"n": 2})])
    unread, read = (Message(lease) for lease in await rheo.fetch("lazy", "g", limit=2))
    # The memory backend hands over JSON text: a message nobody reads leaves it so.
    assert not _decoded(unread.lease.event)
    assert not _decoded(read.lease.event)
    assert read.data == {"n": 2}
    assert _decoded(read.lease.event)
    assert read.update_data(lambda d: {**d, "seen": True}).data == {"n": 2, "seen": True}
    assert unread.put_data("replaced").data == "replaced"
    assert not _decoded(unread.lease.event)
