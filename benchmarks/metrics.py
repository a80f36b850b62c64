"""Suite ``metrics``: what a metrics scrape costs, on PostgreSQL, SQLite and Redis.

* **lag report, 100 streams x 4 groups x 8 partitions** — one
  ``Rheo.lag_report()`` over a store of 100 streams of 8 partitions, each with 4
  groups (3,200 rows): every partition holds a backlog; of each stream, one group
  acked part of it and dead-lettered one event, one consumed nothing, one is
  paused, and (backends with delayed delivery) a few events are scheduled an hour
  ahead. The median of several reports, against the baseline of the report
  composed from the backend's other reads (``composed_lag_report``, what
  ``Rheo.lag_report`` falls back to on a backend that answers ``Unsupported``),
  measured in the same run. The target: at most 100 ms on PostgreSQL and Redis.
* **exporter scrape, 100 x 4 x 8** — one scrape of ``/metrics`` as the worker and
  ``rheo-flow metrics`` serve it (the lag report read, every store gauge rendered
  into the page), against the lag report alone; the same target.
* **consume with a scrape every 100 ms** (SQLite and PostgreSQL) — a backlog
  consumed and acked through a :class:`rheo_flow.Group` (no-op handler) while the
  exporter, on an instance of its own as in the worker, is scraped every 100 ms
  and reads the whole store each time (its cache interval set to 0: the worst
  case; the default interval of 5 s reads it at most once per 5 s), against the
  same consumption without scrapes: a scrape must not hold consumption up.

Everything the suite creates (a PostgreSQL schema, an SQLite file in a temporary
directory, a Redis key prefix) is removed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from rheo_flow import ACK, NewEvent, Rheo, consumer
from rheo_flow._facade._lag import composed_lag_report

from ._common import Result, wait_until

STREAMS = 100
GROUPS = ("audit", "billing", "paused", "shipping")
PARTITIONS = 8
SCRAPE_INTERVAL_S = 0.1
TARGET = "target: one report <= 100 ms on PostgreSQL and Redis (3,200 rows)"
COMPOSED = "composed default"
CONSUMED = {"postgres": 30_000, "sqlite": 60_000}
"""The backlog a consumption run consumes (--quick; four times as much otherwise):
a few seconds, enough for a few dozen scrapes."""
PG_URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("RHEO_REDIS_URL") or "redis://127.0.0.1:6379/0"


@asynccontextmanager
async def _store(backend: str) -> AsyncIterator[tuple[Rheo, str]]:
    """An empty store of ``backend`` of this run only, and its URL; removed on exit."""
    if backend == "postgres":
        import asyncpg

        schema = f"rheo_bench_metrics_{uuid.uuid4().hex[:8]}"
        separator = "&" if "?" in PG_URL else "?"
        try:
            url = f"{PG_URL}{separator}schema={schema}"
            async with Rheo(url) as rheo:
                yield rheo, url
        finally:
            conn = await asyncpg.connect(PG_URL)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
    elif backend == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            url = f"sqlite:///{directory}/metrics.db"
            async with Rheo(url) as rheo:
                yield rheo, url
    else:
        from rheo_flow.backends import RedisBackend

        prefix = f"rheo-bench-{uuid.uuid4().hex[:10]}"
        redis = RedisBackend.from_url(REDIS_URL, prefix=prefix)
        try:
            async with Rheo(redis) as rheo:
                yield rheo, f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
        finally:
            await redis.drop_all()
            await redis.close()


async def build(rheo: Rheo, streams: int, per_partition: int) -> None:
    """``streams`` streams of :data:`PARTITIONS` partitions of ``per_partition`` events
    each, with the groups of :data:`GROUPS` (see the module's docstring)."""
    later = await rheo.backend.now_ms() + 3_600_000
    scheduled = rheo.backend.capabilities.delayed_delivery
    for s in range(streams):
        name = f"metrics-{s:03d}"
        await rheo.create_stream(name, partitions=PARTITIONS)
        for group in GROUPS:
            await rheo.create_group(name, group)
        await rheo.append(name, [NewEvent("bench", {"n": i}, partition=i % PARTITIONS)
                                 for i in range(per_partition * PARTITIONS)])
        if scheduled:
            await rheo.append(name, [NewEvent("bench", {"n": p}, partition=p, deliver_at=later)
                                     for p in range(0, PARTITIONS, 3)])
        leases = await rheo.fetch(name, "billing", limit=per_partition * PARTITIONS // 2)
        await rheo.reject(leases[:1], "poison")
        await rheo.ack(leases[1:])
        if rheo.backend.capabilities.pause:
            await rheo.pause_group(name, "paused")


async def _median_ms(read: Callable[[], Any], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await read()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def report_times(rheo: Rheo, rounds: int, composed_rounds: int) -> tuple[float, float]:
    """The median ms of one ``Rheo.lag_report()`` and of one composed report, after
    checking that both say the same."""
    fast, slow = await rheo.lag_report(), await composed_lag_report(rheo.backend, None)
    if fast.groups != slow.groups or not fast.groups:
        raise RuntimeError("the lag report differs from the composed one, or is empty")
    return (await _median_ms(rheo.lag_report, rounds),
            await _median_ms(lambda: composed_lag_report(rheo.backend, None), composed_rounds))


@asynccontextmanager
async def _exporter(url: str, rheo: Rheo | None = None
                    ) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
    """A scrape of ``/metrics`` as the worker and ``rheo-flow metrics`` serve it: the store
    gauges of every stream, read again on every scrape (an interval of 0), through an
    instance of their own on ``url`` (or through ``rheo``), the page rendered on a thread."""
    from rheo_flow._cli.metrics._endpoints import routes
    from rheo_flow._cli.metrics._exporter import PrometheusExport
    from rheo_flow._cli.metrics._store import StoreGauges

    export = PrometheusExport(runtime=False)
    store = StoreGauges(url, interval=0.0, rheo=rheo)
    route = routes(export, store)["/metrics"]

    async def scrape() -> Any:
        status, _, page = await route({})
        if status != 200 or not store.up:
            raise RuntimeError(f"the scrape failed: {store.error}")
        return page

    try:
        yield scrape
    finally:
        await store.aclose()
        export.close()


async def consume_rate(rheo: Rheo, url: str, events: int, scrape: bool) -> tuple[float, int]:
    """Events per second through a Group on a fresh backlog of ``events``, with a scrape of
    the exporter (:func:`_exporter`) every :data:`SCRAPE_INTERVAL_S` meanwhile when
    ``scrape``; and how many scrapes ran."""
    stream = f"consume-{uuid.uuid4().hex[:8]}"
    await rheo.create_stream(stream, partitions=4)
    for start in range(0, events, 2_000):
        await rheo.append(stream, [NewEvent("bench", {"n": i})
                                   for i in range(start, min(events, start + 2_000))])
    scrapes = 0
    scraping = asyncio.Event()

    async def scraper() -> None:
        nonlocal scrapes
        async with _exporter(url) as scrape_once:
            while True:
                await scrape_once()
                scrapes += 1
                scraping.set()
                await asyncio.sleep(SCRAPE_INTERVAL_S)

    @consumer(stream=stream, group="g", max_demand=400, fetch_size=100, concurrency=100,
              poll_ms=50)
    async def noop(event: Any, context: Any) -> Any:
        return ACK

    task = asyncio.create_task(scraper()) if scrape else None
    try:
        if task is not None:  # the exporter's instance open and its first scrape done
            await asyncio.wait_for(scraping.wait(), 60)
        started = time.perf_counter()
        async with noop.start(rheo) as group:
            await wait_until(lambda: group.stats.acked >= events, 300)
            elapsed = time.perf_counter() - started
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if sum((await rheo.lag(stream, "g")).values()) != 0:
        raise RuntimeError("the group left events unsettled")
    await rheo.delete_stream(stream)
    return events / elapsed, scrapes


async def _backend(backend: str, quick: bool) -> list[Result]:
    results = []
    async with _store(backend) as (rheo, url):
        await build(rheo, STREAMS, 4 if quick else 25)
        rounds = 5 if quick else 15
        report, composed = await report_times(rheo, rounds, 2 if quick else 5)
        results.append(Result.compared(
            f"lag report {STREAMS}x{len(GROUPS)}x{PARTITIONS}", backend, report, "ms", composed,
            TARGET, baseline_name=COMPOSED))
        async with _exporter(url, rheo) as scrape:
            page = await scrape()
            if page.count(b"\nrheo_store_lag{") != STREAMS * len(GROUPS) * PARTITIONS:
                raise RuntimeError("the exporter's page lacks some group's lag")
            scraped = await _median_ms(scrape, rounds)
        results.append(Result.compared(
            f"exporter scrape {STREAMS}x{len(GROUPS)}x{PARTITIONS} (read + page)", backend,
            scraped, "ms", report, TARGET + "; the page of every store gauge rendered too",
            baseline_name="lag report alone"))
        if backend == "redis":
            return results
        events = CONSUMED[backend] * (1 if quick else 4)
        rates: dict[bool, list[float]] = {False: [], True: []}
        scrapes = 0
        for _ in range(2 if quick else 3):
            for scrape in (False, True):
                rate, count = await consume_rate(rheo, url, events, scrape)
                rates[scrape].append(rate)
                scrapes += count
        results.append(Result.compared(
            "consume with a scrape every 100 ms", backend, statistics.median(rates[True]),
            "events/s", statistics.median(rates[False]),
            f"{scrapes} scrapes of the exporter over the whole store ({STREAMS + 1} streams), "
            "each reading the store (interval 0) through an instance of its own, during "
            "the runs with scrapes",
            baseline_name="no scrapes"))
    return results


async def run(quick: bool) -> list[Result]:
    """Every measurement of the suite (``quick``: a smaller backlog, fewer rounds)."""
    results = []
    for backend in ("postgres", "sqlite", "redis"):
        results.extend(await _backend(backend, quick))
    return results
