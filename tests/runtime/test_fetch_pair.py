"""Two fetches under way while a backlog lasts (_runtime/_fetch_pair.py): a Group and a
Pipeline overlap their fetch calls, max_demand still bounds what they hold, and an idle
consumer polls once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rheo_flow import ACK, Event, Lease, ManualClock, NewEvent, Rheo, SettleResult, consumer
from rheo_flow.pipeline import Message, Pipeline, PipelineHandler, Processors
from test_ack_handover import SlowFetchBackend

WaitUntil = Callable[..., Awaitable[None]]


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


async def _orders(rheo: Rheo, count: int) -> None:
    """The stream ``orders`` (one partition) with ``count`` events."""
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(count)])


def _two_then_one(backend: OverlapBackend, drained: int, *, bound: int) -> None:
    """Two fetches overlapped while the backlog lasted, at most ``bound`` leases were
    held, and from call ``drained`` on (idle) one fetch went out at a time."""
    assert backend.most_held <= bound
    assert max(backend.began) == 2, backend.began
    assert backend.began[drained:], backend.began
    assert max(backend.began[drained:]) == 1, backend.began


async def test_a_group_keeps_two_fetches_under_way_while_a_backlog_lasts(
        clock: ManualClock, wait_until: WaitUntil) -> None:
    backend = OverlapBackend(clock=clock)
    async with Rheo(backend) as rheo:
        await _orders(rheo, 200)

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
    _two_then_one(backend, drained, bound=25)
    assert await rheo.frontier("orders", "billing") == {0: 201}


class Gated(PipelineHandler):
    """Holds every message until :attr:`gate` opens."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        await self.gate.wait()
        return message


async def test_a_pipeline_keeps_two_fetches_under_way_while_a_backlog_lasts(
        clock: ManualClock, wait_until: WaitUntil) -> None:
    backend = OverlapBackend(clock=clock)
    async with Rheo(backend) as rheo:
        await _orders(rheo, 200)
        handler = Gated()
        pipeline = Pipeline(rheo, stream="orders", group="billing", handler=handler,
                            max_inflight=25, fetch_size=10,
                            processors=Processors(concurrency=10, max_demand=1))
        async with pipeline:
            await wait_until(lambda: backend.held >= 25, message="max_inflight held")
            handler.gate.set()
            await wait_until(lambda: pipeline.stats().acked == 200, message="200 acks")
            drained = len(backend.began)
            await rheo.append("orders", [NewEvent("order", {"n": 200})])
            await wait_until(lambda: pipeline.stats().acked == 201, message="the late event")
    _two_then_one(backend, drained, bound=25)
    assert await rheo.frontier("orders", "billing") == {0: 201}


class Passing(PipelineHandler):
    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message


async def test_a_pipeline_s_acks_ride_on_its_fetches(
        clock: ManualClock, wait_until: WaitUntil) -> None:
    backend = OverlapBackend(clock=clock)
    async with Rheo(backend) as rheo:
        await _orders(rheo, 300)
        pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Passing(),
                            max_inflight=40, fetch_size=10,
                            processors=Processors(concurrency=2, max_demand=5))
        async with pipeline:
            await wait_until(lambda: pipeline.stats().acked == 300, message="300 acks")
    # The processors' acks wait for the next fetch instead of a call of their own.
    assert sum(backend.carried) >= 240, backend.carried
    assert await rheo.frontier("orders", "billing") == {0: 300}


class StallingBackend(SlowFetchBackend):
    """Its fetches stall once ``stall_after`` leases went out, until :attr:`release`."""

    def __init__(self, *, clock: ManualClock, stall_after: int) -> None:
        super().__init__(clock=clock)
        self.stall_after = stall_after
        self.fetched = 0
        self.stalled = asyncio.Event()
        self.release = asyncio.Event()

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        if self.fetched >= self.stall_after and not self.release.is_set():
            self.stalled.set()
            await self.release.wait()
        leases = await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)
        self.fetched += len(leases)
        return leases


async def test_a_stopped_pipeline_settles_its_queued_acks_before_handing_back(
        clock: ManualClock, wait_until: WaitUntil) -> None:
    backend = StallingBackend(clock=clock, stall_after=30)
    async with Rheo(backend) as rheo:
        await _orders(rheo, 100)
        pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Passing(),
                            max_inflight=40, fetch_size=10,
                            processors=Processors(concurrency=2, max_demand=5))
        queued: list[int] = []
        acknowledger = pipeline._acknowledger
        ack = acknowledger._ack

        async def spy(messages: list[Message]) -> None:
            queued.extend(m.sequence for m in messages)
            await ack(messages)

        acknowledger._ack = spy  # type: ignore[method-assign]
        await pipeline.start()
        # Every fetched message handled while a fetch stalls: their acks wait for it.
        await wait_until(lambda: backend.stalled.is_set() and len(queued) == backend.fetched,
                         message="every fetched message handled during a stalled fetch")
        await pipeline.stop()
        done = backend.fetched
        backend.release.set()
        again = await rheo.fetch("orders", "billing", limit=100)
    assert sorted(queued) == list(range(1, done + 1))
    # What the processors finished was acked on stop, not handed back.
    assert sorted(lease.sequence for lease in again) == list(range(done + 1, 101))
    assert await rheo.frontier("orders", "billing") == {0: done}
