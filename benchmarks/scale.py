"""Suite ``scale``: what one operation costs as what is stored grows, small against large.

Each row is measured on a small and a large store in the same run, the samples
interleaved round by round (the median of each round's median is reported), and
the ratio large ÷ small says whether the cost stays flat:

* **held** — a fresh consumer's ``fetch(limit=100)`` while another consumer of the
  group holds 10 against 100,000 leases (stream of 4 partitions, leases of an hour).
* **delayed** — the same with 10 against 100,000 deliveries nacked with a
  30-minute delay: a retry backlog, as during a downstream outage.
* **busy partition** — ``fetch(limit=100)`` on a stream of 256 partitions against
  one of 1, where only partition 0 holds events.
* **empty fetch** — a fetch that finds nothing, 256 partitions against 1.
* **fetch+ack rate** — one consumer's ``fetch(100)`` + ``ack`` loop over events of
  partition 0 only, 256 partitions against 1 (a throughput: the ratio is small ÷
  large turned around, ≥ 1 would be faster on 256).
* **describe 1,000 streams** — ``Rheo.describe_streams()`` (what ``rheo-flow
  streams`` lists) over 1,000 streams with a group each, against 10.
* **rheo-flow streams** — the whole ``python -m rheo_flow streams --url URL``
  process (start-up, imports, opening the store, the listing, the table) on the
  same two stores: 10 streams against ``python -c pass``, 1,000 against 10.

The Redis-only rows (memory per retained event, a concurrent PING during a 10 MB
append) are in :mod:`benchmarks._scale_redis` (standalone Redis only). Backends:
``RHEO_SCALE_BACKENDS`` (default ``sqlite,postgres,redis``; ``redis-cluster``,
``mongo`` and ``memory`` too), servers from ``RHEO_POSTGRES_URL``, ``RHEO_REDIS_URL``,
``RHEO_REDIS_CLUSTER_URL`` (default ``redis+cluster://127.0.0.1:7000``) and
``RHEO_MONGO_URL`` (its own ``collection_prefix``). ``RHEO_SCALE_LARGE`` (the large
size, 100,000) and ``RHEO_SCALE_PLAN`` (``rounds,samples,rate_events``) shrink a run
on a slow server such as the MongoDB wire emulator; the report then says what was
measured. ``--quick`` keeps the large sizes (the targets are stated at 100,000) but
takes fewer samples and a shorter rate loop.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from rheo_flow import NewEvent, Rheo

from ._common import Result, alternating_rounds

PG_URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("RHEO_REDIS_URL") or "redis://127.0.0.1:6379/0"
CLUSTER_URL = os.environ.get("RHEO_REDIS_CLUSTER_URL") or "redis+cluster://127.0.0.1:7000"
MONGO_URL = os.environ.get("RHEO_MONGO_URL") or "mongodb://127.0.0.1:27017/rheo_test"
SMALL, LARGE = 10, int(os.environ.get("RHEO_SCALE_LARGE") or 100_000)
FETCH = 100
HOUR_MS = 3_600_000
DELAY_MS = 30 * 60_000
FEW_PARTITIONS, MANY_PARTITIONS = 1, 256
FEW_STREAMS, MANY_STREAMS = 10, 1_000
GROUP = "g"


@dataclass(frozen=True)
class Plan:
    """How many samples a run takes."""

    rounds: int
    samples: int
    """Samples of each contender per round (after one warm-up call)."""
    rate_events: int
    """Events one fetch+ack loop consumes per round."""

    @property
    def spare(self) -> int:
        """Events a sampled fetch store needs beyond what it holds."""
        return (self.rounds * (self.samples + 1) + 2) * FETCH


def backends() -> list[str]:
    """The backends this run measures."""
    names = os.environ.get("RHEO_SCALE_BACKENDS", "sqlite,postgres,redis")
    return [name.strip() for name in names.split(",") if name.strip()]


@asynccontextmanager
async def opened(backend: str) -> AsyncIterator[Rheo]:
    """A :class:`Rheo` on a namespace of its own (file, schema or key prefix), removed after."""
    async with opened_at(backend) as (rheo, _):
        yield rheo


@asynccontextmanager
async def opened_at(backend: str) -> AsyncIterator[tuple[Rheo, str]]:
    """:func:`opened`'s :class:`Rheo` and the URL it was opened with."""
    tag = f"scale_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as directory:
        if backend == "sqlite":
            url = f"sqlite:///{Path(directory) / 'scale.db'}"
        elif backend == "postgres":
            url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={tag}"
        elif backend == "redis":
            url = f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={tag}"
        elif backend == "redis-cluster":
            url = f"{CLUSTER_URL}{'&' if '?' in CLUSTER_URL else '?'}prefix={tag}"
        elif backend == "mongo":
            # A minute a call: the CI's wire emulator is far slower than a mongod.
            url = (f"{MONGO_URL}{'&' if '?' in MONGO_URL else '?'}collection_prefix={tag}_"
                   "&timeout_ms=60000")
        else:
            url = "memory://"
        rheo = await Rheo(url).open()
        try:
            yield rheo, url
        finally:
            await _drop(backend, rheo, tag)
            await rheo.close()


