"""The pipeline's failure paths: handler errors, failed messages, batch failures, poison
events, lost leases, an unreachable backend, and leases kept alive or flushed early."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from rheo_flow import Lease, ManualClock, NewEvent, Rheo, SettleResult
from rheo_flow.backends import MemoryBackend
from rheo_flow.pipeline import Batcher, BatchInfo, Message, Pipeline, PipelineHandler, Processors
from rheo_flow.pipeline._acknowledger import Acknowledger

WaitUntil = Callable[..., Awaitable[None]]


class ScriptedBackend(MemoryBackend):
    """The memory backend counting calls, with injectable ack / renew failures."""

    def __init__(self, *, clock: ManualClock | None = None) -> None:
        super().__init__(clock=clock)
        self.calls: Counter[str] = Counter()
        self.nack_calls: list[tuple[str, int, int]] = []
        self.ack_sizes: list[int] = []
        self.ack_error: BaseException | None = None
        self.renew_error: BaseException | None = None

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        self.calls["ack"] += 1
        if self.ack_error is not None:
            raise self.ack_error
        self.ack_sizes.append(len(leases))
        return await super().ack(leases)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        self.calls["nack"] += 1
        self.nack_calls.append((reason, delay_ms, len(leases)))
        return await super().nack(leases, reason, delay_ms, error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        self.calls["reject"] += 1
        return await super().reject(leases, reason, error)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        self.calls["renew"] += 1
        if self.renew_error is not None:
            raise self.renew_error
        return await super().renew(leases, lease_ms)


@pytest.fixture
def backend(clock: ManualClock) -> ScriptedBackend:
    return ScriptedBackend(clock=clock)


@pytest.fixture
async def db(backend: ScriptedBackend) -> AsyncIterator[Rheo]:
    async with Rheo(backend) as rheo:
        await rheo.create_stream("jobs", partitions=2)
        yield rheo


async def add_jobs(rheo: Rheo, count: int) -> None:
    await rheo.append("jobs", [NewEvent("job", {"n": i}, key=f"k{i}") for i in range(count)])


async def settled(rheo: Rheo) -> bool:
    return await rheo.frontier("jobs", "workers") == await rheo.high_water("jobs")


class Scripted(PipelineHandler):
    """A handler whose behaviour per event number and attempt is set by each test."""

    def __init__(self, on_message: Callable[[Message], Any] | None = None,
                 on_batch: Callable[[list[Message]], Any] | None = None,
                 failed_hook: Callable[[list[Message]], Any] | None = None) -> None:
        self.on_message = on_message
        self.on_batch = on_batch
        self.failed_hook = failed_hook
        self.handled: list[tuple[int, int]] = []
        self.batches: list[tuple[BatchInfo, list[int]]] = []
        self.failed: list[tuple[int, int, str | None]] = []

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        self.handled.append((n(message), message.attempt))
        if self.on_message is not None:
            result = self.on_message(message)
            if asyncio.iscoroutine(result):
                await result
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        self.batches.append((batch_info, [n(m) for m in messages]))
        if self.on_batch is not None:
            result = self.on_batch(messages)
            if asyncio.iscoroutine(result):
                await result
        return messages

    async def handle_failed(self, messages: list[Message], context: Any) -> list[Message]:
        self.failed.extend((n(m), m.attempt, m.reason) for m in messages)
        if self.failed_hook is not None:
            self.failed_hook(messages)
        return messages


def n(message: Message) -> int:
    return int(message.lease.event.data["n"])


def pipeline_for(rheo: Rheo, handler: PipelineHandler, **options: Any) -> Pipeline:
    settings: dict[str, Any] = {
        "processors": Processors(concurrency=2, max_demand=5),
        "batchers": {"default": Batcher(batch_size=5, batch_timeout=0.01)},
        "poll_ms": 10,
        # The manual clock does not move: no backoff (tests/runtime/test_retry.py).
        "retry_delay_ms": 0,
    }
    settings.update(options)
    return Pipeline(rheo, stream="jobs", group="workers", handler=handler, **settings)


async def test_a_raising_handler_fails_only_its_message(db: Rheo, wait_until: WaitUntil) -> None:
    await add_jobs(db, 10)

    def boom(message: Message) -> None:
        if n(message) == 3 and message.attempt == 1:
            raise ValueError("boom")

    handler = Scripted(on_message=boom)
    async with pipeline_for(db, handler) as pipeline:
        await wait_until(lambda: settled(db))
    assert handler.failed == [(3, 1, "handler_error: ValueError: boom")]
    assert sorted(handler.handled) == sorted([(i, 1) for i in range(10)] + [(3, 2)])
    batched = sorted(x for _, items in handler.batches for x in items)
    assert batched == list(range(10))  # 3 only once, on its second attempt
    stats = pipeline.stats()
    assert (stats.acked, stats.nacked) == (10, 1)


async def test_failed_message_is_retried_after_its_delay(
    db: Rheo, clock: ManualClock, wait_until: WaitUntil
) -> None:
    await add_jobs(db, 4)

    def fail_first(message: Message) -> None:
        if n(message) == 2 and message.attempt == 1:
            message.failed("not yet").configure_ack(retry_delay_ms=60_000)

    handler = Scripted(on_message=fail_first)
    async with pipeline_for(db, handler):
        await wait_until(lambda: (2, 2) not in handler.handled and len(handler.batches) > 0
                         and sum(len(b) for _, b in handler.batches) == 3)
        # Nacked with its delay: not available to anybody before it passes.
        assert await db.fetch("jobs", "workers", consumer_id="other", limit=10) == []
        clock.advance(60_000)
        await wait_until(lambda: settled(db))
    assert (2, 2) in handler.handled
    assert handler.failed == [(2, 1, "not yet")]


async def test_failed_message_configured_to_reject_is_dead_lettered(
    db: Rheo, backend: ScriptedBackend, wait_until: WaitUntil
) -> None:
    await add_jobs(db, 6)

    def reject_odd(message: Message) -> None:
        if n(message) % 2:
            message.configure_ack(on_failure="reject").failed("invalid order")

    handler = Scripted(on_message=reject_odd)
    async with pipeline_for(db, handler) as pipeline:
        await wait_until(lambda: settled(db))
    dead = await db.dead_letters("jobs", "workers")
    assert sorted(d.event_id for d in dead) == sorted(
        e.id for e in await _events(db) if e.data["n"] % 2)
    assert {d.reason for d in dead} == {"invalid order"}
    assert pipeline.stats().rejected == 3
    assert backend.calls["nack"] == 0


async def _events(rheo: Rheo) -> list[Any]:
    from rheo_flow import Query

    return (await rheo.query_page(Query(stream="jobs"), limit=100)).events


async def test_on_failure_default_can_be_reject(db: Rheo, wait_until: WaitUntil) -> None:
    await add_jobs(db, 2)
    handler = Scripted(on_message=lambda m: m.failed("nope") if n(m) == 0 else None)
    async with pipeline_for(db, handler, on_failure="reject"):
        await wait_until(lambda: settled(db))
    assert [d.reason for d in await db.dead_letters("jobs", "workers")] == ["nope"]


async def test_a_raising_batch_fails_the_whole_batch(db: Rheo, wait_until: WaitUntil) -> None:
    await add_jobs(db, 5)

    def explode(messages: list[Message]) -> None:
        if any(m.attempt == 1 for m in messages):
            raise RuntimeError("sink down")

    handler = Scripted(on_batch=explode)
    async with pipeline_for(db, handler,
                            batchers={"default": Batcher(batch_size=5, batch_timeout=5)}
                            ) as pipeline:
        await wait_until(lambda: settled(db))
    assert [(info.size, info.trigger) for info, _ in handler.batches] == [(5, "size")] * 2
    assert sorted(handler.failed) == [(i, 1, "batch_error: RuntimeError: sink down")
                                      for i in range(5)]
    assert sorted(handler.handled) == [(i, a) for i in range(5) for a in (1, 2)]
    assert (pipeline.stats().acked, pipeline.stats().nacked) == (5, 5)


async def test_poison_event_is_dead_lettered_at_max_attempts(db: Rheo, wait_until: WaitUntil
                                                             ) -> None:
    await add_jobs(db, 6)

    def poison(message: Message) -> None:
        if n(message) == 4:
            raise ValueError("cannot parse")

    handler = Scripted(on_message=poison)
    async with pipeline_for(db, handler, max_attempts=3):
        await wait_until(lambda: settled(db))
    dead = await db.dead_letters("jobs", "workers")
    assert [(d.attempts, d.reason) for d in dead] == [(3, "max_attempts")]
    assert [a for i, a in handler.handled if i == 4] == [1, 2, 3]


async def test_handle_failed_raising_still_settles(db: Rheo, wait_until: WaitUntil) -> None:
    await add_jobs(db, 3)

    def broken_hook(messages: list[Message]) -> None:
        raise RuntimeError("hook bug")

    handler = Scripted(
        on_message=lambda m: m.configure_ack(on_failure="reject").failed("bad")
        if n(m) == 1 else None,
        failed_hook=broken_hook,
    )
    async with pipeline_for(db, handler):
        await wait_until(lambda: settled(db))
    assert [d.reason for d in await db.dead_letters("jobs", "workers")] == ["bad"]


async def test_failures_are_settled_in_one_call_per_group(
    db: Rheo, backend: ScriptedBackend, wait_until: WaitUntil
) -> None:
    await add_jobs(db, 10)

    def sort_out(message: Message) -> None:
        if message.attempt > 1:
            return
        if n(message) in (1, 2, 3):
            message.failed("reason x")
        elif n(message) in (4, 5):
            message.failed("reason y").configure_ack(retry_delay_ms=600_000)

    handler = Scripted(on_message=sort_out)
    pipeline = pipeline_for(
        db, handler, processors=Processors(concurrency=1, max_demand=10), max_inflight=10,
        batchers={"default": Batcher(batch_size=5, batch_timeout=0.01)})
    async with pipeline:
        # The "reason x" ones come back at once and succeed; "reason y" ones wait.
        await wait_until(lambda: pipeline.stats().acked == 8)
    assert sorted(backend.nack_calls) == [("reason x", 0, 3), ("reason y", 600_000, 2)]
    assert backend.ack_sizes[0] == 5  # the first five successes: one batch, one call


async def test_stale_settle_is_dropped(
    db: Rheo, clock: ManualClock, backend: ScriptedBackend, wait_until: WaitUntil
) -> None:
    await add_jobs(db, 1)
    release = asyncio.Event()

    async def stall(message: Message) -> None:
        await release.wait()

    handler = Scripted(on_message=stall)
    pipeline = pipeline_for(db, handler, lease_ms=1_000)
    await pipeline.start()
    await wait_until(lambda: handler.handled == [(0, 1)])
    backend.renew_error = ConnectionRefusedError("partition")  # renewals fail meanwhile
    clock.advance(1_001)
    taken = await db.fetch("jobs", "workers", consumer_id="rival", limit=10)
    assert [lease.attempt for lease in taken] == [2]
    release.set()
    await wait_until(lambda: pipeline.stats().settle_failures == {"stale_lease": 1})
    assert backend.calls["nack"] == 0  # dropped: no nack of a lease that is not ours
    assert await pipeline.drain(5)
    assert [r.ok for r in await db.ack(taken)] == [True]  # the rival's lease is intact


async def test_unreachable_backend_on_ack_leaves_leases_to_expire(
    db: Rheo, clock: ManualClock, backend: ScriptedBackend, wait_until: WaitUntil
) -> None:
    await add_jobs(db, 4)
    backend.ack_error = ConnectionRefusedError("connection refused")
    handler = Scripted()
    pipeline = pipeline_for(db, handler, lease_ms=5_000)
    await pipeline.start()
    await wait_until(lambda: pipeline.stats().settle_failures.get("backend_unavailable") == 4)
    assert not pipeline.producer.inflight  # released: renewal stops, the leases expire
    assert backend.calls["nack"] == 0
    assert await db.fetch("jobs", "workers", consumer_id="other", limit=10) == []
    backend.ack_error = None
    clock.advance(5_000)
    await wait_until(lambda: settled(db))
    assert sorted(a for _, a in handler.handled) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert await pipeline.drain(5)


async def test_renewal_keeps_a_slow_batch_alive_without_redelivery(
    wait_until: WaitUntil
) -> None:
    backend = ScriptedBackend()  # real clock: real 200 ms leases
    async with Rheo(backend) as rheo:
        await rheo.create_stream("jobs", partitions=2)
        await add_jobs(rheo, 6)
        release = asyncio.Event()

        async def slow(messages: list[Message]) -> None:
            await release.wait()

        handler = Scripted(on_batch=slow)
        pipeline = pipeline_for(rheo, handler, lease_ms=200,
                                batchers={"default": Batcher(batch_size=6, batch_timeout=5)})
        await pipeline.start()
        await wait_until(lambda: len(handler.batches) == 1)
        first_deadline = min(lease.deadline_ms for lease in
                             (e.lease for e in pipeline.producer.inflight.entries()))
        # Hold the batch well past the original deadlines, across several renewals.
        await wait_until(lambda: time.time() * 1000 > first_deadline + 300
                         and pipeline.producer.stats().renewals >= 3, timeout=10)
        assert await rheo.fetch("jobs", "workers", consumer_id="rival", limit=10) == []
        release.set()
        await wait_until(lambda: settled(rheo))
        assert await pipeline.drain(5)
    assert sorted(handler.handled) == [(i, 1) for i in range(6)]
    assert pipeline.stats().settle_failures == {}


async def test_batch_is_flushed_before_its_oldest_lease_expires(wait_until: WaitUntil) -> None:
    backend = ScriptedBackend()  # real clock
    backend.renew_error = ConnectionRefusedError("renewals keep failing")
    async with Rheo(backend) as rheo:
        await rheo.create_stream("jobs", partitions=2)
        await add_jobs(rheo, 5)
        handler = Scripted()
        pipeline = pipeline_for(rheo, handler, lease_ms=600,
                                batchers={"default": Batcher(batch_size=1_000,
                                                             batch_timeout=3_600)})
        async with pipeline:
            await wait_until(lambda: settled(rheo), timeout=10)
    assert [info.trigger for info, _ in handler.batches] == ["deadline"]
    assert pipeline.stats().settle_failures == {}  # acked while the leases were still ours
    assert pipeline.stats().acked == 5


async def test_ack_immediately_settles_once(db: Rheo, backend: ScriptedBackend,
                                            wait_until: WaitUntil) -> None:
    await add_jobs(db, 6)

    async def early(message: Message) -> None:
        if n(message) < 3:
            await message.ack_immediately()
            assert message.settled
            assert message.outcome == "ack"

    handler = Scripted(on_message=early)
    async with pipeline_for(db, handler) as pipeline:
        await wait_until(lambda: settled(db))
    assert pipeline.stats().acked == 6
    assert sum(len(items) for _, items in handler.batches) == 6  # still batched
    assert pipeline.stats().settle_failures == {}


async def test_drain_timeout_cancels_and_hands_the_leases_back(
    db: Rheo, wait_until: WaitUntil
) -> None:
    await add_jobs(db, 3)
    never = asyncio.Event()

    async def stuck(messages: list[Message]) -> None:
        await never.wait()

    handler = Scripted(on_batch=stuck)
    pipeline = pipeline_for(db, handler, batchers={"default": Batcher(batch_size=3)})
    await pipeline.start()
    await wait_until(lambda: len(handler.batches) == 1)
    assert not await pipeline.drain(timeout=0.1)
    assert pipeline.state == "stopped"
    assert pipeline.producer.state == "stopped"
    assert len(pipeline.producer.inflight) == 0  # handed back, not left to expire
    assert not await settled(db)
    again = await db.fetch(pipeline.producer.stream, pipeline.producer.group, limit=10)
    assert [lease.attempt for lease in again] == [2, 2, 2]


async def test_a_message_for_an_unknown_batcher_fails(db: Rheo, wait_until: WaitUntil) -> None:
    await add_jobs(db, 2)
    handler = Scripted(on_message=lambda m: m.put_batcher("nowhere") if n(m) == 0 else None)
    async with pipeline_for(db, handler, on_failure="reject"):
        await wait_until(lambda: settled(db))
    assert handler.failed == [(0, 1, "handler_error: no batcher named 'nowhere'")]


async def test_a_handler_returning_something_else_fails_the_message(
    db: Rheo, wait_until: WaitUntil
) -> None:
    await add_jobs(db, 1)

    class Forgetful(PipelineHandler):
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            return None  # type: ignore[return-value]

    async with pipeline_for(db, Forgetful(), on_failure="reject"):
        await wait_until(lambda: settled(db))
    [dead] = await db.dead_letters("jobs", "workers")
    assert dead.reason == "handler_error: handle_message returned NoneType, not a Message"


class _Recording(Acknowledger):
    """Records the settle calls it is asked to make."""

    def __init__(self) -> None:
        super().__init__(retry_delay_ms=0)
        self.calls: list[tuple[str, str, int, list[int]]] = []

    async def _ack(self, messages: list[Message]) -> None:
        self.calls.append(("ack", "", 0, [m.lease.sequence for m in messages]))

    async def _nack(self, messages: list[Message], reason: str, delay_ms: int,
                    error: str | None) -> None:
        self.calls.append(("nack", reason, delay_ms, [m.lease.sequence for m in messages]))

    async def _reject(self, messages: list[Message], reason: str, error: str | None) -> None:
        self.calls.append(("reject", reason, 0, [m.lease.sequence for m in messages]))


async def test_failed_messages_go_out_in_one_call_per_settle_call_once_each(rheo: Rheo) -> None:
    await rheo.create_stream("jobs")
    await rheo.append("jobs", [NewEvent("job", {"n": i}) for i in range(5)])
    messages = [Message(lease) for lease in await rheo.fetch("jobs", "g", limit=5)]
    ok, x1, y, x2, rejected = messages
    x1.failed("x")
    x2.failed("x")
    y.failed("y").configure_ack(retry_delay_ms=50)
    rejected.failed("x").configure_ack(on_failure="reject")
    acknowledger = _Recording()
    await acknowledger.settle([ok], [x1, y, x2, rejected, x1])  # x1 listed twice
    assert acknowledger.calls == [
        ("ack", "", 0, [ok.lease.sequence]),
        ("nack", "x", 0, [x1.lease.sequence, x2.lease.sequence]),
        ("nack", "y", 50, [y.lease.sequence]),
        ("reject", "x", 0, [rejected.lease.sequence]),
    ]
    assert [m.outcome for m in messages] == ["ack", "nack", "nack", "nack", "reject"]
