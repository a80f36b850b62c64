"""The outbox on PostgreSQL with psycopg 3 (docs/outbox.md, "psycopg 3"): ``append`` and
``ack`` with ``connection=`` an ``AsyncConnection``, a sync ``Connection``, or SQLAlchemy's
``AsyncSession`` / sync ``Session`` on ``postgresql+psycopg``, inside the application's
transaction. Real PostgreSQL, each test in a schema of its own, no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from _doc_blocks import expected_output
from rheo_flow import ACK, InvalidArgument, NewEvent, Query, Rheo, SettleKind, consumer
from rheo_flow.backends import PostgresBackend

ROOT = Path(__file__).resolve().parents[3]

WaitUntil = Callable[..., Awaitable[None]]


class App:
    """The application's side of one driver: its transaction and its own row, with the
    object it passes as ``connection=``. Sync drivers are called straight from the test
    (they block the loop, as the application's own code would)."""

    connection: Any

    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def insert(self, n: int) -> None:
        raise NotImplementedError

    async def commit(self) -> None:
        raise NotImplementedError

    async def rollback(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def insert_sql(self, n: int) -> str:
        return f'INSERT INTO "{self.schema}".orders VALUES ({n})'


class AsyncPsycopgApp(App):
    async def open(self, url: str) -> None:
        self.connection = await psycopg.AsyncConnection.connect(url)

    async def insert(self, n: int) -> None:
        await self.connection.execute(self.insert_sql(n))

    async def commit(self) -> None:
        await self.connection.commit()

    async def rollback(self) -> None:
        await self.connection.rollback()

    async def close(self) -> None:
        await self.connection.close()


class SyncPsycopgApp(App):
    async def open(self, url: str) -> None:
        self.connection = psycopg.connect(url)

    async def insert(self, n: int) -> None:
        self.connection.execute(self.insert_sql(n))

    async def commit(self) -> None:
        self.connection.commit()

    async def rollback(self) -> None:
        self.connection.rollback()

    async def close(self) -> None:
        self.connection.close()


class AsyncSessionApp(App):
    async def open(self, url: str) -> None:
        self.engine = create_async_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        self.connection = AsyncSession(self.engine)

    async def insert(self, n: int) -> None:
        await self.connection.execute(sa.text(self.insert_sql(n)))

    async def commit(self) -> None:
        await self.connection.commit()

    async def rollback(self) -> None:
        await self.connection.rollback()

    async def close(self) -> None:
        await self.connection.close()
        await self.engine.dispose()


class SessionApp(App):
    async def open(self, url: str) -> None:
        self.engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        self.connection = Session(self.engine)

    async def insert(self, n: int) -> None:
        self.connection.execute(sa.text(self.insert_sql(n)))

    async def commit(self) -> None:
        self.connection.commit()

    async def rollback(self) -> None:
        self.connection.rollback()

    async def close(self) -> None:
        self.connection.close()
        self.engine.dispose()


APPS = {"psycopg-async": AsyncPsycopgApp, "psycopg-sync": SyncPsycopgApp,
        "sqlalchemy-async-session": AsyncSessionApp, "sqlalchemy-session": SessionApp}


@pytest.fixture
async def rheo(postgres_rheo: Rheo, postgres_schema: str,
               postgres_admin: asyncpg.Connection) -> Rheo:
    """An opened instance on this test's schema, which also holds the application's
    table ``orders (id int)``."""
    await postgres_admin.execute(f'CREATE TABLE "{postgres_schema}".orders (id int)')
    return postgres_rheo


@pytest.fixture(params=list(APPS))
async def app(request: pytest.FixtureRequest, postgres_url: str, postgres_schema: str
              ) -> AsyncIterator[App]:
    made = APPS[request.param](postgres_schema)
    await made.open(postgres_url)  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        await made.close()


async def _orders(admin: asyncpg.Connection, schema: str) -> list[int]:
    return [r[0] for r in await admin.fetch(f'SELECT id FROM "{schema}".orders ORDER BY id')]


# Every driver ------------------------------------------------------------------


async def test_a_commit_makes_the_events_visible_and_delivered_once_per_group(
        rheo: Rheo, app: App, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    for group in ("a", "b"):
        await rheo.create_group("s", group)
    await app.insert(1)
    stored = await rheo.append("s", [NewEvent("order.placed", {"id": 1}, id="o-1",
                                              headers={"h": "v"}),
                                     NewEvent("order.paid", {"id": 1}, key="k")],
                               connection=app.connection)
    assert [e.sequence for e in stored] == [1, 2]
    assert (await rheo.stream_info("s")).high_water == {0: 0}, "not before the commit"
    assert await rheo.fetch("s", "a") == []
    await app.commit()
    events = (await rheo.query_page(Query(stream="s"))).events
    assert [(e.id, e.type, e.data, e.key, e.headers) for e in events] == [
        ("o-1", "order.placed", {"id": 1}, None, {"h": "v"}),
        (stored[1].id, "order.paid", {"id": 1}, "k", {})]
    for group in ("a", "b"):
        leases = await rheo.fetch("s", group, limit=10)
        assert [lease.event.sequence for lease in leases] == [1, 2]
        assert all(r.ok for r in await rheo.ack(leases))
        assert await rheo.fetch("s", group, limit=10) == []
    assert await _orders(postgres_admin, postgres_schema) == [1]


async def test_a_rollback_leaves_no_trace_and_sequences_stay_gapless(
        rheo: Rheo, app: App, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.create_group("s", "g")
    # The append first: the transaction begins with it (psycopg outside autocommit).
    [gone] = await rheo.append("s", NewEvent("t", {"n": 1}, id="x"), partition=1,
                               connection=app.connection)
    await app.insert(1)
    assert gone.sequence == 1
    await app.rollback()
    assert (await rheo.stream_info("s")).high_water == {0: 0, 1: 0}
    assert (await rheo.query_page(Query(stream="s"))).events == []
    assert await rheo.fetch("s", "g") == []
    assert await _orders(postgres_admin, postgres_schema) == []
    [again] = await rheo.append("s", NewEvent("t", {"n": 2}, id="x"), partition=1,
                                connection=app.connection)
    await app.commit()
    assert (again.sequence, again.data) == (1, {"n": 2})
    [next_one] = await rheo.append("s", NewEvent("t", {"n": 3}), partition=1)
    assert next_one.sequence == 2


async def test_a_repeated_id_returns_the_stored_event_without_aborting_the_transaction(
        rheo: Rheo, app: App, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    [first] = await rheo.append("s", NewEvent("t", {"n": 1}, id="dup"))
    [same, fresh] = await rheo.append(
        "s", [NewEvent("t", {"n": 2}, id="dup"), NewEvent("t", {"n": 3}, id="new")],
        connection=app.connection)
    [again] = await rheo.append("s", NewEvent("t", {"n": 4}, id="new"),
                                connection=app.connection)
    await app.insert(7)  # the transaction goes on
    await app.commit()
    assert (same.sequence, same.data) == (first.sequence, {"n": 1})
    assert (fresh.sequence, again.sequence, again.data) == (2, 2, {"n": 3})
    assert (await rheo.stream_info("s")).high_water == {0: 2}
    assert await _orders(postgres_admin, postgres_schema) == [7]


async def test_acks_commit_and_roll_back_with_the_callers_writes(
        rheo: Rheo, app: App, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(3)])
    leases = await rheo.fetch("s", "g", limit=3)
    await app.insert(0)
    assert all(r.ok for r in await rheo.ack(leases, connection=app.connection))
    await app.rollback()
    assert await rheo.frontier("s", "g") == {0: 0}, "the acks rolled back with the insert"
    await app.insert(1)
    # A repeated lease: the batch goes lease by lease (the settle function).
    results = await rheo.ack([*leases, leases[0]], connection=app.connection)
    assert await rheo.frontier("s", "g") == {0: 0}, "not before the commit"
    await app.commit()
    assert [(r.ok, r.repeated) for r in results] == [(True, False)] * 3 + [(True, True)]
    assert await rheo.frontier("s", "g") == {0: 3}
    assert await _orders(postgres_admin, postgres_schema) == [1]


async def test_a_stale_lease_is_a_failed_result_and_the_transaction_goes_on(
        rheo: Rheo, app: App, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t"), NewEvent("t")])
    old, other = await rheo.fetch("s", "g", limit=2)
    await rheo.nack(old, "again")
    [newer] = await rheo.fetch("s", "g", limit=1)
    stale, fine = await rheo.ack([old, other], connection=app.connection)
    assert (stale.kind, stale.ok, fine.ok) == (SettleKind.STALE_LEASE, False, True)
    await app.insert(3)
    await app.commit()
    assert await _orders(postgres_admin, postgres_schema) == [3]
    assert (await rheo.ack(newer))[0].ok
    assert await rheo.frontier("s", "g") == {0: 2}


async def test_a_connection_to_another_database_is_refused(
        rheo: Rheo, postgres_url: str, postgres_admin: asyncpg.Connection,
        postgres_schema: str) -> None:
    await rheo.create_stream("s")
    with contextlib.suppress(asyncpg.DuplicateDatabaseError):
        await postgres_admin.execute("CREATE DATABASE rheo_outbox_other")
    base, _, query = postgres_url.partition("?")
    other_url = base.rsplit("/", 1)[0] + "/rheo_outbox_other" + (f"?{query}" if query else "")
    for kind, cls in APPS.items():
        other = cls(postgres_schema)
        await other.open(other_url)  # type: ignore[attr-defined]
        try:
            with pytest.raises(InvalidArgument, match="reaches database 'rheo_outbox_other'"
                               ) as caught:
                await rheo.append("s", NewEvent("t"), connection=other.connection)
            assert "://" not in str(caught.value), kind
        finally:
            await other.rollback()
            await other.close()
    assert (await rheo.stream_info("s")).high_water == {0: 0}


# psycopg's transaction states ----------------------------------------------------


async def test_an_autocommit_connection_needs_a_transaction_block(
        rheo: Rheo, postgres_url: str) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    leases = await rheo.fetch("s", "g")
    conn = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    sync_conn = psycopg.connect(postgres_url, autocommit=True)
    try:
        for c in (conn, sync_conn):
            with pytest.raises(InvalidArgument, match=r"inside a transaction.*autocommit"):
                await rheo.append("s", NewEvent("t"), connection=c)
            with pytest.raises(InvalidArgument, match=r"inside a transaction.*autocommit"):
                await rheo.ack(leases, connection=c)
        async with conn.transaction():
            [event] = await rheo.append("s", NewEvent("t"), connection=conn)
        with sync_conn.transaction():
            [acked] = await rheo.ack(leases, connection=sync_conn)
    finally:
        await conn.close()
        sync_conn.close()
    assert (event.sequence, acked.ok) == (2, True)
    assert await rheo.frontier("s", "g") == {0: 1}


async def test_a_failed_transaction_is_refused_until_rolled_back(
        rheo: Rheo, postgres_url: str) -> None:
    await rheo.create_stream("s")
    conn = psycopg.connect(postgres_url)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(InvalidArgument, match="has failed; roll it back"):
            await rheo.append("s", NewEvent("t"), connection=conn)
        conn.rollback()
        await rheo.append("s", NewEvent("t"), connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert (await rheo.stream_info("s")).high_water == {0: 1}


async def test_a_sqlalchemy_connection_outside_a_transaction_is_refused(
        rheo: Rheo, postgres_url: str) -> None:
    await rheo.create_stream("s")
    url = postgres_url.replace("postgresql://", "postgresql+psycopg://")
    engine = create_async_engine(url)
    sync_engine = sa.create_engine(url)
    try:
        async with engine.connect() as conn:
            with pytest.raises(InvalidArgument, match="inside a transaction"):
                await rheo.append("s", NewEvent("t"), connection=conn)
        with sync_engine.connect() as sync_conn, pytest.raises(
                InvalidArgument, match="inside a transaction"):
            await rheo.append("s", NewEvent("t"), connection=sync_conn)
        async with engine.begin() as conn:  # begun: taken
            await rheo.append("s", NewEvent("t"), connection=conn)
    finally:
        await engine.dispose()
        sync_engine.dispose()
    assert (await rheo.stream_info("s")).high_water == {0: 1}


async def test_rows_of_the_callers_own_types_do_not_matter(
        rheo: Rheo, postgres_url: str) -> None:
    # A row factory and cursor factory of the application's: the backend's cursors are
    # its own raw ones.
    await rheo.create_stream("s")
    conn = psycopg.connect(postgres_url, row_factory=psycopg.rows.dict_row,
                           cursor_factory=psycopg.ClientCursor)
    try:
        [event] = await rheo.append("s", NewEvent("t", {"a": [1, "b"]}), connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert event.sequence == 1
    assert (await rheo.query_page(Query(stream="s"))).events[0].data == {"a": [1, "b"]}


# Wake-ups --------------------------------------------------------------------------


async def test_an_idle_consumer_is_woken_at_the_commit_and_not_by_a_rollback(
        rheo: Rheo, postgres_url: str, wait_until: WaitUntil) -> None:
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
    conn = await psycopg.AsyncConnection.connect(postgres_url)
    try:
        async with record.start(rheo) as group:
            await wait_until(lambda: "s" in listener.waiters)  # idle: next poll in 30 s
            await rheo.append("s", NewEvent("t", {"n": 1}), connection=conn)
            await conn.rollback()
            await rheo.append("s", NewEvent("t", {"n": 2}), connection=conn)
            assert listener.notes.get("s", 0) == 0
            await conn.commit()
            await wait_until(lambda: seen == [2], timeout=10)  # far sooner than 30 s
            await wait_until(lambda: group.stats.acked == 1)
            assert listener.notes["s"] == 1
    finally:
        await conn.close()
    assert seen == [2]


async def test_a_sync_connection_does_not_block_the_event_loop(
        rheo: Rheo, postgres_url: str, postgres_admin: asyncpg.Connection,
        wait_until: WaitUntil) -> None:
    # Its statements run in a worker thread: while one waits for a row lock, the loop
    # runs other tasks (here: the append that releases the lock).
    await rheo.create_stream("s")
    holder = await asyncpg.connect(postgres_url)
    conn = psycopg.connect(postgres_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await rheo.append("s", NewEvent("t"), connection=holder)  # holds partition 0
        waiting = asyncio.create_task(rheo.append("s", NewEvent("t"), connection=conn))
        pid = conn.info.backend_pid

        async def blocked() -> bool:
            count: int = await postgres_admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE pid = $1 AND cardinality(pg_blocking_pids(pid)) > 0", pid)
            return count == 1

        await wait_until(blocked)
        assert not waiting.done()
        await tx.commit()
        [event] = await asyncio.wait_for(waiting, 5)
        conn.commit()
    finally:
        conn.close()
        await holder.close()
    assert event.sequence == 2


# The page ---------------------------------------------------------------------------


def _section_blocks(heading: str) -> list[str]:
    page = (ROOT / "docs/outbox.md").read_text()
    section = page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _runs_and_prints_what_it_says(code: str, postgres_url: str, schema: str) -> None:
    env = {**os.environ, "DATABASE_URL": postgres_url, "OUTBOX_SCHEMA": schema,
           "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected_output(code)


def test_the_psycopg_example_of_the_outbox_page_prints_what_it_says(
        postgres_url: str, postgres_schema: str) -> None:
    [code] = _section_blocks("psycopg 3")
    _runs_and_prints_what_it_says(code, postgres_url, postgres_schema)


def test_the_sync_psycopg_example_of_the_outbox_page_prints_what_it_says(
        postgres_url: str, postgres_schema: str) -> None:
    [code] = [block for block in _section_blocks("Synchronous code")
              if "import psycopg" in block]
    _runs_and_prints_what_it_says(code, postgres_url, postgres_schema)
