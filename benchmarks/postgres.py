"""Suite ``postgres``: the PostgreSQL backend against raw asyncpg and pgqueuer.

Measured in one run, on the server named by ``RHEO_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), each system in its own schema
(dropped afterwards), with no-op handlers and the same batch size:

* append throughput at batch 10 and 100: ``Rheo.append`` against a raw asyncpg
  ``INSERT ... SELECT unnest(...)`` into a plain table (baseline) and pgqueuer's
  batched ``enqueue`` (peer);
* consume+ack throughput at batch 10 and 100 through raw ``fetch``/``ack``, a
  consumer group (``Consumer``/``Group``) and the pipeline, against a raw
  asyncpg queue (``SELECT ... FOR UPDATE SKIP LOCKED`` + batched ``DELETE`` in one
  transaction: no leases, no fencing, no frontier) as baseline and pgqueuer's
  ``QueueManager`` (peer). The ``vs pgqueuer`` lines carry the ratio to the peer;
* fetch latency with 10,000 versus 1,000,000 events already acked in the group
  (``--quick``: 10,000 versus 200,000; the name says which);
* append-to-handler latency p50/p99 at a light steady load, woken by
  ``LISTEN/NOTIFY`` versus polling every ``poll_ms``.

Throughput rounds alternate between the systems and report medians, so a
noisy neighbour on the machine hits them alike. pgqueuer is optional: without
it the peer lines are left out.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from rheo_flow import ACK, NewEvent, Rheo, consumer
from rheo_flow.backends import PostgresBackend
from rheo_flow.pipeline import Batcher, BatchInfo, Message, Pipeline, PipelineHandler, Processors

from ._common import Result

URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
PARTITIONS = 4
HISTORY_LEASE_MS = 3_000
RUN = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
RHEO_SCHEMA = f"rheo_bench_{RUN}"
RAW_SCHEMA = f"raw_bench_{RUN}"
PGQ_SCHEMA = f"pgq_bench_{RUN}"


def _url(schema: str, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"schema": schema, **options}.items())
    return f"{URL}{'&' if '?' in URL else '?'}{query}"


async def _rheo(*, listen: bool = True) -> Rheo:
    backend = PostgresBackend.from_url(_url(RHEO_SCHEMA, listen=str(listen).lower()))
    return await Rheo(backend).open()


async def _backlog(rheo: Rheo, events: int, chunk: int = 2_000) -> str:
    stream = f"b-{uuid.uuid4().hex[:10]}"
    await rheo.create_stream(stream, partitions=PARTITIONS)
    for start in range(0, events, chunk):
        await rheo.append(stream, [NewEvent("bench", {"n": i})
                                   for i in range(start, min(events, start + chunk))])
    return stream


async def _wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark run did not finish in time")
        await asyncio.sleep(0.002)


# Appends ---------------------------------------------------------------------


async def append_rheo(events: int, batch: int) -> float:
    """Events per second through ``Rheo.append`` in batches."""
    rheo = await _rheo()
    try:
        stream = f"a-{uuid.uuid4().hex[:10]}"
        await rheo.create_stream(stream, partitions=PARTITIONS)
        started = time.perf_counter()
        for start in range(0, events, batch):
            await rheo.append(stream, [NewEvent("bench", {"n": i})
                                       for i in range(start, min(events, start + batch))])
        return events / (time.perf_counter() - started)
    finally:
        await rheo.close()


async def append_raw(events: int, batch: int) -> float:
    """Events per second of a plain batched INSERT (no sequences, no idempotency)."""
    conn = await asyncpg.connect(URL)
    try:
        table = f"{RAW_SCHEMA}.events_{uuid.uuid4().hex[:8]}"
        await conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, type text, "
                           "data json, appended_at timestamptz DEFAULT clock_timestamp())")
        sql = f"INSERT INTO {table} (type, data) SELECT 'bench', unnest($1::text[])::json"
        started = time.perf_counter()
        for start in range(0, events, batch):
            await conn.execute(sql, [f'{{"n":{i}}}'
                                     for i in range(start, min(events, start + batch))])
        return events / (time.perf_counter() - started)
    finally:
        await conn.close()


async def append_pgqueuer(events: int, batch: int) -> float:
    """Jobs per second through pgqueuer's batched ``enqueue``."""
    conn, queries = await _pgqueuer()
    try:
        started = time.perf_counter()
        for start in range(0, events, batch):
            n = min(batch, events - start)
            await queries.enqueue(["bench"] * n, [b'{"n":1}'] * n, [0] * n)
        return events / (time.perf_counter() - started)
    finally:
        await conn.close()


