"""``rheo_flow.sync.Rheo``, the synchronous client (docs/outbox.md, "Synchronous code"):
one event loop in a thread of its own for the client's lifetime, and ``connection=``
with the application's synchronous connections, used in the calling thread: psycopg 3
and SQLAlchemy ``Session`` (``postgresql+psycopg``) on PostgreSQL, ``sqlite3`` and
SQLAlchemy ``Session`` (``sqlite://``) on SQLite. Real servers and files, no mocks; the
tests are plain functions (no event loop runs in their thread)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

from rheo_flow import InvalidArgument, NewEvent, Query
from rheo_flow import Rheo as AsyncRheo
from rheo_flow.sync import Rheo

SRC = Path(__file__).resolve().parents[2] / "src"


class App:
    """The application's side: its connection (what it passes as ``connection=``), its
    transaction and its own table ``orders (id int)``."""

    connection: Any

    def begin(self) -> None:
        """Open a transaction (psycopg and a session begin one by themselves)."""

    def insert(self, n: int) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        self.connection.commit()

    def rollback(self) -> None:
        self.connection.rollback()

    def close(self) -> None:
        self.connection.close()


class PsycopgApp(App):
    def __init__(self, url: str, schema: str) -> None:
        self.table = f'"{schema}".orders'
        self.connection = psycopg.connect(url)
        self.connection.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (id int)")
        self.connection.commit()

    def insert(self, n: int) -> None:
        self.connection.execute(f"INSERT INTO {self.table} VALUES ({n})")


class PostgresSessionApp(PsycopgApp):
    def __init__(self, url: str, schema: str) -> None:
        super().__init__(url, schema)
        self.connection.close()
        self.engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        self.connection = Session(self.engine)

    def insert(self, n: int) -> None:
        self.connection.execute(sa.text(f"INSERT INTO {self.table} VALUES ({n})"))

    def close(self) -> None:
        self.connection.close()
        self.engine.dispose()


class Sqlite3App(App):
    def __init__(self, db: Path) -> None:
        self.connection = sqlite3.connect(db, isolation_level=None)  # this thread's only
        self.connection.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER)")

    def begin(self) -> None:
        self.connection.execute("BEGIN IMMEDIATE")

    def insert(self, n: int) -> None:
        self.connection.execute(f"INSERT INTO orders VALUES ({n})")


class SqliteSessionApp(App):
    def __init__(self, db: Path) -> None:
        self.engine = sa.create_engine(f"sqlite:///{db}")

        @event.listens_for(self.engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        @event.listens_for(self.engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        with self.engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE IF NOT EXISTS orders (id INTEGER)"))
        self.connection = Session(self.engine)

    def begin(self) -> None:
        self.connection.connection()  # BEGIN IMMEDIATE

    def insert(self, n: int) -> None:
        self.connection.execute(sa.text(f"INSERT INTO orders VALUES ({n})"))

    def close(self) -> None:
        self.connection.close()
        self.engine.dispose()


POSTGRES = ("psycopg", "postgres-session")
SQLITE = ("sqlite3", "sqlite-session")


@pytest.fixture(params=[*POSTGRES, *SQLITE])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind in POSTGRES:
        return str(request.getfixturevalue("postgres_schema_url"))
    return f"sqlite:///{tmp_path / 'events.db'}"


@pytest.fixture
def client(url: str) -> Iterator[Rheo]:
    with Rheo(url) as opened:
        yield opened


@pytest.fixture
def app(kind: str, client: Rheo, request: pytest.FixtureRequest, tmp_path: Path
        ) -> Iterator[App]:
    made: App
    if kind in POSTGRES:
        url, schema = (str(request.getfixturevalue(name))
                       for name in ("postgres_url", "postgres_schema"))
        made = PsycopgApp(url, schema) if kind == "psycopg" else PostgresSessionApp(url, schema)
    else:
        db = tmp_path / "events.db"
        made = Sqlite3App(db) if kind == "sqlite3" else SqliteSessionApp(db)
    try:
        yield made
    finally:
        made.close()


def _high_water(client: Rheo, stream: str) -> dict[int, int]:
    return client.stream_info(stream).high_water


# The outbox, on each driver ---------------------------------------------------------


def test_a_commit_makes_the_events_visible_and_delivered_once_per_group(
        client: Rheo, app: App) -> None:
    client.create_stream("orders")
    for group in ("a", "b"):
        client.run(lambda rheo, g=group: rheo.create_group("orders", g))
    app.begin()
    app.insert(1)
    stored = client.append("orders", [NewEvent("order.placed", {"id": 1}, id="o-1"),
                                      NewEvent("order.paid", {"id": 1})],
                           connection=app.connection)
    assert [e.sequence for e in stored] == [1, 2]
    assert _high_water(client, "orders") == {0: 0}, "not before the commit"
    app.commit()
    assert _high_water(client, "orders") == {0: 2}
    page = client.run(lambda rheo: rheo.query_page(Query(stream="orders")))
    assert [(e.id, e.data) for e in page.events] == [("o-1", {"id": 1}),
                                                     (stored[1].id, {"id": 1})]
    for group in ("a", "b"):
        leases = client.run(lambda rheo, g=group: rheo.fetch("orders", g, limit=10))
        assert [lease.event.sequence for lease in leases] == [1, 2]
        assert all(r.ok for r in client.ack(leases))
        assert client.run(lambda rheo, g=group: rheo.fetch("orders", g, limit=10)) == []


def test_a_rollback_leaves_no_trace_and_sequences_stay_gapless(
        client: Rheo, app: App) -> None:
    client.create_stream("orders", partitions=2)
    app.begin()
    [gone] = client.append("orders", NewEvent("t", {"n": 1}, id="x"), partition=1,
                           connection=app.connection)
    app.insert(1)
    assert gone.sequence == 1
    app.rollback()
    assert _high_water(client, "orders") == {0: 0, 1: 0}
    app.begin()
    [again] = client.append("orders", NewEvent("t", {"n": 2}, id="x"), partition=1,
                            connection=app.connection)
    app.commit()
    assert (again.sequence, again.data) == (1, {"n": 2})
    [plain] = client.append("orders", NewEvent("t"), partition=1)
    assert plain.sequence == 2


def test_a_repeated_id_does_not_abort_the_transaction(client: Rheo, app: App) -> None:
    client.create_stream("orders")
    [first] = client.append("orders", NewEvent("t", {"n": 1}, id="dup"))
    app.begin()
    [same, fresh] = client.append(
        "orders", [NewEvent("t", {"n": 2}, id="dup"), NewEvent("t", {"n": 3}, id="new")],
        connection=app.connection)
    app.insert(7)  # the transaction goes on
    app.commit()
    assert (same.sequence, same.data, fresh.sequence) == (first.sequence, {"n": 1}, 2)
    assert _high_water(client, "orders") == {0: 2}


def test_acks_commit_and_roll_back_with_the_callers_writes(client: Rheo, app: App) -> None:
    client.create_stream("orders")
    client.append("orders", [NewEvent("t"), NewEvent("t")])
    leases = client.run(lambda rheo: rheo.fetch("orders", "g", limit=2))
    app.begin()
    assert all(r.ok for r in client.ack(leases, connection=app.connection))
    app.rollback()
    assert client.run(lambda rheo: rheo.frontier("orders", "g")) == {0: 0}
    app.begin()
    app.insert(1)
    assert all(r.ok for r in client.ack(leases, connection=app.connection))
    app.commit()
    assert client.run(lambda rheo: rheo.frontier("orders", "g")) == {0: 2}


# What is refused ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["psycopg"])
def test_postgres_connections_outside_a_transaction_or_elsewhere_are_refused(
        client: Rheo, postgres_url: str, kind: str) -> None:
    client.create_stream("orders")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        with pytest.raises(InvalidArgument, match="inside a transaction"):
            client.append("orders", NewEvent("t"), connection=conn)
        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
            conn.execute("CREATE DATABASE rheo_outbox_other")
    base, _, query = postgres_url.partition("?")
    other_url = base.rsplit("/", 1)[0] + "/rheo_outbox_other" + (f"?{query}" if query else "")
    engine = sa.create_engine(other_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with psycopg.connect(other_url) as other, pytest.raises(
                InvalidArgument, match="reaches database 'rheo_outbox_other'"):
            client.append("orders", NewEvent("t"), connection=other)
        with Session(engine) as session, pytest.raises(
                InvalidArgument, match="reaches database 'rheo_outbox_other'"):
            client.append("orders", NewEvent("t"), connection=session)
        with engine.connect() as outside, pytest.raises(
                InvalidArgument, match="inside a transaction"):
            client.append("orders", NewEvent("t"), connection=outside)
    finally:
        engine.dispose()
    assert _high_water(client, "orders") == {0: 0}


@pytest.mark.parametrize("kind", ["sqlite3"])
def test_sqlite_connections_outside_a_transaction_or_elsewhere_are_refused(
        client: Rheo, tmp_path: Path) -> None:
    client.create_stream("orders")
    idle = sqlite3.connect(tmp_path / "events.db")
    with pytest.raises(InvalidArgument, match="not inside a transaction"):
        client.append("orders", NewEvent("t"), connection=idle)
    idle.close()
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(InvalidArgument, match="not the backend's database file"):
        client.append("orders", NewEvent("t"), connection=other)
    other.close()
    with pytest.raises(InvalidArgument, match=r"takes a sqlite3\.Connection"):
        client.append("orders", NewEvent("t"), connection=object())
    assert _high_water(client, "orders") == {0: 0}


def test_an_asyncio_connection_is_refused(postgres_schema_url: str,
                                          postgres_url: str) -> None:
    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(postgres_url)

    conn = asyncio.run(connect())
    with Rheo(postgres_schema_url) as client:
        client.create_stream("orders")
        with pytest.raises(InvalidArgument, match="takes a synchronous connection"):
            client.append("orders", NewEvent("t"), connection=conn)
    asyncio.run(conn.close())


# The loop thread --------------------------------------------------------------------


async def _where() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    return asyncio.get_running_loop(), threading.current_thread()


def test_one_loop_thread_serves_every_call_until_close(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    client = Rheo.open(f"sqlite:///{tmp_path / 'events.db'}")
    loop, thread = client.run(lambda rheo: _where())
    assert thread is not threading.current_thread()
    assert thread.daemon
    client.create_stream("orders")
    for n in range(20):
        client.append("orders", NewEvent("t", {"n": n}))
        assert client.run(lambda rheo: _where()) == (loop, thread)
    # The loop thread (and the SQLite backend's own) and nothing more per call.
    assert len(set(threading.enumerate()) - before) == 2
    client.close()
    assert client.closed
    assert not thread.is_alive()
    assert loop.is_closed()
    assert set(threading.enumerate()) == before
    client.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        client.append("orders", NewEvent("t"))


def test_calls_from_a_thread_running_an_event_loop_raise(tmp_path: Path) -> None:
    with Rheo(f"sqlite:///{tmp_path / 'events.db'}") as client:
        client.create_stream("orders")

        async def inside() -> None:
            with pytest.raises(RuntimeError, match="thread running an event loop"):
                client.append("orders", NewEvent("t"))

        asyncio.run(inside())

        async def opened_inside() -> None:
            with pytest.raises(RuntimeError, match="thread running an event loop"):
                Rheo("memory://")

        asyncio.run(opened_inside())
        # From the loop thread itself (an operation calling back into the client).
        with pytest.raises(RuntimeError, match="thread running an event loop"):
            client.run(lambda rheo: _append_through(client))
        assert _high_water(client, "orders") == {0: 0}


async def _append_through(client: Rheo) -> None:
    client.append("orders", NewEvent("t"))


def test_threads_share_one_client_each_with_its_own_connection(
        postgres_schema_url: str, postgres_url: str, postgres_schema: str) -> None:
    failures: list[BaseException] = []
    with Rheo(postgres_schema_url) as client:
        client.create_stream("orders", partitions=2)
        PsycopgApp(postgres_url, postgres_schema).close()  # the table

        def work(n: int) -> None:
            try:
                app = PsycopgApp(postgres_url, postgres_schema)
                try:
                    for i in range(5):
                        app.insert(n * 10 + i)
                        client.append("orders", NewEvent("t", {"n": n, "i": i}), key=str(n),
                                      connection=app.connection)
                        app.commit()
                finally:
                    app.close()
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert sum(_high_water(client, "orders").values()) == 20
        page = client.run(lambda rheo: rheo.query_page(Query(stream="orders"), limit=100))
        by_key: dict[str, list[int]] = {}
        for e in page.events:
            by_key.setdefault(e.key or "", []).append(e.data["i"])
        assert by_key == {str(n): [0, 1, 2, 3, 4] for n in range(4)}


def test_the_async_rheo_underneath_is_the_clients(tmp_path: Path) -> None:
    with Rheo(f"sqlite:///{tmp_path / 'events.db'}") as client:
        assert isinstance(client.rheo, AsyncRheo)
        assert client.create_stream("orders").partitions == 1


def test_importing_the_client_loads_no_driver() -> None:
    code = ("import sys, rheo_flow, rheo_flow.sync\n"
            "print(sorted(m for m in ('psycopg', 'sqlalchemy', 'asyncpg') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_bad_input_is_an_invalid_argument_and_leaves_no_thread(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with pytest.raises(InvalidArgument, match="bogus"):
        Rheo("bogus://nowhere")
    assert set(threading.enumerate()) == before
    with Rheo(f"sqlite:///{tmp_path / 'events.db'}") as client:
        client.create_stream("orders")
        with pytest.raises(InvalidArgument, match="partition"):
            client.append("orders", NewEvent("t"), partition=3)
        with pytest.raises(InvalidArgument):
            client.create_stream("")
        assert _high_water(client, "orders") == {0: 0}
