"""Suite ``sinks``: sink throughput against raw bulk inserts of the same rows.

The same messages (synthetic leased events over 8 partitions, a small nested
JSON payload) are written in batches, one transaction per batch, into a fresh
table of the same definition (primary key on the event id) each time:

* DuckDB (a database file). Baselines, fed the rows the sink's mapping
  produces, built before the clock starts: DuckDB's appender (the fastest
  path from Python objects without pyarrow/pandas) and ``INSERT ... SELECT
  unnest(?), ...`` from one list per column. A third baseline times the
  appender together with a hand-written mapping of the messages (attribute
  reads and ``json.dumps``): what replacing the sink by hand costs.
* PostgreSQL (``RHEO_POSTGRES_URL``, default
  ``postgresql://postgres@127.0.0.1:5432/test``): ``copy_records_to_table``
  of the prebuilt rows straight into the target, and the same with a
  hand-written mapping.

The sink's time covers everything it does per batch: mapping messages to rows
(JSON-encoding the data), the hop to its thread (DuckDB), the sink-side
frontier and the idempotent load. ``2 in flight`` keeps two batches in
``write`` at once, as a pipeline batcher with ``concurrency=2`` does
(``sink_batcher``'s default): PostgreSQL then maps one batch while the server
loads the other; DuckDB holds the GIL while it works, so it gains nothing.
Rounds alternate between the variants, each on a fresh table; medians are
reported in rows/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rheo_flow import Event, Lease
from rheo_flow.pipeline import Message
from rheo_flow.sinks import Column, DuckDBSink, Load, PostgresSink, RowMapping, Sink

from ._common import Result

URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
PARTITIONS = 8
RUN = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"


def columns(json_type: str) -> list[Column]:
    """The benchmark table: event fields, two data fields and the data as JSON."""
    return [
        Column("event_id", "VARCHAR", "event.id"),
        Column("part", "INTEGER", "event.partition"),
        Column("seq", "BIGINT", "event.sequence"),
        Column("type", "VARCHAR", "event.type"),
        Column("appended_at", "TIMESTAMPTZ", "event.appended_at"),
        Column("customer", "VARCHAR", "data.customer"),
        Column("amount", "DOUBLE PRECISION", "data.amount"),
        Column("data", json_type, "data"),
    ]


def hand_mapped(batch: list[Message]) -> list[tuple[Any, ...]]:
    """The rows of ``columns()``, as one would write the mapping by hand."""
    rows = []
    for m in batch:
        ev = m.lease.event
        data = m.data
        rows.append((ev.id, ev.partition, ev.sequence, ev.type, ev.appended_at,
                     data.get("customer"), data.get("amount"),
                     json.dumps(data, separators=(",", ":"))))
    return rows


def messages(count: int) -> list[Message]:
    """``count`` leased messages over PARTITIONS partitions, as a pipeline hands them."""
    now = time.time_ns() // 1_000_000
    out = []
    for i in range(count):
        part = i % PARTITIONS
        event = Event(stream="bench", partition=part, sequence=i // PARTITIONS + 1,
                      id=uuid.uuid4().hex, type="order.placed",
                      data={"n": i, "customer": f"c-{i % 1000}", "amount": i * 1.25,
                            "items": [{"sku": f"s{i % 50}", "qty": 1 + i % 3}]},
                      key=f"c-{i % 1000}", headers={}, appended_at_ms=now + i // 100)
        lease = Lease(lease_id=uuid.uuid4().hex, receipt="bench", group="bench",
                      consumer_id="bench", event=event, attempt=1, deadline_ms=now + 60_000)
        out.append(Message(lease))
    return out


def batches(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` in consecutive lists of ``size``."""
    return [items[i:i + size] for i in range(0, len(items), size)]


async def timed(fn: Callable[[], Awaitable[None]], rows: int) -> float:
    """Rows per second of one call."""
    started = time.perf_counter()
    await fn()
    return rows / (time.perf_counter() - started)


