"""The Redis rows of suite ``scale``: memory per retained event, and what one big
append costs every other client of the server.

* **memory per retained event** — 20,000 events of about 100 bytes of data are
  appended to a stream of 4 partitions and consumed and acked by one group; the
  bytes per event are the sum of ``MEMORY USAGE`` over the namespace's keys,
  against a plain ``XADD`` of the same type and data into one stream.
* **PING during a 10 MB append** — a thread pings the server on a connection of
  its own, back to back, while one event of 10 MB of data is appended (under a
  raised ``max_event_bytes``); the worst PING round trip, against the worst one
  during a plain ``XADD`` of the same bytes (the engine's own floor).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Awaitable
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis

from rheo_flow import NewEvent, Rheo

from ._common import Result

RETAINED = 20_000
BIG_BYTES = 10 * 2**20


def _url() -> str:
    from .scale import REDIS_URL

    return REDIS_URL.split("?")[0]


def _data(i: int) -> dict[str, object]:
    """About 100 bytes of JSON."""
    return {"n": i, "order": f"ord-{i:08d}", "note": "x" * 60}


async def _namespace_bytes(client: aioredis.Redis, prefix: str) -> int:
    total = 0
    async for key in client.scan_iter(match=f"*{prefix}*", count=1000):
        total += await client.memory_usage(key, samples=0) or 0
    return total


async def _unlink(client: aioredis.Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=f"*{prefix}*", count=1000)]
    for start in range(0, len(keys), 1000):
        await client.unlink(*keys[start:start + 1000])


async def memory_row() -> Result:
    """Bytes per retained event: ours against a plain XADD of the same fields."""
    tag = f"scalemem_{uuid.uuid4().hex[:8]}"
    client = aioredis.from_url(_url())
    rheo = await Rheo(f"{_url()}?prefix={tag}").open()
    try:
        await rheo.create_stream("retained", partitions=4)
        for start in range(0, RETAINED, 1_000):
            await rheo.append("retained", [NewEvent("order.placed", _data(i))
                                           for i in range(start, start + 1_000)])
        consumed = 0
        while consumed < RETAINED:
            leases = await rheo.fetch("retained", "g", limit=1_000)
            await rheo.ack(leases)
            consumed += len(leases)
        ours = await _namespace_bytes(client, tag)
        raw_key = f"{tag}-raw"
        pipe = client.pipeline(transaction=False)
        for i in range(RETAINED):
            pipe.xadd(raw_key, {"type": "order.placed", "data": orjson.dumps(_data(i))})
        await pipe.execute()
        raw = await client.memory_usage(raw_key, samples=0) or 0
    finally:
        await rheo.close()
        await _unlink(client, f"{tag}")
        await client.aclose()
    return Result.compared("bytes per retained 100-byte event", "redis", round(ours / RETAINED),
                           "B", round(raw / RETAINED), baseline_name="plain XADD",
                           note="target: at most 300 B per event")


class _Pinger(threading.Thread):
    """Pings back to back on a connection of its own until stopped; keeps the worst."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(_url())
        for _ in range(10):
            self.client.ping()
        self.stopping = threading.Event()
        self.worst = 0.0
        self.pings = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.perf_counter()
            self.client.ping()
            self.worst = max(self.worst, time.perf_counter() - started)
            self.pings += 1

    def finish(self) -> float:
        self.stopping.set()
        self.join()
        self.client.close()
        return self.worst


async def _worst_ping(append: Awaitable[Any]) -> float:
    pinger = _Pinger()
    pinger.start()
    await append
    return pinger.finish()


async def ping_row(rounds: int) -> Result:
    """The worst concurrent PING during a 10 MB append: ours against a plain XADD."""
    tag = f"scalebig_{uuid.uuid4().hex[:8]}"
    client = aioredis.from_url(_url())
    rheo = await Rheo(f"{_url()}?prefix={tag}", max_event_bytes=16 * 2**20).open()
    big = {"blob": "y" * BIG_BYTES}
    encoded = orjson.dumps(big)
    ours: list[float] = []
    raw: list[float] = []
    try:
        await rheo.create_stream("big")
        for i in range(rounds + 1):
            ours.append(await _worst_ping(rheo.append("big", NewEvent("big", big))))
            raw.append(await _worst_ping(client.xadd(f"{tag}-raw", {"type": "big",
                                                                   "data": encoded})))
            if i == 0:
                ours.clear()
                raw.clear()
    finally:
        await rheo.close()
        await _unlink(client, f"{tag}")
        await client.aclose()
    return Result.compared("worst PING during a 10 MB append", "redis",
                           round(statistics.median(ours) * 1000, 2), "ms",
                           round(statistics.median(raw) * 1000, 2), baseline_name="plain XADD",
                           note="target: at most 50 ms")


async def redis_rows(rounds: int) -> list[Result]:
    """The Redis-only rows."""
    return [await memory_row(), await ping_row(rounds)]