async def _drop(backend: str, rheo: Rheo, tag: str) -> None:
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(PG_URL.split("?")[0])
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {tag} CASCADE")
        finally:
            await conn.close()
    elif backend == "redis":
        import redis.asyncio as aioredis

        client = aioredis.from_url(REDIS_URL.split("?")[0])
        try:
            keys = [key async for key in client.scan_iter(match=f"*{tag}*", count=1000)]
            for start in range(0, len(keys), 1000):
                await client.unlink(*keys[start:start + 1000])
        finally:
            await client.aclose()
    elif backend == "redis-cluster":
        from rheo_flow._backends.redis._cluster import cluster_client

        cluster = cluster_client(CLUSTER_URL.split("?")[0], 10_000)
        try:
            keys = [key async for key in cluster.scan_iter(match=f"*{tag}*", count=1000)]
            for key in keys:
                await cluster.unlink(key)
        finally:
            await cluster.aclose()
    elif backend == "mongo":
        await _drop_mongo(tag)


async def _drop_mongo(tag: str) -> None:
    """Drop the collections named with ``tag``'s collection prefix."""
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(MONGO_URL.split("?")[0])
    try:
        db = client.get_default_database("rheo")
        for name in await db.list_collection_names():
            if name.startswith(f"{tag}_"):
                await db.drop_collection(name)
    finally:
        await client.close()


async def fill(rheo: Rheo, stream: str, count: int, *, partitions: int,
               partition: int | None = None) -> None:
    """Create ``stream`` and append ``count`` small events (all into ``partition`` when given)."""
    await rheo.create_stream(stream, partitions=partitions)
    for start in range(0, count, 1_000):
        await rheo.append(stream, [NewEvent("scale", {"n": i})
                                   for i in range(start, min(count, start + 1_000))],
                          partition=partition)


async def hold(rheo: Rheo, stream: str, count: int, *, delay_ms: int | None) -> None:
    """Have another consumer lease ``count`` events for an hour, and nack them with
    ``delay_ms`` when given (a retry backlog)."""
    held = 0
    while held < count:
        leases = await rheo.fetch(stream, GROUP, consumer_id="holder",
                                  limit=min(1_000, count - held), lease_ms=HOUR_MS)
        if not leases:
            raise RuntimeError(f"{stream}: only {held} of {count} events could be leased")
        held += len(leases)
        if delay_ms is not None:
            await rheo.nack(leases, "retry later", delay_ms=delay_ms)


def fetch_sampler(rheo: Rheo, stream: str) -> Callable[[], Awaitable[float]]:
    """Seconds of one fresh consumer's ``fetch(limit=100)``; what it got is acked, untimed."""
    async def sample() -> float:
        started = time.perf_counter()
        leases = await rheo.fetch(stream, GROUP, consumer_id="fresh", limit=FETCH,
                                  lease_ms=60_000)
        elapsed = time.perf_counter() - started
        if leases:
            await rheo.ack(leases)
        return elapsed
    return sample


