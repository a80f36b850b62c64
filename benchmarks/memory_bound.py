"""Suite ``memory``: the pipeline's memory is bounded by ``max_inflight`` and batch sizes,
not by the backlog.

For each backlog size, the backlog is appended first, then ``tracemalloc`` starts
and a pipeline consumes everything while a sampler records the inflight count,
the messages inside processors and batchers, and (a few times per run) the
memory allocated by the pipeline's own code (messages, queues, batches,
inflight entries: files of ``rheo_flow/pipeline`` plus the producer and the
inflight set). The backend's own state (events, per-group deliveries) grows
with the backlog by design and is not counted. Peaks are reported against the
configured bound; pipeline memory at each backlog against the smallest one
(a ratio near 1 means it does not grow with the backlog).
"""

from __future__ import annotations

import asyncio
import tracemalloc
from dataclasses import dataclass

from rheo_flow.pipeline import Batcher, Pipeline, Processors

from ._common import Result
from .pipeline import NoOp, backlog

PROCESSORS = 4
MAX_DEMAND = 10
BATCH_SIZE = 100
BATCH_CONCURRENCY = 2
MAX_INFLIGHT = 500
OWN_FILES = ("*/rheo_flow/pipeline/*", "*/rheo_flow/_producer.py", "*/rheo_flow/_inflight.py")


@dataclass
class Peaks:
    """What the sampler saw during one run."""

    inflight: int = 0
    in_processors: int = 0
    in_batchers: int = 0
    own_bytes: int = 0
    samples: int = 0
    snapshots: int = 0


def own_bytes() -> int:
    """Bytes currently allocated by the pipeline's own code."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, pattern) for pattern in OWN_FILES])
    return sum(stat.size for stat in snapshot.statistics("filename"))


async def consume(events: int) -> Peaks:
    """Run a pipeline over a backlog of ``events`` and sample it until it is consumed."""
    rheo = await backlog(events)
    peaks = Peaks()
    tracemalloc.start()
    try:
        pipeline = Pipeline(
            rheo, stream="bench", group="memory", handler=NoOp(),
            processors=Processors(concurrency=PROCESSORS, max_demand=MAX_DEMAND),
            batchers={"default": Batcher(batch_size=BATCH_SIZE, batch_timeout=1.0,
                                         concurrency=BATCH_CONCURRENCY)},
            max_inflight=MAX_INFLIGHT,
        )
        await pipeline.start()
        snapshot_every = max(1, events // 5)
        next_snapshot = snapshot_every
        while True:
            stats = pipeline.stats()
            peaks.samples += 1
            peaks.inflight = max(peaks.inflight, stats.inflight)
            peaks.in_processors = max(peaks.in_processors, stats.in_processors)
            peaks.in_batchers = max(peaks.in_batchers, stats.in_batchers)
            if stats.acked >= next_snapshot:
                peaks.own_bytes = max(peaks.own_bytes, own_bytes())
                peaks.snapshots += 1
                next_snapshot += snapshot_every
            if stats.acked >= events:
                break
            await asyncio.sleep(0.005)
        if not await pipeline.drain(10):
            raise RuntimeError("pipeline did not drain")
        final = pipeline.stats()
        peaks.inflight = max(peaks.inflight, final.peak_inflight)
        peaks.in_processors = max(peaks.in_processors, final.peak_in_processors)
        peaks.in_batchers = max(peaks.in_batchers, final.peak_in_batchers)
    finally:
        tracemalloc.stop()
        await rheo.close()
    return peaks


async def run(quick: bool) -> list[Result]:
    """Peaks per backlog size against the configured bounds."""
    sizes = [10_000, 40_000] if quick else [50_000, 200_000]
    results: list[Result] = []
    first_bytes: float | None = None
    for events in sizes:
        peaks = await consume(events)
        note = f"backlog {events}, {peaks.samples} samples"
        results.append(Result.compared(f"peak inflight @{events}", "memory", peaks.inflight,
                                       "leases", MAX_INFLIGHT, "bound: max_inflight"))
        results.append(Result.compared(f"peak in processors @{events}", "memory",
                                       peaks.in_processors, "messages", MAX_INFLIGHT,
                                       "bound: max_inflight"))
        results.append(Result.compared(f"peak in batchers @{events}", "memory",
                                       peaks.in_batchers, "messages", MAX_INFLIGHT,
                                       "bound: max_inflight"))
        kib = peaks.own_bytes / 1024
        if first_bytes is None:
            first_bytes = kib
            results.append(Result(f"pipeline memory @{events}", "memory", kib, "KiB",
                                  note=f"{note}, {peaks.snapshots} snapshots"))
        else:
            results.append(Result.compared(
                f"pipeline memory @{events}", "memory", kib, "KiB", first_bytes,
                f"{note}, {peaks.snapshots} snapshots; baseline: backlog {sizes[0]}"))
    return results
