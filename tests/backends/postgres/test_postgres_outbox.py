"""The outbox on PostgreSQL: ``append`` and ``ack`` with ``connection=``, the
application's own asyncpg connection inside its transaction (docs/outbox.md). Real
PostgreSQL, each test in a schema of its own (dropped afterwards), no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from _doc_blocks import expected_output
from rheo_flow import ACK, InvalidArgument, NewEvent, Query, Rheo, SettleKind, consumer
from rheo_flow.backends import PostgresBackend

ROOT = Path(__file__).resolve().parents[3]

WaitUntil = Callable[..., Awaitable[None]]
"""The ``wait_until`` fixture of conftest.py."""


@pytest.fixture
async def rheo(postgres_rheo: Rheo, postgres_schema: str,
               postgres_admin: asyncpg.Connection) -> Rheo:
    """An opened instance on this test's schema, which also holds the application's
    table ``orders (id int)``."""
    await postgres_admin.execute(f'CREATE TABLE "{postgres_schema}".orders (id int)')
    return postgres_rheo


@pytest.fixture
async def conn(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The application's connection (its search_path knows nothing of the schema)."""
    connection = await asyncpg.connect(postgres_url)
    try:
        yield connection
    finally:
        await connection.close()


def _orders(schema: str) -> str:
    return f'"{schema}".orders'


async def _orders_count(admin: asyncpg.Connection, schema: str) -> int:
    count: int = await admin.fetchval(f"SELECT count(*) FROM {_orders(schema)}")
    return count


# Appending in the caller's transaction ------------------------------------------