def rate_sampler(rheo: Rheo, stream: str, events: int) -> Callable[[], Awaitable[float]]:
    """Events per second of one consumer's ``fetch(100)`` + ``ack`` loop over ``events``."""
    async def sample() -> float:
        done = 0
        started = time.perf_counter()
        while done < events:
            leases = await rheo.fetch(stream, GROUP, consumer_id="loop", limit=FETCH,
                                      lease_ms=60_000)
            if not leases:
                raise RuntimeError(f"{stream}: ran dry after {done} of {events} events")
            await rheo.ack(leases)
            done += len(leases)
        return done / (time.perf_counter() - started)
    return sample


async def interleaved(plan: Plan, small: Callable[[], Awaitable[float]],
                      large: Callable[[], Awaitable[float]], *, samples: int | None = None
                      ) -> tuple[float, float]:
    """The median of each round's median of ``small`` and of ``large``, alternated."""
    per_round = plan.samples if samples is None else samples
    await small()
    await large()
    medians: dict[str, list[float]] = {"small": [], "large": []}
    for _ in range(plan.rounds):
        for name, sampler in (("small", small), ("large", large)):
            values = [await sampler() for _ in range(per_round)]
            medians[name].append(statistics.median(values))
    return statistics.median(medians["small"]), statistics.median(medians["large"])


def _ms(name: str, backend: str, small: float, large: float, label: str) -> Result:
    return Result.compared(name, backend, round(large * 1000, 3), "ms", round(small * 1000, 3),
                           baseline_name=label)


async def backlog_rows(backend: str, plan: Plan) -> list[Result]:
    """The held and delayed rows of one backend."""
    results = []
    for name, delay in (("held", None), ("delayed", DELAY_MS)):
        async with opened(backend) as rheo:
            streams = {}
            for size in (SMALL, LARGE):
                stream = f"{name}-{size}"
                await fill(rheo, stream, size + plan.spare, partitions=4)
                await hold(rheo, stream, size, delay_ms=delay)
                streams[size] = stream
            small, large = await interleaved(plan, fetch_sampler(rheo, streams[SMALL]),
                                             fetch_sampler(rheo, streams[LARGE]))
        results.append(_ms(f"fetch(100) with {LARGE:,} {name}", backend, small, large,
                           f"with {SMALL} {name}"))
    return results


async def partition_rows(backend: str, plan: Plan) -> list[Result]:
    """The busy-partition, empty-fetch and fetch+ack-rate rows of one backend."""
    async with opened(backend) as rheo:
        busy, empty, rate = {}, {}, {}
        for count in (FEW_PARTITIONS, MANY_PARTITIONS):
            busy[count], empty[count], rate[count] = (f"busy-{count}", f"empty-{count}",
                                                     f"rate-{count}")
            await fill(rheo, busy[count], plan.spare, partitions=count, partition=0)
            await fill(rheo, empty[count], 0, partitions=count)
            await fill(rheo, rate[count], (plan.rounds + 1) * plan.rate_events,
                       partitions=count, partition=0)
        few, many = FEW_PARTITIONS, MANY_PARTITIONS
        label = f"{few} partition"
        results = []
        small, large = await interleaved(plan, fetch_sampler(rheo, busy[few]),
                                         fetch_sampler(rheo, busy[many]))
        results.append(_ms(f"fetch(100), 1 busy of {many} partitions", backend, small, large,
                           label))
        small, large = await interleaved(plan, fetch_sampler(rheo, empty[few]),
                                         fetch_sampler(rheo, empty[many]))
        results.append(_ms(f"empty fetch, {many} partitions", backend, small, large, label))
        small, large = await interleaved(plan, rate_sampler(rheo, rate[few], plan.rate_events),
                                         rate_sampler(rheo, rate[many], plan.rate_events),
                                         samples=1)
        results.append(Result.compared(
            f"fetch+ack rate, 1 busy of {many} partitions", backend, round(large), "events/s",
            round(small), baseline_name=label))
    return results