async def write_all(sink: Sink, msgs: list[Message], size: int, inflight: int = 1) -> None:
    """Every batch through ``sink.write``, ``inflight`` batches at a time (as a pipeline
    batcher with that ``concurrency`` does); fails if a row was not written."""
    slots = asyncio.Semaphore(inflight)

    async def one(batch: list[Message]) -> None:
        try:
            results = await sink.write(batch)
        finally:
            slots.release()
        if not all(r.ok for r in results):
            raise RuntimeError(f"the sink did not write every row: {results[0]}")

    tasks = []
    for batch in batches(msgs, size):
        await slots.acquire()
        tasks.append(asyncio.create_task(one(batch)))
    await asyncio.gather(*tasks)


def _median(values: list[float]) -> float:
    return statistics.median(values)


# DuckDB ------------------------------------------------------------------------------------


def duckdb_raw(path: Path, ddl: str, names: list[str], source: list[Any], size: int,
               how: str) -> float:
    """Rows per second of a raw load into a fresh table, one transaction per batch.

    ``how``: ``appender`` or ``unnest`` (prebuilt rows), or ``mapped`` (the appender
    fed :func:`hand_mapped` rows of the messages in ``source``).
    """
    import duckdb

    con = duckdb.connect(str(path))
    try:
        con.execute(ddl)
        appender = con.appender("t", columns=names)
        insert = (f"INSERT INTO t ({', '.join(names)}) SELECT "
                  + ", ".join(["unnest(?)"] * len(names)))
        started = time.perf_counter()
        for batch in batches(source, size):
            con.execute("BEGIN TRANSACTION")
            if how == "unnest":
                con.execute(insert, [list(column) for column in zip(*batch, strict=True)])
            else:
                appender.append_rows(hand_mapped(batch) if how == "mapped" else batch)
                appender.flush()
            con.execute("COMMIT")
        elapsed = time.perf_counter() - started
        if con.execute("SELECT count(*) FROM t").fetchone() != (len(source),):
            raise RuntimeError("a raw DuckDB load lost rows")
        return len(source) / elapsed
    finally:
        con.close()


async def run_duckdb(count: int, rounds: int, size: int) -> list[Result]:
    """Medians over ``rounds`` rounds of every raw load and the sink (1 and 2 in flight)."""
    cols = columns("JSON")
    mapping = RowMapping(cols)
    msgs = messages(count)
    rows = [mapping.row(m) for m in msgs]
    measured: dict[str, list[float]] = {k: [] for k in ("appender", "unnest", "mapped", "sink",
                                                        "sink2")}
    with tempfile.TemporaryDirectory(prefix="rheo-sink-bench-") as tmp:
        for n in range(rounds):
            for how in ("appender", "unnest", "mapped"):
                measured[how].append(await asyncio.to_thread(
                    duckdb_raw, Path(tmp) / f"{how}-{n}.duckdb", mapping.create_table('"t"'),
                    list(mapping.names), msgs if how == "mapped" else rows, size, how))
            for name, inflight in (("sink", 1), ("sink2", 2)):
                sink = DuckDBSink(Path(tmp) / f"{name}-{n}.duckdb", table="t", columns=cols)
                async with sink:
                    measured[name].append(await timed(
                        lambda s=sink, k=inflight: write_all(s, msgs, size, k), count))
                    if await sink.query("SELECT count(*) FROM t") != [(count,)]:
                        raise RuntimeError("the DuckDB sink lost rows")
    m = {k: _median(v) for k, v in measured.items()}
    note = f"{count} rows, batches of {size}, database file"
    return [
        Result(f"raw appender, prebuilt rows, batch {size}", "duckdb", m["appender"],
               "rows/s", note=note),
        Result.compared(f"raw INSERT SELECT unnest(lists), prebuilt rows, batch {size}",
                        "duckdb", m["unnest"], "rows/s", m["appender"], note),
        Result.compared(f"raw appender + hand-written mapping, batch {size}", "duckdb",
                        m["mapped"], "rows/s", m["appender"], note),
        Result.compared(f"DuckDBSink.write vs raw appender, batch {size}", "duckdb",
                        m["sink"], "rows/s", m["appender"], note),
        Result.compared(f"DuckDBSink.write vs raw INSERT unnest, batch {size}", "duckdb",
                        m["sink"], "rows/s", m["unnest"], note),
        Result.compared(f"DuckDBSink.write vs appender + hand mapping, batch {size}",
                        "duckdb", m["sink"], "rows/s", m["mapped"], note),
        Result.compared(f"DuckDBSink.write 2 in flight vs raw appender, batch {size}",
                        "duckdb", m["sink2"], "rows/s", m["appender"], note),
    ]


