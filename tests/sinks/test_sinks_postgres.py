"""The PostgreSQL sink: COPY loads exactly once, acks in the sink's own transaction when
the stream lives in the same database (also across a SIGKILL right after the commit),
the sink-side frontier otherwise, and poison rows dead-lettered. Every test works in its
own schema, dropped afterwards."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from _sink_helpers import backlog, run_pipeline
from rheo_flow import Event, InvalidArgument, Lease, Rheo
from rheo_flow.backends import PostgresBackend
from rheo_flow.pipeline import Message
from rheo_flow.sinks import Column, PostgresSink, RowStatus, Span

WaitUntil = Callable[..., Awaitable[None]]
WORKER = Path(__file__).with_name("_sink_worker.py")

COLUMNS = [
    Column("event_id", "TEXT", "event.id"),
    Column("part", "INTEGER", "event.partition"),
    Column("seq", "BIGINT", "event.sequence"),
    Column("customer", "TEXT", "data.customer"),
    Column("amount", "BIGINT", "data.amount", check="amount >= 0"),
    Column("data", "JSONB", "data"),
]


@pytest.fixture
def schema(postgres_schema: str) -> str:
    """A schema name of this test only; dropped (with whatever it holds) afterwards."""
    return postgres_schema


@pytest.fixture
async def pool(postgres_url: str, schema: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the test server (closed afterwards)."""
    p = await asyncpg.create_pool(postgres_url, min_size=1, max_size=6)
    try:
        yield p
    finally:
        await p.close()


def leased(ids: list[str], *, part: int = 0, first: int = 1) -> list[Message]:
    """Messages for events ``ids`` (sequences first, first+1, ... of one partition)."""
    now = int(time.time() * 1000)
    return [Message(Lease(lease_id=f"{seq:032x}", receipt="r", group="g", consumer_id="c",
                          event=Event("orders", part, seq, event_id, "t",
                                      {"amount": seq, "customer": "c"}, None, {}, now),
                          attempt=1, deadline_ms=now + 60_000))
            for seq, event_id in enumerate(ids, start=first)]


# Acked in the sink's transaction ---------------------------------------------------------------


async def test_acks_commit_with_the_rows_when_the_stream_shares_the_database(
        pool: asyncpg.Pool, schema: str, wait_until: WaitUntil) -> None:
    backend = PostgresBackend(pool=pool, schema=schema)
    async with Rheo(backend) as rheo, PostgresSink(
            pool=pool, table=f"{schema}.orders", columns=COLUMNS, settle_with=backend) as sink:
        ids = await backlog(rheo, 5_000)
        pipeline = await run_pipeline(rheo, sink, 5_000, wait_until, rows=2_000)
        stats = pipeline.producer.stats()
        # The sink acked every lease in its transactions; the pipeline only released them.
        assert stats.confirmed == 5_000
        assert stats.acked == 0
        assert sink.stats().settled == 5_000
        assert await rheo.frontier("orders", "warehouse") == await rheo.high_water("orders")
        rows = await pool.fetch(f'SELECT event_id FROM "{schema}".orders')
        assert sorted(r[0] for r in rows) == sorted(ids)
        assert sink.settles
        assert await sink.progress("orders", "warehouse") == []


@pytest.mark.parametrize("shared", [True, False], ids=["acked-in-sink", "sink-frontier"])
async def test_poison_rows_are_dead_lettered_and_their_neighbours_written(
        pool: asyncpg.Pool, schema: str, wait_until: WaitUntil, shared: bool) -> None:
    poison = {17: -1, 2_500: "not a number", 2_501: -5, 7_777: 2**70, 9_999: -3}
    backend = PostgresBackend(pool=pool, schema=schema) if shared else None
    rheo = Rheo(backend if backend is not None else "memory://")
    async with rheo, PostgresSink(pool=pool, table=f"{schema}.orders", columns=COLUMNS,
                                  settle_with=backend) as sink:
        await backlog(rheo, 10_000, poison=poison)
        await run_pipeline(rheo, sink, 10_000, wait_until, rows=2_000)
        dead = await rheo.dead_letters("orders", "warehouse")
        reasons = {int(d.event_id.removeprefix("order-")): d.reason for d in dead}
        assert sorted(reasons) == sorted(poison)
        assert "check constraint" in reasons[17]
        assert all(r.startswith("sink_invalid: ") for r in reasons.values())
        count = await pool.fetchrow(f'SELECT count(*), count(DISTINCT event_id), '
                                    f'min(amount) FROM "{schema}".orders')
        assert tuple(count) == (10_000 - len(poison), 10_000 - len(poison), 0)
        neighbours = await pool.fetchval(
            f'SELECT count(*) FROM "{schema}".orders WHERE event_id = ANY($1)',
            [f"order-{n}" for n in (16, 18, 2_499, 2_502, 7_776, 7_778, 9_998)])
        assert neighbours == 7
        assert await rheo.frontier("orders", "warehouse") == await rheo.high_water("orders")