async def listing_row(backend: str, plan: Plan) -> list[Result]:
    """The describe-streams row of one backend (1,000 streams against 10), and the rows
    of the whole ``rheo-flow streams`` process on the same stores."""
    async with opened_at(backend) as (few_store, few_url), \
            opened_at(backend) as (many_store, many_url):
        for rheo, count in ((few_store, FEW_STREAMS), (many_store, MANY_STREAMS)):
            for i in range(count):
                await rheo.create_stream(f"s{i:04d}")
                await rheo.create_group(f"s{i:04d}", GROUP)

        def timed(rheo: Rheo) -> Callable[[], Awaitable[float]]:
            async def sample() -> float:
                started = time.perf_counter()
                described = await rheo.describe_streams()
                elapsed = time.perf_counter() - started
                if len(described) not in (FEW_STREAMS, MANY_STREAMS):
                    raise RuntimeError(f"described {len(described)} streams")
                return elapsed
            return sample

        small, large = await interleaved(plan, timed(few_store), timed(many_store), samples=3)
        cli = await cli_rows(backend, plan, few_url, many_url)
    row = _ms(f"describe {MANY_STREAMS:,} streams", backend, small, large, f"{FEW_STREAMS} streams")
    return [Result(row.name, row.backend, row.value, row.unit, row.baseline, row.ratio,
                   "target: at most 300 ms (the ratio only shows the growth)", row.baseline_name),
            *cli]


_PROCESS_ENV: dict[str, str] = {k: v for k, v in os.environ.items()
                                 if k != "PYTHONDONTWRITEBYTECODE"}
"""The environment of the timed processes: this one's, but free to write bytecode caches,
so that the warm-up run writes them as installing the package would (with
``PYTHONDONTWRITEBYTECODE`` set every run compiled rheo_flow's modules again: about
50 ms of a ``rheo-flow streams`` process here)."""


async def _process_s(*argv: str) -> float:
    """Seconds from starting the process ``argv`` to its exit (its output discarded)."""
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.PIPE, env=_PROCESS_ENV)
    _, error = await process.communicate()
    elapsed = time.perf_counter() - started
    if process.returncode:
        raise RuntimeError(f"{' '.join(argv[:4])} failed: {error.decode()[-500:]}")
    return elapsed


async def cli_rows(backend: str, plan: Plan, few_url: str, many_url: str) -> list[Result]:
    """``rheo-flow streams`` as one whole process on 10 and 1,000 streams, and ``python
    -c pass`` (the interpreter's own start-up), run in turn; the median of each."""
    command = (sys.executable, "-m", "rheo_flow", "streams", "--url")
    runners = {"pass": lambda: _process_s(sys.executable, "-c", "pass"),
               "few": lambda: _process_s(*command, few_url),
               "many": lambda: _process_s(*command, many_url)}
    for runner in runners.values():  # a warm-up run each (bytecode caches written)
        await runner()
    median = await alternating_rounds(plan.samples, runners)
    ms = {name: round(seconds * 1000, 1) for name, seconds in median.items()}
    return [
        Result.compared(f"rheo-flow streams, {FEW_STREAMS} streams", backend, ms["few"], "ms",
                        ms["pass"], "whole process", baseline_name="python -c pass"),
        Result.compared(f"rheo-flow streams, {MANY_STREAMS:,} streams", backend, ms["many"],
                        "ms", ms["few"], "whole process; target: at most 300 ms",
                        baseline_name=f"{FEW_STREAMS} streams"),
    ]


async def run(quick: bool) -> list[Result]:
    """Every row on every backend of ``RHEO_SCALE_BACKENDS``."""
    from ._scale_redis import redis_rows

    plan = Plan(rounds=3, samples=10, rate_events=5_000) if quick else Plan(
        rounds=5, samples=30, rate_events=20_000)
    if os.environ.get("RHEO_SCALE_PLAN"):  # "rounds,samples,rate_events": a slow server
        rounds, samples, rate_events = map(int, os.environ["RHEO_SCALE_PLAN"].split(","))
        plan = Plan(rounds, samples, rate_events)
    results: list[Result] = []
    for backend in backends():
        results += await backlog_rows(backend, plan)
        results += await partition_rows(backend, plan)
        results += await listing_row(backend, plan)
        if backend == "redis":
            results += await redis_rows(plan.rounds)
    return results
