"""What every benchmark suite returns, and small helpers shared by suites."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rheo_flow import Rheo

__all__ = ["Result"]


@dataclass(frozen=True, slots=True)
class Result:
    """One measured number, optionally compared with a baseline measured in the same run.

    ``ratio`` is ``value / baseline`` (``None`` without a baseline); ``baseline_name``
    names what the baseline measured (``"raw-redis-py+hiredis"``, ``"pgqueuer"``, ...).
    """

    name: str
    backend: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    note: str = ""
    baseline_name: str | None = None

    @classmethod
    def compared(cls, name: str, backend: str, value: float, unit: str, baseline: float,
                 note: str = "", *, baseline_name: str | None = None) -> Result:
        """A result with its ratio to ``baseline`` (named ``baseline_name``)."""
        return cls(name, backend, value, unit, baseline,
                   value / baseline if baseline else None, note, baseline_name)

    def as_json(self) -> dict[str, Any]:
        """The JSON object printed by ``--json`` (``note`` and ``baseline_name`` only
        when set)."""
        data = asdict(self)
        for optional in ("note", "baseline_name"):
            if not data[optional]:
                del data[optional]
        return data


async def alternating_rounds(rounds: int, runners: dict[str, Callable[[], Awaitable[float]]]
                             ) -> dict[str, float]:
    """Run every runner ``rounds`` times, interleaved; the median of each.

    Alternating the contenders makes a noisy neighbour on the machine hit them alike.
    """
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            samples[name].append(await runner())
    return {name: statistics.median(values) for name, values in samples.items()}


def payload(i: int) -> dict[str, Any]:
    """The data of the i-th benchmark event (the same for every contender)."""
    return {"n": i, "kind": "bench", "tags": ["a", "b"]}


async def pipeline_rate(rheo: Rheo, stream: str, group: str, events: int, *, demand: int,
                        batch: int, max_inflight: int | None = None,
                        fetch_size: int | None = None) -> float:
    """Events per second through a pass-through :class:`~rheo_flow.pipeline.Pipeline` on
    a prepared backlog of ``events``: 4 processors of ``demand``, one batcher of
    ``batch`` (2 batch tasks, 50 ms timeout), ``fetch_size`` as given and
    ``max_inflight`` as given, else the pipeline's default (room for every
    processor's demand twice over and three batches: docs/pipeline.md); timed until
    the last ack."""
    from rheo_flow.pipeline import Batcher, Pipeline, Processors

    pipeline = Pipeline(
        rheo, stream=stream, group=group, handler=_PassThrough(),
        processors=Processors(concurrency=4, max_demand=demand),
        batchers={"default": Batcher(batch_size=batch, batch_timeout=0.05, concurrency=2)},
        max_inflight=max_inflight, fetch_size=fetch_size, poll_ms=50,
    )
    started = time.perf_counter()
    async with pipeline:
        await wait_until(lambda: pipeline.stats().acked >= events, 300)
        elapsed = time.perf_counter() - started
    return events / elapsed


class _PassThrough:
    """A pipeline handler that passes every message and batch through."""

    async def handle_message(self, processor: str, message: Any, context: Any) -> Any:
        return message

    async def handle_batch(self, batcher: str, messages: list[Any], batch_info: Any,
                           context: Any) -> list[Any]:
        return messages


async def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    """Wait for ``predicate`` to hold, failing the run after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark run did not finish in time")
        await asyncio.sleep(0.002)


async def append_rate(rheo: Rheo, stream: str, events: int, batch: int) -> float:
    """Events per second through ``Rheo.append`` of ``batch``-event batches of
    :func:`payload` data."""
    from rheo_flow import NewEvent

    started = time.perf_counter()
    for start in range(0, events, batch):
        await rheo.append(stream, [NewEvent("bench.event", payload(i))
                                   for i in range(start, min(events, start + batch))])
    return events / (time.perf_counter() - started)


async def backend_loop_rate(rheo: Rheo, stream: str, group: str, events: int, *,
                            limit: int, lease_ms: int = 30_000) -> float:
    """Events per second of the backend alone, with no runtime around it: one loop of
    ``Backend.ack_and_fetch`` (the last batch's acks and the next fetch, one call, as a
    ``Group`` makes them), a no-op handler awaited inline per lease. What a ``Group``
    on that backend cannot beat by much: the backend's own cost per event, plus the
    objects every consumer gets. Creates ``group`` (at the stream's start) first; raises
    if a fetch finds nothing while fewer than ``events`` were acked."""
    from rheo_flow import ACK

    async def handler(event: Any, context: Any) -> Any:
        return ACK

    backend = rheo.backend
    await rheo.create_group(stream, group)
    context: dict[str, Any] = {}
    started = time.perf_counter()
    done = 0
    acks: list[Any] = []
    while done < events:
        results, leases = await backend.ack_and_fetch(acks, stream, group, "loop", limit,
                                                      lease_ms, None)
        done += sum(1 for result in results if result.ok)
        for lease in leases:
            await handler(lease.event, context)
        if not leases and not acks and done < events:
            raise RuntimeError(f"the backend loop found nothing more after {done} acks")
        acks = leases
    return events / (time.perf_counter() - started)
