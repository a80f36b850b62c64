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
        await rheo.create_stream("orders")
        await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(200)])
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
    assert backend.most_held <= 25
    assert max(backend.began) == 2, backend.began
    assert backend.began[drained:], backend.began
    assert max(backend.began[drained:]) == 1, backend.began
    assert await rheo.frontier("orders", "billing") == {0: 201}
