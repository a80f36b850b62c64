"""Suite ``postgres``: the PostgreSQL backend against raw asyncpg, pgqueuer and pgmq.

Measured in one run, on the server named by ``RHEO_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), each system in its own schema
(pgmq, whose SQL-only install is bound to a schema named ``pgmq``, in a database
of its own), all dropped afterwards, with no-op handlers and the same batch size:

* append throughput at batch 10, 100 and 1000: ``Rheo.append`` against a raw
  asyncpg ``INSERT ... SELECT unnest(...)`` into a plain table (baseline),
  pgqueuer's batched ``enqueue`` (peer) and, at batch 1000, pgmq's ``send_batch``;
* consume+ack throughput at batch 10 and 100 through raw ``fetch``/``ack``, a
  consumer group (``Consumer``/``Group``) and the pipeline, against the fastest
  plain asyncpg queue loop: one prepared statement per batch, ``DELETE ... WHERE
  id IN (SELECT id ... ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING``
  (no leases, no fencing, no frontier) as baseline; pgqueuer's ``QueueManager``
  (drain mode, ``batch_size`` = batch) and pgmq (``read`` of a batch then one
  ``delete`` of the read ids; and the same with ``read_with_poll``) as peers;
* fetch latency with 10,000 versus 1,000,000 events already acked in the group
  (``--quick``: 10,000 versus 50,000; the name says which);
* append-to-handler latency p50/p99 at a light steady load, woken by
  ``LISTEN/NOTIFY`` versus polling every ``poll_ms``.

Connection budget: rheo_flow, pgqueuer and pgmq each get a pool of at most
``POOL_MAX`` (10) connections (rheo_flow's default ``pool_max_size``; rheo_flow
adds its LISTEN connection); the raw loops run one statement at a time on one
connection, and pgmq runs two read+delete loops at once (as a ``Group`` with
``max_demand`` = 4 x batch keeps two fetches under way). Throughput rounds
alternate between the systems, each on a fresh backlog, and report medians, so
a noisy neighbour on the machine hits them alike. pgqueuer and pgmq are
optional: without them their lines are left out.
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
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from rheo_flow import ACK, NewEvent, Rheo, consumer
from rheo_flow.backends import PostgresBackend

from ._common import Result, alternating_rounds, backend_loop_rate, pipeline_rate, wait_until

URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
PARTITIONS = 4
HISTORY_LEASE_MS = 3_000
RUN = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"
RHEO_SCHEMA = f"rheo_bench_{RUN}"
RAW_SCHEMA = f"raw_bench_{RUN}"
PGQ_SCHEMA = f"pgq_bench_{RUN}"
PGMQ_DATABASE = f"pgmq_bench_{RUN}"
POOL_MAX = 10
PGMQ_LOOPS = 2
RAW = "raw-asyncpg"


WAL_BYTES: dict[str, list[float]] = {}
"""WAL bytes written per consumed event, by contender (``"group"``, ``"raw"``, ...) and
batch: one sample per round, read from ``pg_current_wal_insert_lsn()`` around the run
(the whole server's WAL: run the suite on a quiet server)."""


async def _wal_lsn() -> int:
    """The server's WAL insert position, in bytes."""
    conn = await asyncpg.connect(URL)
    try:
        return int(await conn.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"))
    finally:
        await conn.close()


def _record_wal(contender: str, batch: int, start: int, end: int, events: int) -> None:
    WAL_BYTES.setdefault(f"{contender} {batch}", []).append((end - start) / events)


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
    pool, queries = await _pgqueuer()
    try:
        started = time.perf_counter()
        for start in range(0, events, batch):
            n = min(batch, events - start)
            await queries.enqueue(["bench"] * n, [b'{"n":1}'] * n, [0] * n)
        return events / (time.perf_counter() - started)
    finally:
        await pool.close()


async def append_pgmq(events: int, batch: int) -> float:
    """Messages per second through pgmq's ``send_batch``."""
    queue, pool, name = await _pgmq()
    try:
        started = time.perf_counter()
        for start in range(0, events, batch):
            await queue.send_batch(name, [{"n": i}
                                          for i in range(start, min(events, start + batch))])
        return events / (time.perf_counter() - started)
    finally:
        await pool.close()


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


async def consume_backend_loop(events: int, batch: int) -> float:
    """Events per second of the backend alone: ``ack_and_fetch`` in a loop, handler inline."""
    rheo = await _rheo()
    try:
        stream = await _backlog(rheo, events)
        return await backend_loop_rate(rheo, stream, "g", events, limit=batch)
    finally:
        await rheo.close()


async def consume_group(events: int, batch: int) -> float:
    """Events per second through a ``Consumer``/``Group`` with a no-op handler."""
    rheo = await _rheo()
    try:
        stream = await _backlog(rheo, events)

        # One batch per fetch; up to four held (two fetches under way while a batch
        # is handled and the last one settled): more room makes it no faster.
        @consumer(stream=stream, group="g", max_demand=4 * batch, fetch_size=batch,
                  concurrency=batch, poll_ms=50)
        async def noop(event: Any, context: Any) -> Any:
            return ACK

        lsn = await _wal_lsn()
        started = time.perf_counter()
        async with noop.start(rheo) as group:
            await wait_until(lambda: group.stats.acked >= events, 300)
            elapsed = time.perf_counter() - started
        _record_wal("group", batch, lsn, await _wal_lsn(), events)
        return events / elapsed
    finally:
        await rheo.close()


async def consume_pipeline(events: int, batch: int) -> float:
    """Events per second through a :class:`Pipeline` (4 processors, one batcher, the
    default ``max_inflight``; each fetch claims at most ``batch``, as the ``Group`` and
    the raw loop do)."""
    rheo = await _rheo()
    try:
        stream = await _backlog(rheo, events)
        return await pipeline_rate(rheo, stream, "g", events, demand=batch, batch=batch,
                                   fetch_size=batch)
    finally:
        await rheo.close()


async def consume_raw(events: int, batch: int) -> float:
    """Events per second of one prepared ``DELETE ... WHERE id IN (SELECT ... FOR UPDATE
    SKIP LOCKED) RETURNING`` per batch."""
    conn = await asyncpg.connect(URL)
    try:
        table = f"{RAW_SCHEMA}.jobs_{uuid.uuid4().hex[:8]}"
        await conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text)")
        for start in range(0, events, 5_000):
            n = min(5_000, events - start)
            await conn.execute(f"INSERT INTO {table} (payload) SELECT unnest($1::text[])",
                               ['{"n":1}'] * n)
        await conn.execute(f"ANALYZE {table}")
        take = await conn.prepare(
            f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT $1 "
            "FOR UPDATE SKIP LOCKED) RETURNING id, payload")
        lsn = await _wal_lsn()
        started = time.perf_counter()
        done = 0
        while done < events:
            rows = await take.fetch(batch)
            done += len(rows)
        elapsed = time.perf_counter() - started
        _record_wal("raw", batch, lsn, await _wal_lsn(), events)
        return events / elapsed
    finally:
        await conn.close()


async def _pgqueuer() -> tuple[asyncpg.Pool, Any]:
    from pgqueuer.queries import Queries

    pool = await asyncpg.create_pool(URL, min_size=1, max_size=POOL_MAX,
                                     server_settings={"search_path": PGQ_SCHEMA})
    queries = Queries.from_asyncpg_pool(pool)
    if not await queries.schema_is_installed():
        await queries.install()
    await queries.clear_queue()
    return pool, queries


async def consume_pgqueuer(events: int, batch: int) -> float:
    """Jobs per second through pgqueuer's ``QueueManager`` with a no-op entrypoint."""
    from datetime import timedelta

    from pgqueuer import types
    from pgqueuer.qm import QueueManager

    pool, queries = await _pgqueuer()
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
        await pool.close()


def _pgmq_url() -> str:
    parts = urlsplit(URL)
    return urlunsplit(parts._replace(path=f"/{PGMQ_DATABASE}"))


async def _pgmq() -> tuple[Any, asyncpg.Pool, str]:
    """A pgmq client on a pool of ``POOL_MAX`` connections, and a fresh queue's name."""
    from pgmq import AsyncPGMQueue

    pool = await asyncpg.create_pool(_pgmq_url(), min_size=1, max_size=POOL_MAX)
    queue = AsyncPGMQueue(pool=pool, init_extension=False)
    await queue.init()
    name = f"b_{uuid.uuid4().hex[:10]}"
    await queue.create_queue(name)
    return queue, pool, name


async def consume_pgmq(events: int, batch: int, poll: bool) -> float:
    """Messages per second through pgmq ``read`` (or ``read_with_poll``) of a batch and
    one ``delete`` of the read ids, ``PGMQ_LOOPS`` loops at once."""
    queue, pool, name = await _pgmq()
    try:
        for start in range(0, events, 5_000):
            await queue.send_batch(name, [{"n": 1}] * min(5_000, events - start))
        done = 0

        async def loop() -> None:
            nonlocal done
            while done < events:
                if poll:
                    messages = await queue.read_with_poll(name, vt=30, qty=batch,
                                                          max_poll_seconds=1)
                else:
                    messages = await queue.read(name, vt=30, qty=batch)
                if not messages:
                    continue
                deleted = await queue.delete_batch(name, [m.msg_id for m in messages])
                done += len(deleted)

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(PGMQ_LOOPS)))
        return events / (time.perf_counter() - started)
    finally:
        await pool.close()


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
            await wait_until(lambda: len(seen) >= events, 30)
        latencies = sorted((seen[i] - sent[i]) * 1000 for i in range(events))
        return (statistics.median(latencies),
                latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))])
    finally:
        await rheo.close()