# The sink-side frontier ------------------------------------------------------------------------


async def test_a_redelivered_batch_is_skipped_not_written_again(
        pool: asyncpg.Pool, schema: str) -> None:
    async with PostgresSink(pool=pool, table=f"{schema}.orders", columns=COLUMNS) as sink:
        batch = leased([f"e{i}" for i in range(100)])
        assert all(r.ok and not r.replayed for r in await sink.write(batch[:60]))
        results = await sink.write(batch)
        assert [r.replayed for r in results] == [True] * 60 + [False] * 40
        assert all(r.status is RowStatus.WRITTEN for r in results)
        assert await pool.fetchval(f'SELECT count(*) FROM "{schema}".orders') == 100
        assert await sink.progress("orders", "g") == [Span(0, 1, 100)]
        assert sink.stats().fallbacks == 0
        # After a reset a deliberate replay writes again; the key keeps one row each.
        assert await sink.reset_progress("orders", "g") == 1
        assert all(r.ok and not r.replayed for r in await sink.write(batch))
        assert await pool.fetchval(f'SELECT count(*) FROM "{schema}".orders') == 100
        assert sink.stats().fallbacks == 1


async def test_concurrent_batches_of_one_group_merge_their_spans(
        pool: asyncpg.Pool, schema: str) -> None:
    async with PostgresSink(pool=pool, table=f"{schema}.orders", columns=COLUMNS) as sink:
        ids = [f"e{i}" for i in range(1_200)]
        chunks = [leased(ids[i:i + 100], first=i + 1) for i in range(0, 1_200, 100)]
        results = await asyncio.gather(*(sink.write(c) for c in chunks))
        assert all(r.ok for batch in results for r in batch)
        spans = await sink.progress("orders", "g")
        covered = {n for s in spans for n in range(s.lo, s.hi + 1)}
        assert covered == set(range(1, 1_201))
        assert len(spans) <= len(chunks)
        # Redelivered, all of them are recognised whatever order the batches committed in.
        results = await sink.write(leased(ids, first=1))
        assert all(r.replayed for r in results)
        assert await pool.fetchval(f'SELECT count(*) FROM "{schema}".orders') == 1_200


async def test_staged_load_keeps_one_row_per_key(pool: asyncpg.Pool, schema: str) -> None:
    batch = leased([f"e{i}" for i in range(50)])
    async with PostgresSink(pool=pool, table=f"{schema}.orders", columns=COLUMNS,
                            load="staged", progress=False) as sink:
        await sink.write(batch[:20])
        assert all(r.ok for r in await sink.write(batch))
        assert await pool.fetchval(f'SELECT count(*) FROM "{schema}".orders') == 50
        assert sink.stats().fallbacks == 0
        poisoned = leased(["x1", "x2", "x3"], first=100)
        poisoned[1].put_data({"amount": -1})
        results = await sink.write(poisoned)
        assert [r.status for r in results] == [RowStatus.WRITTEN, RowStatus.INVALID,
                                               RowStatus.WRITTEN]


async def test_a_transient_failure_asks_for_a_retry(schema: str, postgres_url: str) -> None:
    own = await asyncpg.create_pool(postgres_url, min_size=1, max_size=1)
    sink = PostgresSink(pool=own, table=f"{schema}.orders", columns=COLUMNS)
    await sink.open()
    await own.close()
    results = await sink.write(leased(["a", "b"]))
    assert {r.status for r in results} == {RowStatus.RETRY}
    assert sink.stats().retry == 2


# Tables and arguments --------------------------------------------------------------------------


