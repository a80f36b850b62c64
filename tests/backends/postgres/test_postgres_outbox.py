"""The outbox on PostgreSQL: ``append`` and ``ack`` with ``connection=``, the
application's own asyncpg connection inside its transaction (docs/outbox.md). Real
PostgreSQL, each test in a schema of its own (dropped afterwards), no mocks."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from rheo_flow import ACK, InvalidArgument, NewEvent, Query, Rheo, SettleKind, consumer
from rheo_flow.backends import PostgresBackend

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
            with pytest.raises(InvalidArgument, match="asyncpg Connection.*not supported yet"):
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
    try:
        await postgres_admin.execute("CREATE DATABASE rheo_outbox_other")
    except asyncpg.DuplicateDatabaseError:
        pass
    base, _, query = postgres_url.partition("?")
    other_url = base.rsplit("/", 1)[0] + "/rheo_outbox_other" + (f"?{query}" if query else "")
    other = await asyncpg.connect(other_url)
    try:
        async with other.transaction():
            with pytest.raises(InvalidArgument, match="reaches database 'rheo_outbox_other'"
                               ) as caught:
                await rheo.append("s", NewEvent("t"), connection=other)
            assert "postgres@" not in str(caught.value) and "://" not in str(caught.value)
    finally:
        await other.close()
    assert (await rheo.stream_info("s")).high_water == {0: 0}
