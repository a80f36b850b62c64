"""Acks handed over to the next fetch: a producer waiting for room acks and fetches at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest

from _doubles import FlakyBackend
from rheo_flow import (
    ACK,
    Event,
    Lease,
    ManualClock,
    NewEvent,
    Producer,
    Rheo,
    SettleResult,
    consumer,
)

WaitUntil = Callable[..., Awaitable[None]]


@pytest.fixture
def backend(clock: ManualClock) -> FlakyBackend:
    return FlakyBackend(clock=clock)


@pytest.fixture
async def db(backend: FlakyBackend) -> AsyncIterator[Rheo]:
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders", partitions=2)
        await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(30)])
        yield rheo


async def _waiting_for_room(producer: Producer) -> asyncio.Task[list[Lease]]:
    """A demand that waits for room (every lease inflight), once it does."""
    task = asyncio.create_task(producer.demand(10))
    for _ in range(100):
        if producer._handover.waiting:
            return task
        await asyncio.sleep(0)
    raise AssertionError("the demand never waited for room")


async def test_acks_freeing_a_waiting_demand_go_with_its_fetch(
        db: Rheo, backend: FlakyBackend) -> None:
    async with Producer(db, "orders", "billing", max_demand=10) as producer:
        first = await producer.demand(10)
        waiting = await _waiting_for_room(producer)
        calls = backend.calls.copy()
        results = await producer.ack(first)
        assert [r.ok and not r.repeated for r in results] == [True] * 10
        second = await asyncio.wait_for(waiting, 5)
        assert len(second) == 10  # the room the acks freed
        assert backend.calls - calls == {"ack_and_fetch": 1, "ack": 1, "fetch": 1}
        assert {e.lease.lease_id for e in producer.inflight.entries()} == {
            x.lease_id for x in second}
        # Not waiting for room: an ack goes out alone.
        calls = backend.calls.copy()
        await producer.ack(second)
        assert backend.calls - calls == {"ack": 1}
    assert (producer.stats().acked, producer.stats().fetched) == (20, 20)
    assert sum((await db.frontier("orders", "billing")).values()) == 20


async def test_two_batches_handed_over_share_the_call_and_get_their_own_results(
        db: Rheo, backend: FlakyBackend) -> None:
    async with Producer(db, "orders", "billing", max_demand=10) as producer:
        first = await producer.demand(10)
        waiting = await _waiting_for_room(producer)
        calls = backend.calls.copy()
        # Both batches are handed over before the demand takes them.
        acking = [asyncio.create_task(producer.ack(part)) for part in (first[:4], first[4:])]
        head, tail = await asyncio.wait_for(asyncio.gather(*acking), 5)
        assert [r.lease_id for r in head] == [x.lease_id for x in first[:4]]
        assert [r.lease_id for r in tail] == [x.lease_id for x in first[4:]]
        assert all(r.ok for r in head + tail)
        second = await asyncio.wait_for(waiting, 5)
        assert len(second) == 10
        assert backend.calls - calls == {"ack_and_fetch": 1, "ack": 1, "fetch": 1}
        await producer.ack(second)


@pytest.mark.parametrize("end", ["halt", "cancel"])
async def test_acks_handed_to_a_demand_that_ends_go_out_alone(
        db: Rheo, backend: FlakyBackend, end: str) -> None:
    producer = await Producer(db, "orders", "billing", max_demand=10).start()
    first = await producer.demand(10)
    waiting = await _waiting_for_room(producer)
    acking = asyncio.create_task(producer.ack(first))
    await asyncio.sleep(0)
    assert producer._handover.handed
    # The demand ends before it takes the acks over: halted (drain, stop) or cancelled.
    if end == "halt":
        producer.halt()
    else:
        waiting.cancel()
    results = await asyncio.wait_for(acking, 5)
    assert all(r.ok for r in results)
    if end == "halt":
        assert await asyncio.wait_for(waiting, 5) == []
    assert backend.calls["ack_and_fetch"] == 0
    await producer.stop()
    assert sum((await db.frontier("orders", "billing")).values()) == 10


async def test_a_failed_combined_call_acks_alone_and_fetches_again(
        db: Rheo, backend: FlakyBackend) -> None:
    backend.combined_failures = 1
    async with Producer(db, "orders", "billing", max_demand=10) as producer:
        first = await producer.demand(10)
        waiting = await _waiting_for_room(producer)
        calls = backend.calls.copy()
        results = await producer.ack(first)
        assert all(r.ok for r in results)
        second = await asyncio.wait_for(waiting, 5)
        assert not {x.lease_id for x in second} & {x.lease_id for x in first}
        # The combined call failed: one ack alone, then the fetch on its own.
        assert backend.calls - calls == {"ack_and_fetch": 1, "ack": 1, "fetch": 1}
        await producer.ack(second)
    assert producer.stats().acked == 20
    assert sum((await db.frontier("orders", "billing")).values()) == 20


class StalledReplyBackend(FlakyBackend):
    """A backend whose combined call lands its acks, then waits for ``reply`` before it
    returns (a reply still on its way back when the caller stops waiting)."""

    one_call_ack_and_fetch = True

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.landed = asyncio.Event()
        self.reply = asyncio.Event()

    async def ack_and_fetch(self, acks: Sequence[Lease], stream: str, group: str,
                            consumer_id: str, limit: int, lease_ms: int,
                            partitions: Sequence[int] | None
                            ) -> tuple[list[SettleResult], list[Lease]]:
        found = await super().ack_and_fetch(acks, stream, group, consumer_id, limit, lease_ms,
                                            partitions)
        self.landed.set()
        await self.reply.wait()
        return found


async def test_acks_of_a_combined_call_cancelled_under_way_are_settled_and_released(
        clock: ManualClock) -> None:
    backend = StalledReplyBackend(clock=clock)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders")
        await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(30)])
        producer = await Producer(rheo, "orders", "billing", max_demand=10).start()
        first = await producer.demand(10)
        waiting = await _waiting_for_room(producer)
        acking = asyncio.create_task(producer.ack(first))
        await asyncio.wait_for(backend.landed.wait(), 5)
        waiting.cancel()  # as a stopping runtime cancels its second fetch
        backend.reply.set()
        results = await asyncio.wait_for(acking, 5)
        assert [r.lease_id for r in results] == [x.lease_id for x in first]
        assert all(r.ok for r in results)
        assert not {e.lease.lease_id for e in producer.inflight.entries()} & {
            x.lease_id for x in first}
        assert producer.stats().acked == 10
        await producer.stop()
        assert sum((await rheo.frontier("orders", "billing")).values()) == 10


class SlowFetchBackend(FlakyBackend):
    """A backend whose ack_and_fetch is one call, and whose fetches take a while (as
    a round trip to a server does), recording the acks each combined call carried."""

    one_call_ack_and_fetch = True

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.carried: list[int] = []

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        for _ in range(3):  # the round trip: other tasks run meanwhile
            await asyncio.sleep(0)
        return await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)

    async def ack_and_fetch(self, acks: Sequence[Lease], stream: str, group: str,
                            consumer_id: str, limit: int, lease_ms: int,
                            partitions: Sequence[int] | None
                            ) -> tuple[list[SettleResult], list[Lease]]:
        self.carried.append(len(acks))
        return await super().ack_and_fetch(acks, stream, group, consumer_id, limit, lease_ms,
                                           partitions)


async def test_a_group_sends_each_batch_s_acks_with_the_next_fetch(
        clock: ManualClock, wait_until: WaitUntil) -> None:
    backend = SlowFetchBackend(clock=clock)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders")
        await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(100)])

        @consumer(stream="orders", group="billing", concurrency=10, max_demand=20,
                  fetch_size=10)
        async def handle(event: Event, context: Mapping[str, Any]) -> Any:
            return ACK

        async with handle.start(rheo) as group:
            await wait_until(lambda: group.stats.acked == 100, message="100 acks")
    # Each batch is handled while the next fetch is under way, and its acks wait
    # for that fetch to return: the call after it carries them.
    assert sum(backend.carried) >= 80, backend.carried
    assert backend.calls["ack"] - sum(1 for n in backend.carried if n) <= 2
    assert await rheo.frontier("orders", "billing") == {0: 100}