# The run ---------------------------------------------------------------------


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


async def _setup(pgmq: bool) -> None:
    conn = await asyncpg.connect(URL)
    try:
        for schema in (RAW_SCHEMA, PGQ_SCHEMA):
            await conn.execute(f"CREATE SCHEMA {schema}")
        if pgmq:
            await conn.execute(f"CREATE DATABASE {PGMQ_DATABASE}")
    finally:
        await conn.close()
    if pgmq:
        from pgmq.install import install_pgmq_from_sql

        # pgmq's SQL-only install (the package's bundled pgmq.sql), into its own database.
        await asyncio.to_thread(install_pgmq_from_sql, dsn=_pgmq_url())


async def _teardown() -> None:
    conn = await asyncpg.connect(URL)
    try:
        for schema in (RHEO_SCHEMA, RAW_SCHEMA, PGQ_SCHEMA):
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.execute(f"DROP DATABASE IF EXISTS {PGMQ_DATABASE} WITH (FORCE)")
    finally:
        await conn.close()


async def run(quick: bool) -> list[Result]:
    """Every measurement of the suite (``quick``: smaller sizes, one round)."""
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    logging.getLogger("pgmq").setLevel(logging.WARNING)
    rounds = 1 if quick else 3
    pgmq = _has("pgmq") and _has("psycopg")
    if not pgmq:
        print("pgmq is not installed: its lines are left out (pip install 'pgmq[async]')",
              file=sys.stderr)
    await _setup(pgmq)
    try:
        return await _run(quick, rounds, pgmq)
    finally:
        await _teardown()