# Consume + ack ---------------------------------------------------------------


async def consume_fetch_ack(events: int, batch: int) -> float:
    """Events per second of one loop of ``fetch(limit=batch)`` + ``ack``."""
    rheo = await _rheo()
    try:
        stream = await _backlog(rheo, events)
        await rheo.create_group(stream, "g")
        started = time.perf_counter()
        done = 0
        while done < events:
            leases = await rheo.fetch(stream, "g", consumer_id="c", limit=batch)
            results = await rheo.ack(leases)
            done += sum(r.ok for r in results)
        return events / (time.perf_counter() - started)
    finally:
        await rheo.close()


async def consume_group(events: int, batch: int) -> float:
    """Events per second through a ``Consumer``/``Group`` with a no-op handler."""
    rheo = await _rheo()
    try:
        stream = await _backlog(rheo, events)

        # One batch per fetch, the next fetched while the last is handled and settled.
        @consumer(stream=stream, group="g", max_demand=2 * batch, fetch_size=batch,
                  concurrency=batch, poll_ms=50)
        async def noop(event: Any, context: Any) -> Any:
            return ACK

        started = time.perf_counter()
        async with noop.start(rheo) as group:
            await _wait_until(lambda: group.stats.acked >= events, 300)
            elapsed = time.perf_counter() - started
        return events / elapsed
    finally:
        await rheo.close()


class _NoOp(PipelineHandler):
    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        return messages


async def consume_pipeline(events: int, batch: int) -> float:
    """Events per second through a :class:`Pipeline` (4 processors, one batcher)."""
    rheo = await _rheo()
    try:
        stream = await _backlog(rheo, events)
        pipeline = Pipeline(
            rheo, stream=stream, group="g", handler=_NoOp(),
            processors=Processors(concurrency=4, max_demand=batch),
            batchers={"default": Batcher(batch_size=batch, batch_timeout=0.05, concurrency=2)},
            max_inflight=4 * batch, poll_ms=50,
        )
        started = time.perf_counter()
        await pipeline.start()
        try:
            await _wait_until(lambda: pipeline.stats().acked >= events, 300)
            elapsed = time.perf_counter() - started
        finally:
            await pipeline.drain(10)
        return events / elapsed
    finally:
        await rheo.close()


async def consume_raw(events: int, batch: int) -> float:
    """Events per second of SELECT ... FOR UPDATE SKIP LOCKED + batched DELETE."""
    conn = await asyncpg.connect(URL)
    try:
        table = f"{RAW_SCHEMA}.jobs_{uuid.uuid4().hex[:8]}"
        await conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text)")
        for start in range(0, events, 5_000):
            n = min(5_000, events - start)
            await conn.execute(f"INSERT INTO {table} (payload) SELECT unnest($1::text[])",
                               ['{"n":1}'] * n)
        claim = f"SELECT id, payload FROM {table} ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
        delete = f"DELETE FROM {table} WHERE id = ANY($1::bigint[])"
        started = time.perf_counter()
        done = 0
        while done < events:
            async with conn.transaction():
                rows = await conn.fetch(claim, batch)
                await conn.execute(delete, [r[0] for r in rows])
            done += len(rows)
        return events / (time.perf_counter() - started)
    finally:
        await conn.close()


async def _pgqueuer() -> tuple[asyncpg.Connection, Any]:
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(URL, server_settings={"search_path": PGQ_SCHEMA})
    queries = Queries.from_asyncpg_connection(conn)
    if not await queries.schema_is_installed():
        await queries.install()
    await queries.clear_queue()
    return conn, queries