# PostgreSQL ----------------------------------------------------------------------------------


async def run_postgres(count: int, rounds: int, size: int) -> list[Result]:
    """Medians over ``rounds`` rounds of the raw COPY loads and the sink (auto load with 1
    and 2 batches in flight, staged load)."""
    import asyncpg

    schema = f"sink_bench_{RUN}"
    cols = columns("JSONB")
    mapping = RowMapping(cols)
    names = list(mapping.names)
    msgs = messages(count)
    rows = [mapping.row(m) for m in msgs]
    pool = await asyncpg.create_pool(URL, min_size=2, max_size=2,
                                     server_settings={"jit": "off"})
    variants: list[tuple[str, Load, int]] = [("sink", "auto", 1), ("sink2", "auto", 2),
                                             ("staged", "staged", 1)]
    measured: dict[str, list[float]] = {"raw": [], "mapped": [], **{v[0]: [] for v in variants}}
    try:
        await pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        for n in range(rounds):
            for how in ("raw", "mapped"):
                table = f"{how}_{n}_{size}"
                await pool.execute(mapping.create_table(f'"{schema}"."{table}"'))

                async def load(table: str = table, how: str = how) -> None:
                    async with pool.acquire() as conn:
                        for batch in batches(msgs if how == "mapped" else rows, size):
                            async with conn.transaction():
                                await conn.copy_records_to_table(
                                    table, columns=names, schema_name=schema,
                                    records=hand_mapped(batch) if how == "mapped" else batch)

                measured[how].append(await timed(load, count))
            for name, mode, inflight in variants:
                sink = PostgresSink(pool=pool, table=f"{schema}.{name}_{n}_{size}",
                                    columns=cols, load=mode)
                async with sink:
                    measured[name].append(await timed(
                        lambda s=sink, k=inflight: write_all(s, msgs, size, k), count))
                    if sink.stats().written != count:
                        raise RuntimeError("the PostgreSQL sink lost rows")
    finally:
        await pool.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await pool.close()
    m = {k: _median(v) for k, v in measured.items()}
    note = f"{count} rows, batches of {size}"
    return [
        Result(f"raw copy_records_to_table, prebuilt rows, batch {size}", "postgres",
               m["raw"], "rows/s", note=note),
        Result.compared(f"raw copy + hand-written mapping, batch {size}", "postgres",
                        m["mapped"], "rows/s", m["raw"], note),
        Result.compared(f"PostgresSink.write vs raw copy, batch {size}", "postgres",
                        m["sink"], "rows/s", m["raw"], note),
        Result.compared(f"PostgresSink.write vs copy + hand mapping, batch {size}",
                        "postgres", m["sink"], "rows/s", m["mapped"], note),
        Result.compared(f"PostgresSink.write 2 in flight vs raw copy, batch {size}",
                        "postgres", m["sink2"], "rows/s", m["raw"], note),
        Result.compared(f"PostgresSink.write load=staged vs raw copy, batch {size}",
                        "postgres", m["staged"], "rows/s", m["raw"], note),
    ]


async def run(quick: bool) -> list[Result]:
    """DuckDB, then PostgreSQL (a note line instead when the server is unreachable)."""
    count = 20_000 if quick else 100_000
    rounds = 3 if quick else 5
    results: list[Result] = []
    for size in (1000, 5000):
        results += await run_duckdb(count, rounds, size)
    try:
        for size in (1000, 5000):
            results += await run_postgres(count, rounds, size)
    except OSError as exc:
        results.append(Result("postgres unreachable", "postgres", 0.0, "rows/s",
                              note=f"{URL}: {exc}"))
    return results
