"""Suite ``sinks``: sink throughput against a raw bulk insert of the same rows.

For each sink, the same messages (synthetic leased events, 8 partitions, a
small JSON payload) are written in batches, one transaction per batch, into a
fresh table with the same definition (primary key on the event id):

* DuckDB (a database file): :class:`~rheo_flow.sinks.DuckDBSink.write` against
  DuckDB's appender fed the already-mapped row tuples, one transaction per
  batch (the fastest raw path without pyarrow/pandas);
* PostgreSQL (``RHEO_POSTGRES_URL``, default
  ``postgresql://postgres@127.0.0.1:5432/test``):
  :class:`~rheo_flow.sinks.PostgresSink.write` (``load="auto"``, and the
  always-staged ``load="staged"``) against a raw ``copy_records_to_table`` of
  the mapped rows straight into the target.

The sink's time includes everything it does per batch: mapping messages to
rows, the hop to its thread (DuckDB), the sink-side frontier read and update,
and the idempotent load. Rounds alternate between raw and sink, each on a
fresh table; medians are reported (rows/s).
"""

from __future__ import annotations

import asyncio
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
                      key=f"c-{i % 1000}", headers={}, appended_at_ms=now)
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


# DuckDB ------------------------------------------------------------------------------

def duckdb_raw(path: Path, ddl: str, names: list[str], rows: list[tuple[Any, ...]],
               size: int) -> float:
    """Appender into a fresh table, one transaction per batch; rows per second."""
    import duckdb

    con = duckdb.connect(str(path))
    try:
        con.execute(ddl)
        appender = con.appender("t", columns=names)
        started = time.perf_counter()
        for batch in batches(rows, size):
            con.execute("BEGIN TRANSACTION")
            appender.append_rows(batch)
            appender.flush()
            con.execute("COMMIT")
        elapsed = time.perf_counter() - started
        if con.execute("SELECT count(*) FROM t").fetchone() != (len(rows),):
            raise RuntimeError("raw DuckDB insert lost rows")
        return len(rows) / elapsed
    finally:
        con.close()


async def duckdb_round(directory: Path, msgs: list[Message], size: int) -> list[float]:
    """Raw, then the sink with 1 and 2 batches in flight, each into a fresh database file."""
    cols = columns("JSON")
    mapping = RowMapping(cols)
    rows = [mapping.row(m) for m in msgs]
    tag = uuid.uuid4().hex[:8]
    rates = [await asyncio.to_thread(duckdb_raw, directory / f"raw-{tag}.duckdb",
                                     mapping.create_table('"t"'), list(mapping.names), rows,
                                     size)]
    for inflight in (1, 2):
        sink = DuckDBSink(directory / f"sink-{inflight}-{tag}.duckdb", table="t", columns=cols)
        async with sink:
            rates.append(await timed(lambda s=sink, n=inflight: write_all(s, msgs, size, n),
                                     len(msgs)))
            if await sink.query("SELECT count(*) FROM t") != [(len(msgs),)]:
                raise RuntimeError("the DuckDB sink lost rows")
    return rates


async def run_duckdb(count: int, rounds: int, size: int) -> list[Result]:
    """Median raw and sink rates over ``rounds`` alternating rounds."""
    msgs = messages(count)
    measured: list[list[float]] = []
    with tempfile.TemporaryDirectory(prefix="rheo-sink-bench-") as tmp:
        for _ in range(rounds):
            measured.append(await duckdb_round(Path(tmp), msgs, size))
    raw, one, two = (statistics.median(m[i] for m in measured) for i in range(3))
    note = f"{count} rows, batches of {size}, database file"
    return [
        Result(f"raw appender, batch {size}", "duckdb", raw, "rows/s", note=note),
        Result.compared(f"DuckDBSink.write, batch {size}", "duckdb", one, "rows/s", raw, note),
        Result.compared(f"DuckDBSink.write, batch {size}, 2 in flight", "duckdb", two,
                        "rows/s", raw, note),
    ]


# PostgreSQL ------------------------------------------------------------------------------

async def run_postgres(count: int, rounds: int, size: int) -> list[Result]:
    """Median raw COPY and sink rates (auto load with 1 and 2 batches in flight, staged
    load) over alternating rounds."""
    import asyncpg

    schema = f"sink_bench_{RUN}"
    cols = columns("JSONB")
    mapping = RowMapping(cols)
    msgs = messages(count)
    rows = [mapping.row(m) for m in msgs]
    pool = await asyncpg.create_pool(URL, min_size=2, max_size=2,
                                     server_settings={"jit": "off"})
    variants: list[tuple[str, Load, int]] = [("auto", "auto", 1), ("auto2", "auto", 2),
                                             ("staged", "staged", 1)]
    measured: dict[str, list[float]] = {"raw": [], **{v[0]: [] for v in variants}}
    try:
        await pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        for n in range(rounds):
            table = f"raw_{n}_{size}"
            await pool.execute(mapping.create_table(f'"{schema}"."{table}"'))

            async def raw(table: str = table) -> None:
                async with pool.acquire() as conn:
                    for batch in batches(rows, size):
                        async with conn.transaction():
                            await conn.copy_records_to_table(
                                table, records=batch, columns=list(mapping.names),
                                schema_name=schema)

            measured["raw"].append(await timed(raw, count))
            for name, load, inflight in variants:
                sink = PostgresSink(pool=pool, table=f"{schema}.{name}_{n}_{size}",
                                    columns=cols, load=load)
                async with sink:
                    measured[name].append(await timed(
                        lambda s=sink, k=inflight: write_all(s, msgs, size, k), count))
                    if sink.stats().written != count:
                        raise RuntimeError("the PostgreSQL sink lost rows")
    finally:
        await pool.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await pool.close()
    raw = statistics.median(measured["raw"])
    note = f"{count} rows, batches of {size}"
    return [
        Result(f"raw copy_records_to_table, batch {size}", "postgres", raw, "rows/s",
               note=note),
        Result.compared(f"PostgresSink.write, batch {size}", "postgres",
                        statistics.median(measured["auto"]), "rows/s", raw, note),
        Result.compared(f"PostgresSink.write, batch {size}, 2 in flight", "postgres",
                        statistics.median(measured["auto2"]), "rows/s", raw, note),
        Result.compared(f"PostgresSink.write load=staged, batch {size}", "postgres",
                        statistics.median(measured["staged"]), "rows/s", raw, note),
    ]


async def run(quick: bool) -> list[Result]:
    """DuckDB, then PostgreSQL (skipped with a note line when the server is unreachable)."""
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
