"""Typed events: what validating event data into models costs a consumer group.

Each contender consumes the same backlog (memory backend, a ``Group`` with a handler
that reads ``event.data`` and acks, as ``benchmarks/sqlite.py``'s group does) from a
fresh instance, so that every one decodes the stored JSON text itself:

* ``dicts``: no models, ``event.data`` decoded to dicts (the baseline);
* ``msgspec``: ``models={"order.placed": Struct}`` (target: at least 1/1.2 of the
  dict rate);
* ``pydantic``: a pydantic v2 model (target: at least 1/2 of the dict rate);
* ``dataclass``: a dataclass (decoded by msgspec when it is installed).

Contenders alternate within one run; the median of the rounds is reported.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import msgspec
import pydantic

from benchmarks._common import Result, alternating_rounds, wait_until
from rheo_flow import ACK, NewEvent, Rheo, consumer

CONSUME_BATCH = 100
APPEND_BATCH = 1_000


class PlacedStruct(msgspec.Struct):
    """The benchmark event as a msgspec Struct."""

    order_id: int
    customer: str
    total: float
    items: list[str]
    paid: bool


class PlacedModel(pydantic.BaseModel):
    """The benchmark event as a pydantic model."""

    order_id: int
    customer: str
    total: float
    items: list[str]
    paid: bool


@dataclasses.dataclass(slots=True)
class PlacedData:
    """The benchmark event as a dataclass."""

    order_id: int
    customer: str
    total: float
    items: list[str]
    paid: bool


def _data(i: int) -> dict[str, Any]:
    return {"order_id": i, "customer": f"c-{i % 1000}", "total": i / 100,
            "items": ["book", "pen"], "paid": i % 2 == 0}


async def group_rate(events: int, model: type | None) -> float:
    """Events per second through a ``Group`` whose handler reads ``event.data``."""
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("bench")
        for start in range(0, events, APPEND_BATCH):
            await rheo.append("bench", [NewEvent("order.placed", _data(i))
                                        for i in range(start, min(events, start + APPEND_BATCH))])
        seen = 0

        @consumer(stream="bench", group="g", max_demand=4 * CONSUME_BATCH,
                  fetch_size=CONSUME_BATCH, concurrency=CONSUME_BATCH, poll_ms=50,
                  models=None if model is None else {"order.placed": model})
        async def handle(event: Any, context: Any) -> Any:
            nonlocal seen
            if event.data is not None:
                seen += 1
            return ACK

        started = time.perf_counter()
        async with handle.start(rheo) as group:
            await wait_until(lambda: group.stats.acked >= events, 300)
            elapsed = time.perf_counter() - started
        if seen != events or group.stats.invalid_payloads:
            raise RuntimeError(f"handled {seen} of {events} events "
                               f"({group.stats.invalid_payloads} invalid)")
    return events / elapsed


async def run(quick: bool) -> list[Result]:
    """Consume rates into models against the same events as dicts."""
    events = 30_000 if quick else 100_000
    rounds = 3 if quick else 5
    medians = await alternating_rounds(rounds, {
        "dicts": lambda: group_rate(events, None),
        "msgspec": lambda: group_rate(events, PlacedStruct),
        "pydantic": lambda: group_rate(events, PlacedModel),
        "dataclass": lambda: group_rate(events, PlacedData),
    })
    shape = (f"{events} events per contender, median of {rounds} alternating rounds, "
             f"memory backend, Group, handler reads event.data")
    base = medians["dicts"]
    return [
        Result("consume into dicts", "memory", base, "events/s", note=shape),
        Result.compared("consume into msgspec Structs vs dicts", "memory",
                        medians["msgspec"], "events/s", base,
                        note=f"{shape}; target ratio >= 0.83 (1/1.2)", baseline_name="dicts"),
        Result.compared("consume into pydantic models vs dicts", "memory",
                        medians["pydantic"], "events/s", base,
                        note=f"{shape}; target ratio >= 0.5", baseline_name="dicts"),
        Result.compared("consume into dataclasses vs dicts", "memory",
                        medians["dataclass"], "events/s", base, note=shape,
                        baseline_name="dicts"),
    ]