async def consume_pgqueuer(events: int, batch: int) -> float:
    """Jobs per second through pgqueuer's ``QueueManager`` with a no-op entrypoint."""
    from datetime import timedelta

    from pgqueuer import types
    from pgqueuer.qm import QueueManager

    conn, queries = await _pgqueuer()
    try:
        for start in range(0, events, 5_000):
            n = min(5_000, events - start)
            await queries.enqueue(["bench"] * n, [None] * n, [0] * n)
        manager = QueueManager(queries)
        done = 0
        first = last = 0.0

        @manager.entrypoint("bench")
        async def bench(job: Any) -> None:
            nonlocal done, first, last
            last = time.perf_counter()
            if not done:
                first = last
            done += 1

        await manager.run(batch_size=batch, mode=types.QueueExecutionMode.drain,
                          dequeue_timeout=timedelta(seconds=0.5))
        if done < events:
            raise RuntimeError(f"pgqueuer processed {done} of {events} jobs")
        # From the first job to the last: pgqueuer's start-up and its final log
        # flush are left out (in its favour).
        return (events - 1) / (last - first)
    finally:
        await conn.close()


# Latencies -------------------------------------------------------------------


async def _acked_history(rheo: Rheo, acked: int, rounds: int) -> str:
    """A stream whose group "g" acked ``acked`` events, with ``rounds`` batches of 100 left."""
    stream = await _backlog(rheo, acked + rounds * 100, chunk=10_000)
    await rheo.create_group(stream, "g")
    done = 0
    while done < acked:
        leases = await rheo.fetch(stream, "g", consumer_id="c", lease_ms=HISTORY_LEASE_MS,
                                  limit=min(10_000, acked - done))
        await rheo.ack(leases)
        done += len(leases)
    return stream


async def fetch_latency_with_history(small: int, large: int, rounds: int
                                     ) -> tuple[float, float]:
    """Median ms of ``fetch(limit=100)`` in a group with ``small`` and with ``large``
    acked events; the two are sampled alternately so load hits both alike."""
    rheo = await _rheo()
    try:
        streams = [await _acked_history(rheo, n, rounds) for n in (small, large)]
        # Every acked lease's deadline lies in the past now, as in a long-running
        # group: expired-lease scans must not walk them.
        await asyncio.sleep(HISTORY_LEASE_MS / 1000)
        samples: list[list[float]] = [[], []]
        for i in range(rounds):
            for which in (0, 1) if i % 2 else (1, 0):
                started = time.perf_counter()
                leases = await rheo.fetch(streams[which], "g", consumer_id="c", limit=100)
                samples[which].append((time.perf_counter() - started) * 1000)
                await rheo.ack(leases)
        return statistics.median(samples[0]), statistics.median(samples[1])
    finally:
        await rheo.close()


async def append_to_handler(listen: bool, events: int, interval: float) -> tuple[float, float]:
    """p50 and p99 ms from ``append`` to the handler at one event per ``interval`` s."""
    rheo = await _rheo(listen=listen)
    try:
        stream = f"l-{uuid.uuid4().hex[:10]}"
        await rheo.create_stream(stream, partitions=1)
        sent: dict[int, float] = {}
        seen: dict[int, float] = {}

        @consumer(stream=stream, group="g", poll_ms=100, max_demand=10, concurrency=1)
        async def record(event: Any, context: Any) -> Any:
            seen[event.data["i"]] = time.perf_counter()
            return ACK

        async with record.start(rheo):
            await asyncio.sleep(0.3)  # let the group go idle (and LISTEN) first
            for i in range(events):
                sent[i] = time.perf_counter()
                await rheo.append(stream, NewEvent("tick", {"i": i}))
                await asyncio.sleep(interval)
            await _wait_until(lambda: len(seen) >= events, 30)
        latencies = sorted((seen[i] - sent[i]) * 1000 for i in range(events))
        return (statistics.median(latencies),
                latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))])
    finally:
        await rheo.close()


# The run ---------------------------------------------------------------------