async def test_existing_tables_are_checked(pool: asyncpg.Pool, schema: str) -> None:
    with pytest.raises(InvalidArgument, match="does not exist"):
        await PostgresSink(pool=pool, table=f"{schema}.orders", columns=COLUMNS,
                           create=False).open()
    await pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    await pool.execute(f'CREATE TABLE "{schema}".nokey (event_id text, part int, seq bigint, '
                       'customer text, amount bigint, data jsonb)')
    await pool.execute(f'CREATE TABLE "{schema}".short (event_id text PRIMARY KEY)')
    with pytest.raises(InvalidArgument, match="needs a primary key or unique index on "
                                              "event_id"):
        await PostgresSink(pool=pool, table=f"{schema}.nokey", columns=COLUMNS).open()
    with pytest.raises(InvalidArgument, match=r"has no column.*part, seq"):
        await PostgresSink(pool=pool, table=f"{schema}.short", columns=COLUMNS).open()


def test_bad_arguments_are_refused(postgres_url: str) -> None:
    with pytest.raises(InvalidArgument, match="exactly one of pool= or url="):
        PostgresSink(table="t")
    with pytest.raises(InvalidArgument, match="not a PostgreSQL URL"):
        PostgresSink(table="t", url="nope")
    with pytest.raises(InvalidArgument, match="settle_with must be the PostgresBackend"):
        PostgresSink(table="t", url=postgres_url, settle_with=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="pool_max_size"):
        PostgresSink(table="t", url=postgres_url, pool_max_size=0)


async def test_an_unreachable_server_is_a_clear_error_without_the_password() -> None:
    from rheo_flow import BackendUnavailable

    sink = PostgresSink(table="t", url="postgresql://u:secret@127.0.0.1:1/db")
    with pytest.raises(BackendUnavailable) as info:
        await sink.open()
    assert "secret" not in str(info.value)
    assert "***" in str(info.value)


# A crash right after the sink's commit ---------------------------------------------------------


async def _worker(*args: str) -> tuple[int, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode is not None
    if proc.returncode == 0:
        return 0, json.loads(out)
    return proc.returncode, err.decode()


async def test_a_sigkill_right_after_the_commit_neither_loses_nor_duplicates(
        pool: asyncpg.Pool, schema: str, postgres_url: str) -> None:
    backend = PostgresBackend(pool=pool, schema=schema)
    async with Rheo(backend) as rheo:
        ids = await backlog(rheo, 50_000)
    args = ["postgres", "postgres", "--target", postgres_url, "--schema", schema]

    code, err = await _worker(*args, "--kill-after-commits", "4")
    assert code == -signal.SIGKILL, err
    committed = await pool.fetchval(f'SELECT count(*) FROM "{schema}".orders_sink')
    assert 0 < committed < 50_000
    # The acks committed with the rows: the frontier never passes what was written.
    async with Rheo(PostgresBackend(pool=pool, schema=schema)) as rheo:
        assert sum((await rheo.frontier("orders", "warehouse")).values()) <= committed

    code, stats = await _worker(*args)
    assert code == 0, stats
    # Nothing committed came back: no replay, no key conflict, only the missing rows.
    assert stats["written"] == 50_000 - committed
    assert stats["replayed"] == stats["fallbacks"] == stats["invalid"] == 0
    assert stats["settled"] == stats["written"]
    assert stats["acked"] == 0
    rows = await pool.fetch(f'SELECT event_id FROM "{schema}".orders_sink')
    assert len(rows) == 50_000
    assert {r[0] for r in rows} == set(ids)
    async with Rheo(PostgresBackend(pool=pool, schema=schema)) as rheo:
        assert await rheo.frontier("orders", "warehouse") == await rheo.high_water("orders")
        assert await rheo.dead_letters("orders", "warehouse") == []


async def test_settle_with_needs_the_backend_in_the_sink_database(
        pool: asyncpg.Pool, schema: str, postgres_url: str) -> None:
    backend = PostgresBackend(pool=pool, schema=schema)
    sink = PostgresSink(pool=pool, table=f"{schema}.orders", columns=COLUMNS,
                        settle_with=backend)
    await sink.open()  # opens the backend first: its schema then exists
    assert sink.settles
    # A backend whose schema the sink's database does not have is refused.
    await sink.close()
    await backend.close()

    class Elsewhere(PostgresBackend):
        @property
        def schema(self) -> str:
            return "no_such_schema_anywhere"

    other = Elsewhere(pool=pool, schema=schema)
    with pytest.raises(InvalidArgument, match="not in the sink's database"):
        await PostgresSink(pool=pool, table=f"{schema}.orders2", columns=COLUMNS,
                           settle_with=other).open()
