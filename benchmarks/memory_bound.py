"""Suite ``memory``: the pipeline's memory is bounded by ``max_inflight`` and batch sizes,
not by the backlog.

For each backlog size, the backlog is appended first, then ``tracemalloc`` starts
and a pipeline consumes everything into a sink that takes about a millisecond per
batch. Its exact peak counters give the most
leases inflight and the most messages inside processors and batchers; a few
times per run, from inside ``handle_batch`` (when the pipeline holds a full
load), a snapshot measures the memory allocated by the pipeline's own code
(messages, queues, batches, inflight entries: files of ``rheo_flow/pipeline``
plus the producer and the inflight set). The backend's own state (events,
per-group deliveries) grows with the backlog by design and is not counted.
Peaks are reported against the configured bound; pipeline memory at each
backlog against the smallest one (a ratio near 1: it does not grow with the
backlog).
"""

from __future__ import annotations

import asyncio
import tracemalloc
from dataclasses import dataclass
from typing import Any

from rheo_flow.pipeline import Batcher, BatchInfo, Message, Pipeline, Processors

from ._common import Result
from .pipeline import NoOp, backlog

PROCESSORS = 4
MAX_DEMAND = 10
BATCH_SIZE = 100
BATCH_CONCURRENCY = 2
MAX_INFLIGHT = 500
SNAPSHOTS = 5
OWN_FILES = ("*/rheo_flow/pipeline/*", "*/rheo_flow/_runtime/_producer.py",
             "*/rheo_flow/_runtime/_inflight.py")


@dataclass
class Peaks:
    """What one run saw."""

    inflight: int = 0
    in_processors: int = 0
    in_batchers: int = 0
    own_bytes: int = 0
    held_at_peak: int = 0
    """Inflight leases when the largest snapshot was taken."""
    snapshots: int = 0


def own_bytes() -> int:
    """Bytes currently allocated by the pipeline's own code."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, pattern) for pattern in OWN_FILES])
    return sum(stat.size for stat in snapshot.statistics("filename"))


class Measuring(NoOp):
    """A sink taking about a millisecond per batch (so the stages fill up while it
    writes); from inside ``handle_batch``, about every ``every`` messages and while the
    pipeline is nearly full, it takes a snapshot."""

    def __init__(self, expected: int, peaks: Peaks) -> None:
        super().__init__(expected)
        self.peaks = peaks
        self.every = max(BATCH_SIZE, expected // SNAPSHOTS)
        self.next_at = self.every
        self.pipeline: Pipeline | None = None

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        await asyncio.sleep(0.001)  # the sink write
        pipeline = self.pipeline
        if (self.batched + len(messages) >= self.next_at and pipeline is not None
                and len(pipeline.producer.inflight) >= MAX_INFLIGHT * 0.9):
            self.next_at += self.every
            size = own_bytes()
            self.peaks.snapshots += 1
            if size > self.peaks.own_bytes:
                self.peaks.own_bytes = size
                self.peaks.held_at_peak = len(pipeline.producer.inflight)
        return await super().handle_batch(batcher, messages, batch_info, context)


async def consume(events: int) -> Peaks:
    """Run a pipeline over a backlog of ``events`` until it is consumed."""
    rheo = await backlog(events)
    peaks = Peaks()
    tracemalloc.start()
    try:
        handler = Measuring(events, peaks)
        pipeline = Pipeline(
            rheo, stream="bench", group="memory", handler=handler,
            processors=Processors(concurrency=PROCESSORS, max_demand=MAX_DEMAND),
            batchers={"default": Batcher(batch_size=BATCH_SIZE, batch_timeout=1.0,
                                         concurrency=BATCH_CONCURRENCY)},
            max_inflight=MAX_INFLIGHT,
        )
        handler.pipeline = pipeline
        async with pipeline:
            await handler.done.wait()
        stats = pipeline.stats()
        if stats.acked != events:
            raise RuntimeError("not every event was acked")
        peaks.inflight = stats.peak_inflight
        peaks.in_processors = stats.peak_in_processors
        peaks.in_batchers = stats.peak_in_batchers
    finally:
        tracemalloc.stop()
        await rheo.close()
    return peaks


async def run(quick: bool) -> list[Result]:
    """Peaks per backlog size against the configured bounds."""
    sizes = [10_000, 40_000] if quick else [50_000, 200_000]
    results: list[Result] = []
    first_kib: float | None = None
    bound = "bound: max_inflight"
    for events in sizes:
        peaks = await consume(events)
        results += [
            Result.compared(f"peak inflight @{events}", "memory", peaks.inflight, "leases",
                            MAX_INFLIGHT, bound),
            Result.compared(f"peak in processors @{events}", "memory", peaks.in_processors,
                            "messages", MAX_INFLIGHT, bound),
            Result.compared(f"peak in batchers @{events}", "memory", peaks.in_batchers,
                            "messages", MAX_INFLIGHT, bound),
        ]
        kib = peaks.own_bytes / 1024
        note = (f"largest of {peaks.snapshots} snapshots, taken with {peaks.held_at_peak} "
                f"leases inflight")
        if first_kib is None:
            first_kib = kib
            results.append(Result(f"pipeline memory @{events}", "memory", kib, "KiB",
                                  note=note))
        else:
            results.append(Result.compared(f"pipeline memory @{events}", "memory", kib, "KiB",
                                           first_kib, f"{note}; baseline: @{sizes[0]}"))
    return results
