"""Acks handed over to the next fetch: a producer waiting for room acks and fetches at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from _doubles import FlakyBackend
from rheo_flow import Lease, ManualClock, NewEvent, Producer, Rheo


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
