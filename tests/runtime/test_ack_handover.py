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


class OverlapBackend(SlowFetchBackend):
    """Records how many fetch calls were under way as each began, and what it returned."""

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.under_way = 0
        self.began: list[int] = []
        self.returned: list[int] = []
        self.held = 0
        """Leases fetched and not acked yet; its high water is :attr:`most_held`."""
        self.most_held = 0

    def _acked(self, results: Sequence[SettleResult]) -> None:
        self.held -= sum(1 for r in results if r.ok and not r.repeated)

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        # Also the acks of ack_and_fetch, which acks then fetches here.
        results = await super().ack(leases)
        self._acked(results)
        return results


    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        self.under_way += 1
        self.began.append(self.under_way)
        try:
            leases = await super().fetch(stream, group, consumer_id, limit, lease_ms,
                                         partitions)
        finally:
            self.under_way -= 1
        self.returned.append(len(leases))
        self.held += len(leases)
        self.most_held = max(self.most_held, self.held)
        return leases


async def test_a_group_keeps_two_fetches_under_way_while_a_backlog_lasts(
        clock: ManualClock, wait_until: WaitUntil) -> None:
    backend = OverlapBackend(clock=clock)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders")
        await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(200)])

        gate = asyncio.Event()

        @consumer(stream="orders", group="billing", concurrency=10, max_demand=25,
                  fetch_size=10)
        async def handle(event: Event, context: Mapping[str, Any]) -> Any:
            await gate.wait()
            return ACK

        async with handle.start(rheo) as group:
            # Handlers held: the fetches fill max_demand, and no more.
            await wait_until(lambda: backend.held >= 25, message="max_demand held")
            gate.set()
            await wait_until(lambda: group.stats.acked == 200, message="200 acks")
            drained = len(backend.began)
            # Idle now: the fetch waiting for appends is the only one.
            await rheo.append("orders", [NewEvent("order", {"n": 200})])
            await wait_until(lambda: group.stats.acked == 201, message="the late event")
    assert backend.most_held <= 25
    assert max(backend.began) == 2, backend.began
    assert backend.began[drained:], backend.began
    assert max(backend.began[drained:]) == 1, backend.began
    assert await rheo.frontier("orders", "billing") == {0: 201}
