"""Helpers shared by the sink tests: a backlog of order events and a pipeline into a sink."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rheo_flow import NewEvent, Rheo
from rheo_flow.pipeline import Pipeline, Processors
from rheo_flow.sinks import Sink, SinkHandler, sink_batcher

WaitUntil = Callable[..., Awaitable[None]]


async def backlog(rheo: Rheo, count: int, *, partitions: int = 4,
                  poison: dict[int, Any] | None = None) -> list[str]:
    """Append ``count`` order events (amount ``poison[i]`` for the poison ones); their ids."""
    await rheo.create_stream("orders", partitions=partitions)
    ids: list[str] = []
    for start in range(0, count, 10_000):
        events = [
            NewEvent("order.placed", {"n": i, "customer": f"c{i % 7}",
                                      "amount": (poison or {}).get(i, i)},
                     id=f"order-{i}", key=f"k{i % 97}")
            for i in range(start, min(count, start + 10_000))
        ]
        ids += [e.id for e in await rheo.append("orders", events)]
    return ids


async def run_pipeline(rheo: Rheo, sink: Sink, expected: int, wait_until: WaitUntil,
                       *, rows: int) -> Pipeline:
    """Run a pipeline into ``sink`` until ``expected`` deliveries are settled; drained."""
    pipeline = Pipeline(rheo, stream="orders", group="warehouse", handler=SinkHandler(sink),
                        processors=Processors(concurrency=2),
                        batchers={"default": sink_batcher(max_rows=rows, max_age=0.2,
                                                          concurrency=2)})
    async with pipeline:
        async def settled() -> bool:
            frontier = await rheo.frontier("orders", "warehouse")
            return sum(frontier.values()) >= expected

        await wait_until(settled, timeout=120, message="every delivery settled")
    return pipeline
