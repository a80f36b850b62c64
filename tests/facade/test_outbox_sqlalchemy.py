"""``connection=`` takes SQLAlchemy's connections and sessions (docs/outbox.md,
"SQLAlchemy"): the facade unwraps an ``AsyncConnection``/``AsyncSession`` on
``postgresql+asyncpg`` to its asyncpg connection, and a ``Connection``/``Session`` on
``sqlite`` to its ``sqlite3`` connection; other drivers (aiosqlite) are refused by
name. ``postgresql+psycopg`` is tested beside psycopg's own connections
(tests/backends/postgres/test_postgres_outbox_psycopg.py). Real PostgreSQL (a schema
of each test's own) and real SQLite files, no mocks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy.ext.asyncio")

import sqlalchemy as sa
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from _doc_blocks import expected_output
from rheo_flow import InvalidArgument, NewEvent, Query, Rheo
from rheo_flow.backends import SQLiteBackend

ROOT = Path(__file__).resolve().parents[2]


class Boom(Exception):
    """Raised inside a transaction block to roll it back."""


def _dialect_url(url: str, dialect: str) -> str:
    scheme, rest = url.split("://", 1)
    assert scheme in ("postgresql", "postgres"), url
    return f"{dialect}://{rest}"


# PostgreSQL: AsyncConnection, AsyncSession (postgresql+asyncpg) ---------------------


@pytest.fixture
async def engine(postgres_url: str, postgres_rheo: Rheo, postgres_schema: str
                 ) -> AsyncIterator[AsyncEngine]:
    """The application's engine; the schema (made by the opened instance) holds its
    table ``app_orders (id int primary key)``."""
    engine = create_async_engine(_dialect_url(postgres_url, "postgresql+asyncpg"))
    async with engine.begin() as conn:
        await conn.execute(text(f'CREATE TABLE "{postgres_schema}".app_orders '
                                f"(id int PRIMARY KEY)"))
    yield engine
    await engine.dispose()


def _order_class(schema: str) -> Any:
    """A mapped class ``Order`` on this test's ``app_orders``."""

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "app_orders"
        __table_args__ = {"schema": schema}
        id: Mapped[int] = mapped_column(primary_key=True)

    return Order


async def _orders(engine: AsyncEngine, schema: str) -> list[int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text(f'SELECT id FROM "{schema}".app_orders ORDER BY id'))
        return [row[0] for row in rows]


async def test_an_async_connection_commits_the_row_and_the_event_together(
        postgres_rheo: Rheo, engine: AsyncEngine, postgres_schema: str) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("orders")
    async with engine.begin() as conn:
        await conn.execute(text(f'INSERT INTO "{postgres_schema}".app_orders VALUES (1)'))
        [placed] = await rheo.append("orders", NewEvent("order.placed", {"id": 1}, id="o-1"),
                                     connection=conn)
        assert await rheo.high_water("orders") == {0: 0}  # not committed yet
    assert placed.sequence == 1
    assert await _orders(engine, postgres_schema) == [1]
    assert [e.id for e in (await rheo.query_page(Query(stream="orders"))).events] == ["o-1"]

    async def rolled_back() -> None:
        async with engine.begin() as conn:
            await conn.execute(text(f'INSERT INTO "{postgres_schema}".app_orders VALUES (2)'))
            await rheo.append("orders", NewEvent("order.placed", {"id": 2}), connection=conn)
            raise Boom

    with pytest.raises(Boom):
        await rolled_back()
    assert await _orders(engine, postgres_schema) == [1]
    assert await rheo.high_water("orders") == {0: 1}


async def test_an_async_connection_whose_transaction_sent_nothing_yet_is_begun(
        postgres_rheo: Rheo, engine: AsyncEngine) -> None:
    # SQLAlchemy's asyncpg dialect sends BEGIN with the first statement: the append
    # is the first here, and still runs in (and rolls back with) the transaction.
    await postgres_rheo.create_stream("orders")
    async def rolled_back() -> None:
        async with engine.begin() as conn:
            await postgres_rheo.append("orders", NewEvent("t", {}), connection=conn)
            raise Boom

    with pytest.raises(Boom):
        await rolled_back()
    assert await postgres_rheo.high_water("orders") == {0: 0}
    async with engine.begin() as conn:
        await postgres_rheo.append("orders", NewEvent("t", {}), connection=conn)
    assert await postgres_rheo.high_water("orders") == {0: 1}


