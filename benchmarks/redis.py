"""Suite ``redis``: the Redis backend against raw redis-py (with hiredis) and saq, in one run.

* **consume + ack throughput** — a backlog is consumed and acknowledged by a
  :class:`rheo_flow.Group` (no-op ``Consumer``, ``max_demand`` 500, concurrency
  10) and by the fastest plain loop a redis-py user would write: ``XREADGROUP
  COUNT 500`` and one ``XACK`` per batch, the ack of one batch and the read of
  the next pipelined in one round trip (``transaction=False``), on redis-py's
  hiredis parser (no fencing, no leases, no frontier). A
  :class:`~rheo_flow.pipeline.Pipeline` with the same 500 leases inflight (4
  processors, one batcher of 250) runs beside them, and the Group is compared
  with it. saq (no-op jobs, 10 workers) is the peer.
* **append throughput at batch 1000** — ``Rheo.append`` of 1000-event batches
  against one ``transaction=False`` pipeline of 1000 ``XADD`` per batch (the
  type and the orjson-encoded data per entry; Redis makes the entry id).
* **append -> handler latency** — at a light steady load (one event every
  5 ms), the time from just before an append until the handler runs, for
  rheo_flow (idle groups block on ``XREAD``: push wake-ups) and for a raw
  ``XREADGROUP BLOCK`` loop. p50 and p99 in milliseconds.

Throughput rounds alternate between the contenders on fresh keys; medians are
reported. The suite refuses to run without hiredis (``redis[hiredis]``): the
pure-Python parser would make the raw loop several times slower. The server is
``RHEO_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Every key the suite
writes is deleted when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import redis.asyncio as aioredis
import redis.utils

from rheo_flow import ACK, Consumer, Event, NewEvent, Rheo
from rheo_flow.backends import RedisBackend

from ._common import Result, append_rate, backend_loop_rate, payload, pipeline_rate

URL = os.environ.get("RHEO_REDIS_URL") or "redis://127.0.0.1:6379/0"
MAX_DEMAND = 500
CONCURRENCY = 10
RAW_COUNT = 500
APPEND_BATCH = 1_000
SAQ_CONCURRENCY = 10
APPEND_CHUNK = 5_000
RAW = "raw-redis-py+hiredis"
LATENCY_INTERVAL_S = 0.005


# rheo_flow ---------------------------------------------------------------------


class Counting(Consumer):
    """A no-op consumer that sets ``done`` once ``expected`` events were handled."""

    stream = "bench"
    group = "bench"
    max_demand = MAX_DEMAND
    concurrency = CONCURRENCY

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.handled = 0
        self.done = asyncio.Event()

    async def handle_event(self, event: Event, context: Any) -> Any:
        self.handled += 1
        if self.handled >= self.expected:
            self.done.set()
        return ACK


@asynccontextmanager
async def _consumed(events: int) -> AsyncIterator[Rheo]:
    """rheo_flow on a fresh key prefix holding a backlog of ``events``; on exit, checks
    that group ``bench`` settled all of them, then deletes every key."""
    backend = RedisBackend.from_url(URL, prefix=f"rheo-bench-{uuid.uuid4().hex[:10]}")
    try:
        async with Rheo(backend) as rheo:
            await rheo.create_stream("bench")
            for start in range(0, events, APPEND_CHUNK):
                await rheo.append("bench", [
                    NewEvent("bench.event", payload(i))
                    for i in range(start, min(events, start + APPEND_CHUNK))
                ])
            yield rheo
            if sum((await rheo.lag("bench", "bench")).values()) != 0:
                raise RuntimeError("rheo_flow left events unsettled")
    finally:
        await backend.drop_all()
        await backend.close()


async def rheo_consume(events: int) -> float:
    """Events per second consumed and acked through a Group on a fresh prefix."""
    async with _consumed(events) as rheo:
        consumer = Counting(events)
        started = time.perf_counter()
        async with consumer.start(rheo) as group:
            await consumer.done.wait()
            # The measurement ends when the last ack has landed.
            await group.drain(timeout=60)
            elapsed = time.perf_counter() - started
    return events / elapsed


async def rheo_pipeline(events: int) -> float:
    """Events per second through a ``Pipeline`` (4 processors, one batcher of
    ``MAX_DEMAND // 2``; at most ``MAX_DEMAND`` leases inflight, as the Group: here its
    default ``max_inflight``, 1,750, made it about 20% slower)."""
    async with _consumed(events) as rheo:
        return await pipeline_rate(rheo, "bench", "bench", events, demand=MAX_DEMAND // 4,
                                   batch=MAX_DEMAND // 2, max_inflight=MAX_DEMAND)


async def rheo_backend_loop(events: int) -> float:
    """Events per second of the backend alone: ``ack_and_fetch`` of ``RAW_COUNT`` in a
    loop, handler inline (no runtime)."""
    async with _consumed(events) as rheo:
        return await backend_loop_rate(rheo, "bench", "bench", events, limit=RAW_COUNT)


# raw redis-py ------------------------------------------------------------------


def _entry(i: int) -> dict[str, bytes | str]:
    """What a plain user stores per entry: a type and the JSON data (Redis makes the id)."""
    return {"type": "bench.event", "data": orjson.dumps(payload(i))}


async def raw_consume(events: int) -> float:
    """Events per second through XREADGROUP COUNT 500 + one XACK per batch, the ack of
    each batch pipelined with the next read (one round trip per batch)."""
    client = aioredis.Redis.from_url(URL)
    key = f"rheo-bench-raw-{uuid.uuid4().hex[:10]}"
    try:
        for start in range(0, events, APPEND_CHUNK):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(events, start + APPEND_CHUNK)):
                pipe.xadd(key, _entry(i))
            await pipe.execute()
        await client.xgroup_create(key, "bench", "0")
        started = time.perf_counter()
        reply: Any = await client.xreadgroup("bench", "raw", {key: ">"}, count=RAW_COUNT)
        done = 0
        while True:
            ids = [entry_id for entry_id, _ in reply[0][1]]
            done += len(ids)
            if done >= events:
                await client.xack(key, "bench", *ids)
                break
            pipe = client.pipeline(transaction=False)
            pipe.xack(key, "bench", *ids)
            pipe.xreadgroup("bench", "raw", {key: ">"}, count=RAW_COUNT)
            _, reply = await pipe.execute()
        rate = events / (time.perf_counter() - started)
        if (await client.xpending(key, "bench"))["pending"]:
            raise RuntimeError("the raw loop left entries unacked")
        return rate
    finally:
        await client.delete(key)
        await client.aclose()


async def raw_append(events: int) -> float:
    """Events per second of one ``transaction=False`` pipeline of XADD per batch."""
    client = aioredis.Redis.from_url(URL)
    key = f"rheo-bench-raw-{uuid.uuid4().hex[:10]}"
    try:
        started = time.perf_counter()
        for start in range(0, events, APPEND_BATCH):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(events, start + APPEND_BATCH)):
                pipe.xadd(key, _entry(i))
            await pipe.execute()
        rate = events / (time.perf_counter() - started)
        if await client.xlen(key) != events:
            raise RuntimeError("the raw pipeline lost entries")
        return rate
    finally:
        await client.delete(key)
        await client.aclose()


async def rheo_append(events: int) -> float:
    """Events per second through ``Rheo.append`` of 1000-event batches."""
    backend = RedisBackend.from_url(URL, prefix=f"rheo-bench-{uuid.uuid4().hex[:10]}")
    try:
        async with Rheo(backend) as rheo:
            await rheo.create_stream("bench")
            return await append_rate(rheo, "bench", events, APPEND_BATCH)
    finally:
        await backend.drop_all()
        await backend.close()


# saq ---------------------------------------------------------------------------


async def saq_consume(jobs: int) -> tuple[float, str]:
    """Jobs per second processed by saq workers (no-op jobs), and saq's version."""
    import saq
    from saq import Queue, Status, Worker

    name = f"rheo-bench-{uuid.uuid4().hex[:10]}"
    queue = Queue.from_url(URL, name=name)
    finished = 0
    all_done = asyncio.Event()

    async def noop(ctx: Any) -> None:
        return None

    failed = 0

    async def after(ctx: Any) -> None:
        nonlocal finished, failed
        finished += 1
        if ctx["job"].status != Status.COMPLETE:
            failed += 1
        if finished >= jobs:
            all_done.set()

    await queue.connect()
    try:
        for start in range(0, jobs, 500):
            await asyncio.gather(*(queue.enqueue("noop") for _ in range(start,
                                                                       min(jobs, start + 500))))
        worker = Worker(queue, functions=[("noop", noop)], concurrency=SAQ_CONCURRENCY,
                        after_process=after, shutdown_grace_period_s=1)
        started = time.perf_counter()
        task = asyncio.create_task(worker.start())
        await all_done.wait()
        rate = jobs / (time.perf_counter() - started)
        if failed:
            raise RuntimeError(f"{failed} saq jobs did not complete")
        await worker.stop()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return rate, saq.__version__
    finally:
        client = aioredis.Redis.from_url(URL)
        for pattern in (f"saq:{name}*", f"saq:job:{name}:*"):
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            for i in range(0, len(keys), 500):
                await client.unlink(*keys[i:i + 500])
        await client.aclose()
        await queue.disconnect()