async def test_a_commit_makes_the_events_visible_and_delivered_once_per_group(
        rheo: Rheo, conn: asyncpg.Connection, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    for group in ("a", "b"):
        await rheo.create_group("s", group)
    async with conn.transaction():
        await conn.execute(f"INSERT INTO {_orders(postgres_schema)} VALUES (1)")
        stored = await rheo.append("s", [NewEvent("order.placed", {"id": 1}, id="o-1"),
                                         NewEvent("order.paid", {"id": 1})], connection=conn)
        assert [e.sequence for e in stored] == [1, 2]
        # Not visible to anyone else before the commit.
        assert (await rheo.stream_info("s")).high_water == {0: 0}
        assert await rheo.fetch("s", "a") == []
    info = await rheo.stream_info("s")
    assert info.high_water == {0: 2}
    events = (await rheo.query_page(Query(stream="s"))).events
    assert [(e.id, e.type, e.data) for e in events] == [
        ("o-1", "order.placed", {"id": 1}), (stored[1].id, "order.paid", {"id": 1})]
    for group in ("a", "b"):
        leases = await rheo.fetch("s", group, limit=10)
        assert [lease.event.sequence for lease in leases] == [1, 2]
        assert all(r.ok for r in await rheo.ack(leases))
        assert await rheo.fetch("s", group, limit=10) == []
    assert await _orders_count(postgres_admin, postgres_schema) == 1


async def test_a_rollback_leaves_no_trace_and_sequences_stay_gapless(
        rheo: Rheo, conn: asyncpg.Connection, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.create_group("s", "g")
    tx = conn.transaction()
    await tx.start()
    await conn.execute(f"INSERT INTO {_orders(postgres_schema)} VALUES (1)")
    gone = await rheo.append("s", NewEvent("t", {"n": 1}, id="x"), partition=1,
                             connection=conn)
    assert gone[0].sequence == 1
    await tx.rollback()
    assert (await rheo.stream_info("s")).high_water == {0: 0, 1: 0}
    assert (await rheo.query_page(Query(stream="s"))).events == []
    assert await rheo.fetch("s", "g") == []
    assert await _orders_count(postgres_admin, postgres_schema) == 0
    # The next append takes the sequence the rolled-back one had; the id is free again.
    [again] = await rheo.append("s", NewEvent("t", {"n": 2}, id="x"), partition=1)
    assert (again.sequence, again.data) == (1, {"n": 2})


async def test_a_repeated_id_returns_the_stored_event_without_aborting_the_transaction(
        rheo: Rheo, conn: asyncpg.Connection, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    [first] = await rheo.append("s", NewEvent("t", {"n": 1}, id="dup"))
    async with conn.transaction():
        [same, fresh] = await rheo.append(
            "s", [NewEvent("t", {"n": 2}, id="dup"), NewEvent("t", {"n": 3}, id="new")],
            connection=conn)
        # Appended earlier in this same transaction: returned as stored too.
        [again] = await rheo.append("s", NewEvent("t", {"n": 4}, id="new"), connection=conn)
        await conn.execute(f"INSERT INTO {_orders(postgres_schema)} VALUES (7)")
    assert (same.sequence, same.data) == (first.sequence, {"n": 1})
    assert (fresh.sequence, again.sequence, again.data) == (2, 2, {"n": 3})
    assert (await rheo.stream_info("s")).high_water == {0: 2}
    assert await _orders_count(postgres_admin, postgres_schema) == 1


async def test_a_racing_append_of_the_same_id_leaves_the_waiting_transaction_usable(
        rheo: Rheo, conn: asyncpg.Connection, postgres_url: str, postgres_schema: str,
        postgres_admin: asyncpg.Connection, wait_until: WaitUntil) -> None:
    # Two application transactions append id "same" to different partitions: the second
    # waits on the first's uncommitted index entry, then meets it stored once it commits.
    await rheo.create_stream("s", partitions=2)
    other = await asyncpg.connect(postgres_url)
    try:
        first_tx = other.transaction()
        await first_tx.start()
        [first] = await rheo.append("s", NewEvent("t", {"n": 1}, id="same"), partition=0,
                                    connection=other)
        async with conn.transaction():
            racing = asyncio.create_task(rheo.append(
                "s", [NewEvent("t", {"n": 2}, id="same"), NewEvent("t", {"n": 3}, id="next")],
                partition=1, connection=conn))
            await wait_until(lambda: _waiting_on_a_lock(postgres_admin), timeout=10,
                             message="the racing append waiting on the first's index entry")
            await first_tx.commit()
            [same, fresh] = await racing
            await conn.execute(f"INSERT INTO {_orders(postgres_schema)} VALUES (1)")
    finally:
        await other.close()
    assert (same.partition, same.sequence, same.data) == (0, first.sequence, {"n": 1})
    assert (fresh.partition, fresh.sequence) == (1, 1)  # no sequence lost to the race
    assert (await rheo.stream_info("s")).high_water == {0: 1, 1: 1}
    assert await _orders_count(postgres_admin, postgres_schema) == 1


async def test_a_racing_append_of_one_event_with_the_same_id_consumes_no_sequence(
        rheo: Rheo, conn: asyncpg.Connection, postgres_url: str,
        postgres_admin: asyncpg.Connection, wait_until: WaitUntil) -> None:
    # The append of one event takes its own path (no subtransaction): the id stored by a
    # racing transaction that commits first is answered, and the waiting transaction's
    # partition keeps its high water.
    await rheo.create_stream("s", partitions=2)
    other = await asyncpg.connect(postgres_url)
    try:
        first_tx = other.transaction()
        await first_tx.start()
        [first] = await rheo.append("s", NewEvent("t", {"n": 1}, id="same"), partition=0,
                                    connection=other)
        async with conn.transaction():
            racing = asyncio.create_task(rheo.append(
                "s", NewEvent("t", {"n": 2}, id="same"), partition=1, connection=conn))
            await wait_until(lambda: _waiting_on_a_lock(postgres_admin), timeout=10,
                             message="the racing append waiting on the first's index entry")
            await first_tx.commit()
            [same] = await racing
            [fresh] = await rheo.append("s", NewEvent("t", {"n": 3}, id="next"), partition=1,
                                        connection=conn)
    finally:
        await other.close()
    assert (same.partition, same.sequence, same.data) == (0, first.sequence, {"n": 1})
    assert (fresh.partition, fresh.sequence) == (1, 1)  # no sequence lost to the race
    assert (await rheo.stream_info("s")).high_water == {0: 1, 1: 1}


async def test_appends_of_one_event_open_no_subtransaction(
        rheo: Rheo, conn: asyncpg.Connection) -> None:
    # A subtransaction that writes takes a transaction id of its own; past 64 of them in
    # one transaction every session's snapshots get slower. 200 appends of one event
    # take none: the ids assigned after this transaction's own (by anyone) stay far
    # below 200, whatever else the server runs meanwhile.
    await rheo.create_stream("s", partitions=4)
    async with conn.transaction():
        for i in range(200):
            await rheo.append("s", NewEvent("t", {"n": i}), connection=conn)
        await rheo.append("s", NewEvent("t", {"n": 0}, id="again"), connection=conn)
        await rheo.append("s", NewEvent("t", {"n": 1}, id="again"), connection=conn)
        own = int(await conn.fetchval("SELECT pg_current_xact_id()::text"))
    after = int(await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))
    assert after - own - 1 < 150
    assert sum((await rheo.stream_info("s")).high_water.values()) == 201


async def _waiting_on_a_lock(admin: asyncpg.Connection) -> bool:
    """Whether some session of this database waits on a lock."""
    waiting: bool = await admin.fetchval(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'")
    return waiting


async def test_a_transaction_begun_by_hand_and_a_json_codec_of_the_callers_own(
        rheo: Rheo, conn: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t", id="dup"))
    # A codec of the application's own on json must not re-encode what the backend sends.
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads,
                              schema="pg_catalog")
    await conn.execute("BEGIN")
    [dup, event] = await rheo.append(
        "s", [NewEvent("t", id="dup"), NewEvent("t", {"a": [1, "b"]}, headers={"h": "v"})],
        connection=conn)
    await conn.execute("COMMIT")
    assert (dup.sequence, event.sequence) == (1, 2)
    stored = (await rheo.query_page(Query(stream="s"))).events[1]
    assert (stored.data, stored.headers) == ({"a": [1, "b"]}, {"h": "v"})


async def test_a_connection_from_a_pool_is_taken(rheo: Rheo, postgres_url: str) -> None:
    await rheo.create_stream("s")
    pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=1)
    try:
        for n in (1, 2):  # a new proxy each time over the same connection
            async with pool.acquire() as pooled, pooled.transaction():
                [event] = await rheo.append("s", NewEvent("t", {"n": n}), connection=pooled)
            assert event.sequence == n
    finally:
        await pool.close()
    assert (await rheo.stream_info("s")).high_water == {0: 2}


# What is refused ---------------------------------------------------------------


async def test_connections_the_backend_cannot_write_on_are_refused(
        rheo: Rheo, conn: asyncpg.Connection, postgres_url: str,
        postgres_schema: str) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    leases = await rheo.fetch("s", "g")
    lite = sqlite3.connect(":memory:")
    try:
        for call in (lambda c: rheo.append("s", NewEvent("t"), connection=c),
                     lambda c: rheo.ack(leases, connection=c)):
            with pytest.raises(InvalidArgument, match=r"asyncpg Connection.*psycopg 3"):
                await call(lite)
            with pytest.raises(InvalidArgument, match="inside a transaction"):
                await call(conn)
    finally:
        lite.close()
    # The backend's schema missing there (dropped in this very transaction).
    tx = conn.transaction()
    await tx.start()
    await conn.execute(f'DROP SCHEMA "{postgres_schema}" CASCADE')
    with pytest.raises(InvalidArgument, match=f"schema '{postgres_schema}' does not exist"):
        await rheo.append("s", NewEvent("t"), connection=conn)
    assert await conn.fetchval("SELECT 1") == 1, "the check left the transaction usable"
    await tx.rollback()
    assert (await rheo.stream_info("s")).high_water == {0: 1}
    assert all(r.ok for r in await rheo.ack(leases))


async def test_a_connection_to_another_database_is_refused(
        rheo: Rheo, postgres_url: str, postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    with contextlib.suppress(asyncpg.DuplicateDatabaseError):
        await postgres_admin.execute("CREATE DATABASE rheo_outbox_other")
    base, _, query = postgres_url.partition("?")
    other_url = base.rsplit("/", 1)[0] + "/rheo_outbox_other" + (f"?{query}" if query else "")
    other = await asyncpg.connect(other_url)
    try:
        async with other.transaction():
            with pytest.raises(InvalidArgument, match="reaches database 'rheo_outbox_other'"
                               ) as caught:
                await rheo.append("s", NewEvent("t"), connection=other)
            assert "postgres@" not in str(caught.value)
            assert "://" not in str(caught.value)
    finally:
        await other.close()
    assert (await rheo.stream_info("s")).high_water == {0: 0}


# Wake-ups -----------------------------------------------------------------------


async def test_an_idle_consumer_is_woken_at_the_commit_and_not_by_a_rollback(
        rheo: Rheo, conn: asyncpg.Connection, wait_until: WaitUntil) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g")
    seen: list[int] = []

    @consumer(stream="s", group="g", poll_ms=30_000)
    async def record(event: Any, context: Any) -> Any:
        seen.append(event.data["n"])
        return ACK

    backend = rheo.backend
    assert isinstance(backend, PostgresBackend)
    listener = backend._listener
    async with record.start(rheo) as group:
        await wait_until(lambda: "s" in listener.waiters)  # idle: its next poll is in 30 s
        tx = conn.transaction()
        await tx.start()
        await rheo.append("s", NewEvent("t", {"n": 1}), connection=conn)
        await tx.rollback()
        async with conn.transaction():
            await rheo.append("s", NewEvent("t", {"n": 2}), connection=conn)
            assert listener.notes.get("s", 0) == 0
        await wait_until(lambda: seen == [2], timeout=10)  # far sooner than its 30 s poll
        await wait_until(lambda: group.stats.acked == 1)
        # Notifications of one session arrive in the order of its commits: had the
        # rolled-back append notified, that would have come first.
        assert listener.notes["s"] == 1
    assert seen == [2]


async def test_under_repeatable_read_a_racing_append_is_the_drivers_serialization_error(
        rheo: Rheo, conn: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    tx = conn.transaction(isolation="repeatable_read")
    await tx.start()
    await conn.fetchval("SELECT 1")  # the transaction's snapshot
    await rheo.append("s", NewEvent("t"))
    with pytest.raises(asyncpg.SerializationError):
        await rheo.append("s", NewEvent("t"), connection=conn)
    await tx.rollback()
    async with conn.transaction(isolation="repeatable_read"):  # retried: it goes through
        [event] = await rheo.append("s", NewEvent("t"), connection=conn)
    assert event.sequence == 2


# Acking in the caller's transaction ----------------------------------------------


async def test_acks_commit_and_roll_back_with_the_callers_writes(
        rheo: Rheo, conn: asyncpg.Connection, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(3)])
    leases = await rheo.fetch("s", "g", limit=3)
    tx = conn.transaction()
    await tx.start()
    await conn.execute(f"INSERT INTO {_orders(postgres_schema)} VALUES (0)")
    assert all(r.ok for r in await rheo.ack(leases, connection=conn))
    await tx.rollback()
    assert await rheo.frontier("s", "g") == {0: 0}, "the acks rolled back with the insert"
    assert await _orders_count(postgres_admin, postgres_schema) == 0
    async with conn.transaction():
        await conn.execute(f"INSERT INTO {_orders(postgres_schema)} VALUES (1)")
        results = await rheo.ack(leases, connection=conn)
        assert await rheo.frontier("s", "g") == {0: 0}, "not before the commit"
    assert [(r.ok, r.repeated) for r in results] == [(True, False)] * 3
    assert await rheo.frontier("s", "g") == {0: 3}
    assert await _orders_count(postgres_admin, postgres_schema) == 1
    assert [r.repeated for r in await rheo.ack(leases)] == [True] * 3


async def test_a_stale_lease_in_the_transaction_is_a_failed_result(
        rheo: Rheo, conn: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t"), NewEvent("t")])
    old, other = await rheo.fetch("s", "g", limit=2)
    await rheo.nack(old, "again")
    [newer] = await rheo.fetch("s", "g", limit=1)  # the same event, a later attempt
    async with conn.transaction():
        stale, fine = await rheo.ack([old, other], connection=conn)
        assert stale.kind is SettleKind.STALE_LEASE
        assert not stale.ok
        assert fine.ok
        assert await conn.fetchval("SELECT 1") == 1, "the transaction goes on"
    assert await rheo.frontier("s", "g") == {0: 0}
    assert (await rheo.ack(newer))[0].ok
    assert await rheo.frontier("s", "g") == {0: 2}


async def test_read_process_write_in_one_transaction(
        rheo: Rheo, conn: asyncpg.Connection, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("orders")
    await rheo.create_stream("invoices")
    await rheo.append("orders", NewEvent("order.placed", {"id": 5}))
    [lease] = await rheo.fetch("orders", "billing")
    async with conn.transaction():
        [result] = await rheo.ack(lease, connection=conn)
        assert result.ok
        await conn.execute(f"INSERT INTO {_orders(postgres_schema)} VALUES ($1)",
                           lease.event.data["id"])
        [derived] = await rheo.append(
            "invoices", NewEvent("invoice.due", {"order": 5}, id=f"invoice-{lease.event.id}"),
            connection=conn)
    assert derived.sequence == 1
    assert await rheo.frontier("orders", "billing") == {0: 1}
    assert (await rheo.stream_info("invoices")).high_water == {0: 1}
    assert await _orders_count(postgres_admin, postgres_schema) == 1


# What an open transaction holds ------------------------------------------------


async def test_an_open_transaction_blocks_only_its_own_partitions(
        rheo: Rheo, conn: asyncpg.Connection, postgres_admin: asyncpg.Connection,
        wait_until: WaitUntil) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.create_stream("t")
    async with conn.transaction():
        await rheo.append("s", NewEvent("t"), partition=0, connection=conn)
        # Other partitions of the stream, other streams: not held up (blocked, they would
        # wait for the commit, which comes only after them: the deadline would pass).
        others = await asyncio.wait_for(asyncio.gather(
            rheo.append("s", [NewEvent("t")] * 10, partition=1),
            rheo.append("t", [NewEvent("t")] * 10),
            *(rheo.append("s", NewEvent("t"), partition=1) for _ in range(10))), 5)
        batch = [e.sequence for e in others[0]]
        assert batch == list(range(batch[0], batch[0] + 10))  # one append: contiguous
        singles = [e.sequence for [e] in others[2:]]
        assert sorted(batch + singles) == list(range(1, 21))  # partition 1, in any order
        # Readers neither: a fetch, a query, stream_info.
        assert len(await rheo.fetch("s", "g", limit=100)) == 20  # every partition
        assert (await rheo.stream_info("s")).high_water == {0: 0, 1: 20}
        # The same partition waits for the row lock until the commit.
        same = asyncio.create_task(rheo.append("s", NewEvent("t"), partition=0))
        pid = conn.get_server_pid()

        async def waiting_on_the_lock() -> bool:
            blocked: int = await postgres_admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                pid)
            return blocked == 1

        await wait_until(waiting_on_the_lock)
        assert not same.done()
    [after] = await asyncio.wait_for(same, 5)
    assert after.sequence == 2


# The page -------------------------------------------------------------------------


def test_the_postgresql_example_of_the_outbox_page_prints_what_it_says(
        postgres_url: str, postgres_schema: str) -> None:
    page = (ROOT / "docs/outbox.md").read_text()
    section = page.split("## PostgreSQL (asyncpg)", 1)[1].split("\n## ", 1)[0]
    [code] = python_blocks_of(section)
    env = {**os.environ, "DATABASE_URL": postgres_url, "OUTBOX_SCHEMA": postgres_schema,
           "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected_output(code)


def python_blocks_of(text: str) -> list[str]:
    """The ```python blocks of a part of a page (:func:`python_blocks` reads a file)."""
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)