async def test_an_async_connection_outside_a_transaction_is_refused(
        postgres_rheo: Rheo, engine: AsyncEngine) -> None:
    await postgres_rheo.create_stream("orders")
    async with engine.connect() as conn:
        with pytest.raises(InvalidArgument, match="transaction"):
            await postgres_rheo.append("orders", NewEvent("t", {}), connection=conn)
    assert await postgres_rheo.high_water("orders") == {0: 0}


async def test_an_async_session_commits_and_rolls_back_its_objects_with_the_events(
        postgres_rheo: Rheo, engine: AsyncEngine, postgres_schema: str) -> None:
    rheo = postgres_rheo
    order = _order_class(postgres_schema)
    await rheo.create_stream("orders")

    async def rolled_back(session: AsyncSession) -> None:
        async with session.begin():
            session.add(order(id=2))
            await rheo.append("orders", NewEvent("order.placed", {"id": 2}), connection=session)
            raise Boom

    async with AsyncSession(engine) as session:
        async with session.begin():
            session.add(order(id=1))  # flushed at the commit, in the same transaction
            await rheo.append("orders", NewEvent("order.placed", {"id": 1}), connection=session)
        with pytest.raises(Boom):
            await rolled_back(session)
    assert await _orders(engine, postgres_schema) == [1]
    assert await rheo.high_water("orders") == {0: 1}


async def test_an_async_session_without_a_transaction_begins_one(
        postgres_rheo: Rheo, engine: AsyncEngine, postgres_schema: str) -> None:
    # session.connection() begins the session's transaction: the append is in it.
    order = _order_class(postgres_schema)
    await postgres_rheo.create_stream("orders")
    async with AsyncSession(engine) as session:
        await postgres_rheo.append("orders", NewEvent("t", {}), connection=session)
        assert session.in_transaction()
        session.add(order(id=7))
        await session.rollback()
        await postgres_rheo.append("orders", NewEvent("t", {}), connection=session)
        session.add(order(id=8))
        await session.commit()
    assert await _orders(engine, postgres_schema) == [8]
    assert await postgres_rheo.high_water("orders") == {0: 1}


async def test_an_ack_on_an_async_session_commits_with_the_sessions_writes(
        postgres_rheo: Rheo, engine: AsyncEngine, postgres_schema: str) -> None:
    rheo = postgres_rheo
    order = _order_class(postgres_schema)
    await rheo.create_stream("orders")
    await rheo.create_group("orders", "billing")
    await rheo.append("orders", [NewEvent("t", {"id": 1}), NewEvent("t", {"id": 2})])
    first, second = await rheo.fetch("orders", "billing", limit=2)


    async def rolled_back(session: AsyncSession) -> None:
        async with session.begin():
            session.add(order(id=first.event.data["id"]))
            [result] = await rheo.ack(first, connection=session)
            assert result.ok
            raise Boom

    async with AsyncSession(engine) as session:
        with pytest.raises(Boom):
            await rolled_back(session)
        assert await rheo.frontier("orders", "billing") == {0: 0}  # rolled back

        async with session.begin():
            session.add(order(id=first.event.data["id"]))
            results = await rheo.ack([first, second], connection=session)
            assert all(r.ok for r in results)
            assert await rheo.frontier("orders", "billing") == {0: 0}  # not committed yet
    assert await rheo.frontier("orders", "billing") == {0: 2}
    assert await _orders(engine, postgres_schema) == [1]


# SQLite: Connection, Session (sqlite, the standard library's sqlite3) ---------------


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


@pytest.fixture
async def sqlite_rheo(db: Path) -> AsyncIterator[Rheo]:
    async with Rheo(SQLiteBackend(db, busy_timeout_ms=2_000)) as rheo:
        await rheo.create_stream("orders")
        yield rheo


@pytest.fixture
def sync_engine(sqlite_rheo: Rheo, db: Path) -> Iterator[sa.Engine]:
    """The application's engine on the backend's file, made in the event loop's thread
    (sqlite3 connections stay in the thread that made them)."""
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE app_orders (id INTEGER PRIMARY KEY)"))
    yield engine
    engine.dispose()