async def _rounds(rounds: int, runners: dict[str, Callable[[], Awaitable[float]]]
                  ) -> dict[str, float]:
    """Run every runner ``rounds`` times, interleaved; the median of each."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            samples[name].append(await runner())
    return {name: statistics.median(values) for name, values in samples.items()}


async def _setup() -> None:
    conn = await asyncpg.connect(URL)
    try:
        for schema in (RAW_SCHEMA, PGQ_SCHEMA):
            await conn.execute(f"CREATE SCHEMA {schema}")
    finally:
        await conn.close()


async def _teardown() -> None:
    conn = await asyncpg.connect(URL)
    try:
        for schema in (RHEO_SCHEMA, RAW_SCHEMA, PGQ_SCHEMA):
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


async def run(quick: bool) -> list[Result]:
    """Every measurement of the suite (``quick``: smaller sizes, fewer rounds)."""
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    rounds = 3 if quick else 5
    await _setup()
    try:
        return await _run(quick, rounds)
    finally:
        await _teardown()


async def _run(quick: bool, rounds: int) -> list[Result]:
    results: list[Result] = []
    peer = importlib.util.find_spec("pgqueuer") is not None
    if not peer:
        print("pgqueuer is not installed: the peer lines are left out "
              "(pip install pgqueuer)", file=sys.stderr)
    for batch in (10, 100):
        events = (2_000 if quick else 10_000) * (1 if batch == 10 else 4)
        note = f"{events} events, batch {batch}, {PARTITIONS} partitions"
        runners: dict[str, Callable[[], Awaitable[float]]] = {
            "raw": lambda e=events, b=batch: append_raw(e, b),
            "rheo": lambda e=events, b=batch: append_rheo(e, b),
        }
        if peer:
            runners["pgqueuer"] = lambda e=events, b=batch: append_pgqueuer(e, b)
        medians = await _rounds(rounds, runners)
        raw = medians["raw"]
        results += [
            Result(f"append batch {batch}: raw asyncpg INSERT", "asyncpg", raw, "events/s",
                   note=note),
            Result.compared(f"append batch {batch}", "postgres", medians["rheo"], "events/s",
                            raw, note),
        ]
        if peer:
            results += [
                Result.compared(f"append batch {batch}: pgqueuer enqueue", "pgqueuer",
                                medians["pgqueuer"], "events/s", raw, note),
                Result.compared(f"append batch {batch} vs pgqueuer", "postgres",
                                medians["rheo"], "events/s", medians["pgqueuer"], note),
            ]
    for batch in (10, 100):
        events = (2_000 if quick else 10_000) * (1 if batch == 10 else 4)
        note = f"{events} events, batch {batch}, no-op handlers"
        runners = {
            "raw": lambda e=events, b=batch: consume_raw(e, b),
            "fetch/ack": lambda e=events, b=batch: consume_fetch_ack(e, b),
            "group": lambda e=events, b=batch: consume_group(e, b),
            "pipeline": lambda e=events, b=batch: consume_pipeline(e, b),
        }
        if peer:
            runners["pgqueuer"] = lambda e=events, b=batch: consume_pgqueuer(e, b)
        medians = await _rounds(rounds, runners)
        raw = medians["raw"]
        results.append(Result(f"consume+ack batch {batch}: raw SKIP LOCKED + DELETE",
                              "asyncpg", raw, "events/s", note=note))
        if peer:
            results.append(Result.compared(
                f"consume+ack batch {batch}: pgqueuer QueueManager", "pgqueuer",
                medians["pgqueuer"], "events/s", raw, note))
        for label in ("fetch/ack", "group", "pipeline"):
            results.append(Result.compared(f"consume+ack batch {batch}: {label}", "postgres",
                                           medians[label], "events/s", raw, note))
            if peer:
                results.append(Result.compared(
                    f"consume+ack batch {batch}: {label} vs pgqueuer", "postgres",
                    medians[label], "events/s", medians["pgqueuer"], note))
    small, large = 10_000, (200_000 if quick else 1_000_000)
    probe_rounds = 30 if quick else 60
    at_small, at_large = await fetch_latency_with_history(small, large, probe_rounds)
    note = f"median of {probe_rounds} fetches of 100 after the acked history, alternated"
    results += [
        Result(f"fetch latency, {small:,} acked", "postgres", at_small, "ms", note=note),
        Result.compared(f"fetch latency, {large:,} acked (vs {small:,})", "postgres", at_large,
                        "ms", at_small, note),
    ]
    events, interval = (150, 0.02) if quick else (500, 0.02)
    note = f"{events} events, one per {interval * 1000:.0f} ms, poll_ms=100"
    poll_p50, poll_p99 = await append_to_handler(False, events, interval)
    push_p50, push_p99 = await append_to_handler(True, events, interval)
    results += [
        Result("append-to-handler p50, polling", "postgres", poll_p50, "ms", note=note),
        Result("append-to-handler p99, polling", "postgres", poll_p99, "ms", note=note),
        Result.compared("append-to-handler p50, NOTIFY", "postgres", push_p50, "ms", poll_p50,
                        note),
        Result.compared("append-to-handler p99, NOTIFY", "postgres", push_p99, "ms", poll_p99,
                        note),
    ]
    return results