def _events(quick: bool, batch: int) -> int:
    if quick:
        return {10: 2_000, 100: 8_000}.get(batch, 10_000)
    return 50_000


async def _run(quick: bool, rounds: int, pgmq: bool) -> list[Result]:
    results: list[Result] = []
    peer = _has("pgqueuer")
    if not peer:
        print("pgqueuer is not installed: the peer lines are left out "
              "(pip install pgqueuer)", file=sys.stderr)
    budget = f"pools of <= {POOL_MAX} connections, raw: 1 connection"
    for batch in (10, 100, 1000):
        events = _events(quick, batch)
        note = (f"{events} events, batch {batch}, {PARTITIONS} partitions, median of {rounds} "
                f"alternating rounds, {budget}")
        runners: dict[str, Callable[[], Awaitable[float]]] = {
            "raw": lambda e=events, b=batch: append_raw(e, b),
            "rheo": lambda e=events, b=batch: append_rheo(e, b),
        }
        if peer:
            runners["pgqueuer"] = lambda e=events, b=batch: append_pgqueuer(e, b)
        if pgmq and batch == 1000:
            runners["pgmq"] = lambda e=events, b=batch: append_pgmq(e, b)
        medians = await alternating_rounds(rounds, runners)
        raw = medians["raw"]
        results += [
            Result(f"append batch {batch}: raw asyncpg INSERT ... unnest", RAW, raw,
                   "events/s", note=note),
            Result.compared(f"append batch {batch}", "postgres", medians["rheo"], "events/s",
                            raw, note, baseline_name=RAW),
        ]
        for name, verb in (("pgqueuer", "enqueue"), ("pgmq", "send_batch")):
            if name in medians:
                results += [
                    Result.compared(f"append batch {batch}: {name} {verb}", name,
                                    medians[name], "events/s", raw, note, baseline_name=RAW),
                    Result.compared(f"append batch {batch} vs {name}", "postgres",
                                    medians["rheo"], "events/s", medians[name], note,
                                    baseline_name=name),
                ]
    for batch in (10, 100):
        events = _events(quick, batch)
        note = (f"{events} events, batch {batch}, no-op handlers, median of {rounds} "
                f"alternating rounds, {budget}, pgmq: {PGMQ_LOOPS} loops")
        runners = {
            "raw": lambda e=events, b=batch: consume_raw(e, b),
            "fetch/ack": lambda e=events, b=batch: consume_fetch_ack(e, b),
            "backend loop": lambda e=events, b=batch: consume_backend_loop(e, b),
            "group": lambda e=events, b=batch: consume_group(e, b),
            "pipeline": lambda e=events, b=batch: consume_pipeline(e, b),
        }
        if peer:
            runners["pgqueuer"] = lambda e=events, b=batch: consume_pgqueuer(e, b)
        if pgmq:
            runners["pgmq"] = lambda e=events, b=batch: consume_pgmq(e, b, poll=False)
            runners["pgmq-poll"] = lambda e=events, b=batch: consume_pgmq(e, b, poll=True)
        medians = await alternating_rounds(rounds, runners)
        raw = medians["raw"]
        results.append(Result(f"consume+ack batch {batch}: raw DELETE ... SKIP LOCKED "
                              "RETURNING", RAW, raw, "events/s", note=note))
        peers = [("pgqueuer", "pgqueuer", "QueueManager"), ("pgmq", "pgmq", "read + delete"),
                 ("pgmq-poll", "pgmq", "read_with_poll + delete")]
        for key, name, how in peers:
            if key in medians:
                results.append(Result.compared(
                    f"consume+ack batch {batch}: {name} {how}", name, medians[key],
                    "events/s", raw, note, baseline_name=RAW))
        results.append(Result.compared(f"consume+ack batch {batch}: group vs pipeline",
                                       "postgres", medians["group"], "events/s",
                                       medians["pipeline"], note, baseline_name="pipeline"))
        results.append(Result.compared(f"consume+ack batch {batch}: group vs backend loop",
                                       "postgres", medians["group"], "events/s",
                                       medians["backend loop"], note,
                                       baseline_name="backend loop"))
        for label in ("fetch/ack", "backend loop", "group", "pipeline"):
            results.append(Result.compared(f"consume+ack batch {batch}: {label}", "postgres",
                                           medians[label], "events/s", raw, note,
                                           baseline_name=RAW))
            for key, name, how in peers:
                if key in medians:
                    results.append(Result.compared(
                        f"consume+ack batch {batch}: {label} vs {name} {how}", "postgres",
                        medians[label], "events/s", medians[key], note, baseline_name=key))
        wal_group, wal_raw = (statistics.median(WAL_BYTES[f"{c} {batch}"])
                              for c in ("group", "raw"))
        results += [
            Result(f"WAL per consumed event, batch {batch}: raw DELETE ... RETURNING", RAW,
                   wal_raw, "B/event", note=note),
            Result.compared(f"WAL per consumed event, batch {batch}: group", "postgres",
                            wal_group, "B/event", wal_raw, note + "; lower is better",
                            baseline_name=RAW),
        ]
    small, large = 10_000, (50_000 if quick else 1_000_000)
    probe_rounds = 30 if quick else 60
    at_small, at_large = await fetch_latency_with_history(small, large, probe_rounds)
    note = f"median of {probe_rounds} fetches of 100 after the acked history, alternated"
    results += [
        Result(f"fetch latency, {small:,} acked", "postgres", at_small, "ms", note=note),
        Result.compared(f"fetch latency, {large:,} acked (vs {small:,})", "postgres", at_large,
                        "ms", at_small, note, baseline_name=f"{small:,} acked"),
    ]
    events, interval = (150, 0.02) if quick else (500, 0.02)
    note = f"{events} events, one per {interval * 1000:.0f} ms, poll_ms=100"
    poll_p50, poll_p99 = await append_to_handler(False, events, interval)
    push_p50, push_p99 = await append_to_handler(True, events, interval)
    results += [
        Result("append-to-handler p50, polling", "postgres", poll_p50, "ms", note=note),
        Result("append-to-handler p99, polling", "postgres", poll_p99, "ms", note=note),
        Result.compared("append-to-handler p50, NOTIFY", "postgres", push_p50, "ms", poll_p50,
                        note, baseline_name="polling"),
        Result.compared("append-to-handler p99, NOTIFY", "postgres", push_p99, "ms", poll_p99,
                        note, baseline_name="polling"),
    ]
    return results