def _sqlite_orders(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return [row[0] for row in conn.execute(text("SELECT id FROM app_orders ORDER BY id"))]


async def test_a_sqlite_connection_commits_the_row_and_the_event_together(
        sqlite_rheo: Rheo, sync_engine: sa.Engine) -> None:
    with sync_engine.begin() as conn:
        conn.execute(text("INSERT INTO app_orders VALUES (1)"))  # begins sqlite3's
        await sqlite_rheo.append("orders", NewEvent("order.placed", {"id": 1}),
                                 connection=conn)
    assert _sqlite_orders(sync_engine) == [1]
    assert await sqlite_rheo.high_water("orders") == {0: 1}

    async def rolled_back() -> None:
        with sync_engine.begin() as conn:
            conn.execute(text("INSERT INTO app_orders VALUES (2)"))
            await sqlite_rheo.append("orders", NewEvent("order.placed", {"id": 2}),
                                     connection=conn)
            raise Boom

    with pytest.raises(Boom):
        await rolled_back()
    assert _sqlite_orders(sync_engine) == [1]
    assert await sqlite_rheo.high_water("orders") == {0: 1}


async def test_a_sqlite_session_acks_with_its_writes(
        sqlite_rheo: Rheo, sync_engine: sa.Engine) -> None:
    await sqlite_rheo.create_group("orders", "billing")
    await sqlite_rheo.append("orders", NewEvent("t", {"id": 5}))
    [lease] = await sqlite_rheo.fetch("orders", "billing")
    with Session(sync_engine) as session, session.begin():
        session.execute(text("INSERT INTO app_orders VALUES (5)"))
        [result] = await sqlite_rheo.ack(lease, connection=session)
        assert result.ok
    assert _sqlite_orders(sync_engine) == [5]
    assert await sqlite_rheo.frontier("orders", "billing") == {0: 1}


async def test_a_sqlite_transaction_that_wrote_nothing_yet_is_refused(
        sqlite_rheo: Rheo, sync_engine: sa.Engine) -> None:
    # pysqlite's default: sqlite3 begins its transaction at the first write.
    with sync_engine.begin() as conn, pytest.raises(InvalidArgument, match="transaction"):
        await sqlite_rheo.append("orders", NewEvent("t", {}), connection=conn)
    assert await sqlite_rheo.high_water("orders") == {0: 0}


async def test_a_sqlite_engine_beginning_immediate_transactions_appends_first(
        sqlite_rheo: Rheo, db: Path) -> None:
    # SQLAlchemy's recipe (docs/outbox.md): sqlite3 in autocommit, BEGIN IMMEDIATE
    # sent by the engine at each begin.
    engine = sa.create_engine(f"sqlite:///{db}")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    async def rolled_back() -> None:
        with engine.begin() as conn:
            await sqlite_rheo.append("orders", NewEvent("t", {}), connection=conn)
            raise Boom

    try:
        with engine.begin() as conn:
            await sqlite_rheo.append("orders", NewEvent("t", {}), connection=conn)
        with pytest.raises(Boom):
            await rolled_back()
    finally:
        engine.dispose()
    assert await sqlite_rheo.high_water("orders") == {0: 1}


async def test_an_async_sqlite_driver_is_refused_by_name(
        sqlite_rheo: Rheo, sync_engine: sa.Engine, db: Path) -> None:
    # aiosqlite runs sqlite3 in a thread of its own: not the connection the backend takes.
    pytest.importorskip("aiosqlite")
    engine = create_async_engine(f"sqlite+aiosqlite:///{db}")
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO app_orders VALUES (9)"))
            with pytest.raises(InvalidArgument, match=r"sqlite\+aiosqlite.*sqlite3"):
                await sqlite_rheo.append("orders", NewEvent("t", {}), connection=conn)
    finally:
        await engine.dispose()
    assert await sqlite_rheo.high_water("orders") == {0: 0}


# The page ----------------------------------------------------------------------------


def _sqlalchemy_blocks() -> list[str]:
    page = (ROOT / "docs/outbox.md").read_text()
    section = page.split("\n## SQLAlchemy\n", 1)[1].split("\n## ", 1)[0]
    return [block for block in re.findall(r"```python\n(.*?)```", section, flags=re.S)
            if "asyncio.run(main())" in block]


def _run_page_example(code: str, cwd: Path, env: dict[str, str]) -> None:
    expected = expected_output(code)
    assert expected
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, **env, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected


def test_the_async_session_example_of_the_outbox_page_prints_what_it_says(
        postgres_url: str, postgres_schema: str, tmp_path: Path) -> None:
    [code] = [block for block in _sqlalchemy_blocks() if "AsyncSession" in block]
    _run_page_example(code, tmp_path,
                      {"DATABASE_URL": postgres_url, "OUTBOX_SCHEMA": postgres_schema})


def test_the_sqlite_session_example_of_the_outbox_page_prints_what_it_says(
        tmp_path: Path) -> None:
    [code] = [block for block in _sqlalchemy_blocks() if "SQLiteBackend" in block]
    _run_page_example(code, tmp_path, {})