# latency -----------------------------------------------------------------------


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 of the samples (milliseconds)."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99


class Timing(Consumer):
    """Records, per event, the time from the append call until the handler runs."""

    stream = "latency"
    group = "latency"
    max_demand = 100
    concurrency = 4

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.samples: list[float] = []
        self.done = asyncio.Event()

    async def handle_event(self, event: Event, context: Any) -> Any:
        self.samples.append((time.perf_counter() - event.data["t"]) * 1000)
        if len(self.samples) >= self.expected:
            self.done.set()
        return ACK


async def rheo_latency(count: int) -> tuple[float, float]:
    """Append -> handler p50 and p99 (ms) through an idle Group woken by appends."""
    prefix = f"rheo-bench-{uuid.uuid4().hex[:10]}"
    consumer_side = RedisBackend.from_url(URL, prefix=prefix)
    producer_side = RedisBackend.from_url(URL, prefix=prefix)
    try:
        async with Rheo(consumer_side) as rheo, Rheo(producer_side) as producer:
            await rheo.create_stream("latency")
            timing = Timing(count)
            async with timing.start(rheo):
                await asyncio.sleep(0.2)  # let the group go idle on its blocking read
                for i in range(count):
                    await producer.append("latency", NewEvent(
                        "bench.latency", {"t": time.perf_counter(), "i": i}))
                    await asyncio.sleep(LATENCY_INTERVAL_S)
                await asyncio.wait_for(timing.done.wait(), 30)
            return percentiles(timing.samples)
    finally:
        await consumer_side.drop_all()
        await consumer_side.close()
        await producer_side.close()


