"""The worker's drain on a stop signal, and the log line that counts what it did.

Every started runtime drains at once, handing back the leases no handler started,
within the grace period; then each is stopped (what was still running is cut short
and handed back). The counts come from the runtimes' producers' stats: leases
settled meanwhile, handed back unstarted, and cut short when the grace period ran out.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ..._runtime._group import Group
from ..._runtime._lifecycle import State
from ..._runtime._producer import Producer
from ..._runtime._producer_stats import ProducerStats
from ...pipeline import Pipeline

__all__ = ["DrainCounts", "Runtime", "describe", "drain_runtimes", "producer_of"]

log = logging.getLogger("rheo_flow.worker")

Runtime = Group | Pipeline
"""What a worker runs."""


def producer_of(runtime: Runtime) -> Producer:
    """The producer that fetches and settles for ``runtime``."""
    return runtime._producer if isinstance(runtime, Group) else runtime.producer


@dataclass(frozen=True, slots=True)
class DrainCounts:
    """What a drain did with the leases the runtimes held."""

    settled: int = 0
    """Leases acked, retried or rejected during the drain (by handlers that were running)."""
    handed_back: int = 0
    """Leases handed back unstarted (or after their handler finished the drain in time)."""
    cut_short: int = 0
    """Leases whose handler was cancelled when the grace period ran out, handed back."""

    def __str__(self) -> str:
        text = f"{self.settled} settled, {self.handed_back} handed back unstarted"
        if self.cut_short:
            text += f", {self.cut_short} cut short and handed back"
        return text


def describe(runtime: Runtime) -> str:
    """``group STREAM/GROUP`` or ``pipeline STREAM/GROUP``."""
    producer = producer_of(runtime)
    kind = "group" if isinstance(runtime, Group) else "pipeline"
    return f"{kind} {producer.stream}/{producer.group}"


def _stats(runtimes: list[Runtime]) -> list[ProducerStats]:
    return [producer_of(r).stats() for r in runtimes]


def _counts(start: list[ProducerStats], deadline: list[ProducerStats] | None,
            end: list[ProducerStats]) -> DrainCounts:
    def settles(s: ProducerStats) -> int:
        return s.acked + s.rejected + s.nacked - s.handed_back

    settled = sum(settles(b) - settles(a) for a, b in zip(start, end, strict=True))
    middle = end if deadline is None else deadline
    handed = sum(b.handed_back - a.handed_back for a, b in zip(start, middle, strict=True))
    cut = sum(b.handed_back - a.handed_back for a, b in zip(middle, end, strict=True))
    return DrainCounts(settled, handed, cut)


async def drain_runtimes(runtimes: list[Runtime], grace: float) -> bool:
    """Drain every running runtime, handing back what no handler started, within
    ``grace`` seconds; then stop them all (what is left is handed back) and log what
    was done. True when every drain was clean; nothing is logged when none had started
    (the error that stopped the start says what happened)."""
    started = [r for r in runtimes if r.state is State.RUNNING]
    if not started:
        await asyncio.gather(*(r.stop() for r in runtimes), return_exceptions=True)
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    start = _stats(started)
    at_deadline: list[list[ProducerStats]] = []
    # What the runtimes handed back until the deadline was unstarted; what they hand
    # back once it passed was cut short.
    timer = loop.call_at(deadline, lambda: at_deadline.append(_stats(started)))

    async def drain(runtime: Runtime) -> bool:
        return await runtime.drain(max(0.0, deadline - loop.time()), hand_back=True)

    results = await asyncio.gather(*(drain(r) for r in started), return_exceptions=True)
    for runtime, result in zip(started, results, strict=True):
        if isinstance(result, BaseException):
            log.error("draining %s failed: %s", describe(runtime), result)
    await asyncio.gather(*(r.stop() for r in runtimes), return_exceptions=True)
    timer.cancel()
    counts = _counts(start, at_deadline[0] if at_deadline else None, _stats(started))
    clean = all(result is True for result in results)
    if clean:
        log.info("drained: every lease settled or handed back (%s)", counts)
    else:
        log.warning("not drained within %.1fs: %s", grace, counts)
    return clean