async def raw_latency(count: int) -> tuple[float, float]:
    """The same measurement with a raw XREADGROUP BLOCK loop and XADD."""
    consumer_client = aioredis.Redis.from_url(URL)
    producer_client = aioredis.Redis.from_url(URL)
    key = f"rheo-bench-raw-{uuid.uuid4().hex[:10]}"
    samples: list[float] = []

    async def consume() -> None:
        while len(samples) < count:
            reply: Any = await consumer_client.xreadgroup("bench", "raw", {key: ">"},
                                                          count=RAW_COUNT, block=1000)
            if not reply:
                continue
            ids = []
            for entry_id, fields in reply[0][1]:
                samples.append((time.perf_counter() - float(fields[b"t"])) * 1000)
                ids.append(entry_id)
            await consumer_client.xack(key, "bench", *ids)

    try:
        await consumer_client.xgroup_create(key, "bench", "$", mkstream=True)
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        for _ in range(count):
            await producer_client.xadd(key, {"t": repr(time.perf_counter())})
            await asyncio.sleep(LATENCY_INTERVAL_S)
        await asyncio.wait_for(task, 30)
        return percentiles(samples)
    finally:
        await consumer_client.delete(key)
        await consumer_client.aclose()
        await producer_client.aclose()


# the suite ---------------------------------------------------------------------


async def run(quick: bool) -> list[Result]:
    """Throughput against raw redis-py and saq, then latency against raw redis-py."""
    if not redis.utils.HIREDIS_AVAILABLE:
        raise SystemExit("the redis suite needs hiredis: pip install 'redis[hiredis]'")
    events = 10_000 if quick else 50_000
    rounds = 1 if quick else 3
    jobs = 1_000 if quick else 10_000  # saq runs once: it is two orders of magnitude slower
    samples = 200 if quick else 1_000

    rates: dict[str, list[float]] = {"raw": [], "rheo": [], "pipeline": [], "raw append": [],
                                     "rheo append": [], "backend loop": []}
    for _ in range(rounds):
        rates["raw"].append(await raw_consume(events))
        rates["rheo"].append(await rheo_consume(events))
        rates["backend loop"].append(await rheo_backend_loop(events))
        rates["pipeline"].append(await rheo_pipeline(events))
        rates["raw append"].append(await raw_append(events))
        rates["rheo append"].append(await rheo_append(events))
    raw, ours, piped, raw_append_rate, append_rate, alone = (
        statistics.median(rates[k])
        for k in ("raw", "rheo", "pipeline", "raw append", "rheo append", "backend loop"))
    peer, saq_version = await saq_consume(jobs)
    raw_p50, raw_p99 = await raw_latency(samples)
    p50, p99 = await rheo_latency(samples)
    shape = (f"{events} events per contender, median of {rounds} alternating rounds; "
             "redis-py with hiredis (HIREDIS_AVAILABLE)")
    saq_name = f"saq {saq_version}"
    return [
        Result(f"consume+ack: XREADGROUP COUNT {RAW_COUNT} + XACK, pipelined", RAW, raw,
               "events/s", note=shape),
        Result.compared("consume+ack: Group vs raw redis-py", "rheo_flow", ours, "events/s", raw,
                        note=f"{shape}; target ratio >= 0.5", baseline_name=RAW),
        Result.compared("consume+ack: Pipeline vs raw redis-py", "rheo_flow", piped,
                        "events/s", raw, note=shape, baseline_name=RAW),
        Result.compared("consume+ack: Group vs Pipeline", "rheo_flow", ours, "events/s", piped,
                        note=shape, baseline_name="pipeline"),
        Result.compared(f"consume+ack: backend ack_and_fetch loop (COUNT {RAW_COUNT}) vs raw "
                        "redis-py", "rheo_flow", alone, "events/s", raw, note=shape,
                        baseline_name=RAW),
        Result.compared("consume+ack: Group vs backend loop", "rheo_flow", ours, "events/s",
                        alone, note=shape, baseline_name="backend loop"),
        Result(f"consume+ack: no-op jobs ({SAQ_CONCURRENCY} workers)", saq_name, peer,
               "jobs/s", note=f"{jobs} jobs"),
        Result.compared("consume+ack: Group vs saq", "rheo_flow", ours, "events/s", peer,
                        note="target ratio >= 20", baseline_name=saq_name),
        Result(f"append batch {APPEND_BATCH}: pipelined XADD", RAW, raw_append_rate,
               "events/s", note=shape),
        Result.compared(f"append batch {APPEND_BATCH} vs pipelined XADD", "rheo_flow",
                        append_rate, "events/s", raw_append_rate,
                        note=f"{shape}; target ratio >= 0.9", baseline_name=RAW),
        Result("append->handler p50: XADD + XREADGROUP BLOCK", RAW, raw_p50, "ms",
               note=f"{samples} events, one per {LATENCY_INTERVAL_S * 1000:g} ms"),
        Result.compared("append->handler p50: Group (blocking XREAD wake-up)", "rheo_flow", p50,
                        "ms", raw_p50, note="ratio: lower is better", baseline_name=RAW),
        Result("append->handler p99: XADD + XREADGROUP BLOCK", RAW, raw_p99, "ms"),
        Result.compared("append->handler p99: Group (blocking XREAD wake-up)", "rheo_flow", p99,
                        "ms", raw_p99, note="ratio: lower is better", baseline_name=RAW),
    ]
