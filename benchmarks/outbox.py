"""The outbox: what appending in the application's transaction costs (docs/outbox.md).

Measured in one run, contenders in alternating rounds, medians reported:

* **transaction cost**: an application transaction inserting one row and appending one
  event (``Rheo.append(..., connection=conn)``) against the same transaction inserting
  the row alone, one transaction after another on one connection of the application's
  (``ms/transaction``; ratio = the cost of the append, target <= 1.3x); beside it, the
  same transaction inserting a second plain row instead (a unique text id and the
  event's JSON, in a table of its own): what any second write costs, the floor; and on
  PostgreSQL that insert with a ``NOTIFY`` in the same statement (what any append
  that wakes consumers at the commit costs at the least: one more round trip, one
  more row, the notification queued at the commit); and the writes an append cannot do
  without, written by hand in tables of the same shape (``"writes"``): the partition's
  high water moved by one (what keeps sequences gapless), the event's row under its
  two keys (position, and the event id that makes the append idempotent), and on
  PostgreSQL the ``NOTIFY``, in one statement.
* **concurrent appends**: 8 tasks, each on a connection of its own, running application
  transactions that append one event each to its own partition of one 8-partition
  stream, against 8 tasks appending one event each with a plain ``Rheo.append`` on the
  backend's pool (``events/s``; target >= 0.7x).
* **PostgreSQL, appends beside an open transaction**: 100 concurrent plain appends to
  another partition and another stream while an application transaction holding an
  append to partition 0 stays open, against the same with no transaction open (``ms``).

PostgreSQL on the server named by ``RHEO_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), in a schema of its own dropped
afterwards; SQLite in a temporary file (WAL, ``synchronous=FULL`` on both the backend's
and the application's connections).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from benchmarks._common import Result, alternating_rounds, payload
from rheo_flow import NewEvent, Rheo
from rheo_flow.backends import SQLiteBackend

URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = "bench_outbox"
PARTITIONS = 8
TASKS = 8
ELSEWHERE = 100
"""Plain appends made beside an open transaction (half to another partition, half to
another stream)."""
NOTIFY_CHANNEL = f"rheo_flow.{SCHEMA}"
"""The channel of the floor's NOTIFY (the name of the backend's own; nobody listens in the
suite, as nobody listens to the appends either while the costs are measured)."""


class App:
    """The application's side: its connection(s) and its ``rows`` table."""

    def __init__(self, kind: str, target: str) -> None:
        self.kind, self.target = kind, target
        self.table = f"{SCHEMA}.rows" if kind == "postgres" else "rows"
        self.floor = f"{SCHEMA}.floor" if kind == "postgres" else "floor"

    async def connect(self) -> Any:
        if self.kind == "postgres":
            return await asyncpg.connect(self.target)
        conn = sqlite3.connect(self.target, isolation_level=None, timeout=30)
        conn.execute("PRAGMA synchronous = FULL")
        return conn

    async def close(self, conn: Any) -> None:
        await conn.close() if self.kind == "postgres" else conn.close()

    async def run(self, conn: Any, sql: str, *args: Any) -> None:
        if self.kind == "postgres":
            await conn.execute(sql, *args)
        else:
            conn.execute(sql.replace("$1", "?").replace("$2", "?"), args)

    async def create_tables(self, conn: Any) -> None:
        """The ``rows`` table, the floor's, and the two an append's writes by hand use."""
        await self.run(conn, f"CREATE TABLE IF NOT EXISTS {self.table} (id int)")
        await self.run(conn, f"CREATE TABLE IF NOT EXISTS {self.floor} "
                             "(id text PRIMARY KEY, data text NOT NULL)")
        await self.run(conn, f"CREATE TABLE IF NOT EXISTS {self.floor}_partitions "
                             "(part int PRIMARY KEY, high_water bigint NOT NULL)")
        await self.run(conn, f"INSERT INTO {self.floor}_partitions VALUES (0, 0) "
                             "ON CONFLICT DO NOTHING")
        data = "json" if self.kind == "postgres" else "text"
        await self.run(conn, f"CREATE TABLE IF NOT EXISTS {self.floor}_events "
                             "(part int NOT NULL, seq bigint NOT NULL, event_id text NOT NULL, "
                             f"type text NOT NULL, data {data} NOT NULL, "
                             "appended_at_ms bigint NOT NULL, PRIMARY KEY (part, seq), "
                             "UNIQUE (event_id))")

    async def insert_and_notify(self, conn: Any, row_id: str, data: str) -> None:
        """A row of the floor table and a ``NOTIFY`` in one statement (PostgreSQL)."""
        await conn.fetch(f"WITH i AS (INSERT INTO {self.floor} VALUES ($1, $2) RETURNING id) "
                         "SELECT pg_notify($3, 'orders') FROM i", row_id, data, NOTIFY_CHANNEL)

    async def append_writes(self, conn: Any, event_id: str, data: str) -> None:
        """What an append of one event must write, by hand: the partition's high water
        moved, the event's row, and (PostgreSQL) the ``NOTIFY``."""
        if self.kind == "postgres":
            await conn.fetch(
                f"WITH hw AS (UPDATE {self.floor}_partitions SET high_water = high_water + 1 "
                "WHERE part = 0 RETURNING high_water), "
                f"ev AS (INSERT INTO {self.floor}_events SELECT 0, hw.high_water, $1, "
                "'order.placed', $2::json, 0 FROM hw RETURNING seq) "
                "SELECT pg_notify($3, 'orders') FROM ev", event_id, data, NOTIFY_CHANNEL)
        else:
            [(seq,)] = conn.execute(f"UPDATE {self.floor}_partitions SET high_water = "
                                    "high_water + 1 WHERE part = 0 RETURNING high_water")
            conn.execute(f"INSERT INTO {self.floor}_events VALUES (0, ?, ?, 'order.placed', "
                         "?, 0)", (seq, event_id, data))

    async def transaction(self, conn: Any, body: Callable[[], Awaitable[None]]) -> None:
        """``body`` in one transaction of ``conn`` (BEGIN IMMEDIATE on SQLite)."""
        await self.run(conn, "BEGIN" if self.kind == "postgres" else "BEGIN IMMEDIATE")
        await body()
        await self.run(conn, "COMMIT")


async def transaction_cost(rheo: Rheo, app: App, conn: Any, transactions: int,
                           second: str | None) -> float:
    """Milliseconds per application transaction: one row, and, as ``second`` says, one
    event appended (``"append"``), one row of the floor table (``"insert"``), or that
    row and a ``NOTIFY`` on the backend's channel in one statement (``"notify"``,
    PostgreSQL only), or an append's own writes by hand (``"writes"``)."""
    started = time.perf_counter()
    round_id = time.perf_counter_ns()
    for i in range(transactions):
        async def body(i: int = i) -> None:
            await app.run(conn, f"INSERT INTO {app.table} VALUES ($1)", i)
            if second == "append":
                await rheo.append("orders", NewEvent("order.placed", payload(i)),
                                  connection=conn)
            elif second == "insert":
                await app.run(conn, f"INSERT INTO {app.floor} VALUES ($1, $2)",
                              f"{round_id}-{i}", orjson.dumps(payload(i)).decode())
            elif second == "notify":
                await app.insert_and_notify(conn, f"{round_id}-{i}",
                                            orjson.dumps(payload(i)).decode())
            elif second == "writes":
                await app.append_writes(conn, f"{round_id}-{i}", orjson.dumps(payload(i)).decode())
        await app.transaction(conn, body)
    return (time.perf_counter() - started) * 1000 / transactions


async def concurrent_appends(rheo: Rheo, app: App, conns: list[Any], per_task: int,
                             outbox: bool) -> float:
    """Events per second appended by :data:`TASKS` tasks, each to its own partition."""

    async def task(p: int) -> None:
        for i in range(per_task):
            event = NewEvent("order.placed", payload(i))
            if outbox:
                async def body(e: NewEvent = event) -> None:
                    await rheo.append("wide", e, partition=p, connection=conns[p])
                await app.transaction(conns[p], body)
            else:
                await rheo.append("wide", event, partition=p)

    started = time.perf_counter()
    await asyncio.gather(*(task(p) for p in range(TASKS)))
    return TASKS * per_task / (time.perf_counter() - started)


async def appends_elsewhere(rheo: Rheo, conn: Any, hold: bool) -> float:
    """Milliseconds for :data:`ELSEWHERE` concurrent plain appends to partition 1 and to
    another stream, while ``conn`` holds an append to partition 0 open (if ``hold``)."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        if hold:
            await rheo.append("wide", NewEvent("held"), partition=0, connection=conn)
        started = time.perf_counter()
        await asyncio.gather(*(
            rheo.append("wide" if i % 2 else "other", NewEvent("t"), partition=i % 2)
            for i in range(ELSEWHERE)))
        return (time.perf_counter() - started) * 1000
    finally:
        await transaction.rollback()


async def _suite(kind: str, rheo: Rheo, app: App, quick: bool) -> list[Result]:
    rounds = 3 if quick else 5
    transactions = 200 if quick else 1_000
    per_task = 50 if quick else 250
    await rheo.create_stream("orders")
    await rheo.create_stream("wide", partitions=PARTITIONS)
    await rheo.create_stream("other")
    conns = [await app.connect() for _ in range(TASKS)]
    try:
        await app.create_tables(conns[0])
        note = (f"{transactions} transactions in a row on one connection, median of {rounds} "
                "alternating rounds")
        contenders = {
            "row": lambda: transaction_cost(rheo, app, conns[0], transactions, None),
            "row+event": lambda: transaction_cost(rheo, app, conns[0], transactions, "append"),
            "row+row": lambda: transaction_cost(rheo, app, conns[0], transactions, "insert"),
            "row+writes": lambda: transaction_cost(rheo, app, conns[0], transactions, "writes"),
        }
        if kind == "postgres":
            contenders["row+row+notify"] = lambda: transaction_cost(
                rheo, app, conns[0], transactions, "notify")
        costs = await alternating_rounds(rounds, contenders)
        results = [
            Result.compared("transaction: row + append vs row alone", kind,
                            costs["row+event"], "ms/transaction", costs["row"], note,
                            baseline_name="row alone"),
            # What any second write costs: a row with a unique text id and the event's
            # JSON in a table of the application's (the floor of an append's cost).
            Result.compared("transaction: row + a second plain insert vs row alone", kind,
                            costs["row+row"], "ms/transaction", costs["row"], note,
                            baseline_name="row alone"),
            Result.compared("transaction: row + an append's own writes by hand vs row alone",
                            kind, costs["row+writes"], "ms/transaction", costs["row"], note,
                            baseline_name="row alone"),
        ]
        if kind == "postgres":
            results.append(Result.compared(
                "transaction: row + a second insert and a NOTIFY in one statement vs row alone",
                kind, costs["row+row+notify"], "ms/transaction", costs["row"], note,
                baseline_name="row alone"))
        note = (f"{TASKS} tasks x {per_task} one-event appends, each to its own partition of "
                f"{PARTITIONS}; median of {rounds} alternating rounds")
        rates = await alternating_rounds(rounds, {
            "plain": lambda: concurrent_appends(rheo, app, conns, per_task, False),
            "outbox": lambda: concurrent_appends(rheo, app, conns, per_task, True),
        })
        results.append(Result.compared(
            f"{TASKS} concurrent transactions appending vs plain appends", kind,
            rates["outbox"], "events/s", rates["plain"], note, baseline_name="plain append"))
        if kind == "postgres":
            note = (f"{ELSEWHERE} concurrent appends to partition 1 and another stream; "
                    f"median of {rounds} alternating rounds")
            times = await alternating_rounds(rounds, {
                "free": lambda: appends_elsewhere(rheo, conns[0], False),
                "held": lambda: appends_elsewhere(rheo, conns[0], True),
            })
            results.append(Result.compared(
                "appends elsewhere, a transaction holding partition 0 open vs none", kind,
                times["held"], "ms", times["free"], note, baseline_name="no transaction"))
        return results
    finally:
        for conn in conns:
            await app.close(conn)


async def _postgres(quick: bool) -> list[Result]:
    admin = await asyncpg.connect(URL)
    try:
        await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        separator = "&" if "?" in URL else "?"
        async with Rheo(f"{URL}{separator}schema={SCHEMA}") as rheo:
            return await _suite("postgres", rheo, App("postgres", URL), quick)
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await admin.close()


async def _sqlite(quick: bool) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="rheo-bench-") as directory:
        path = str(Path(directory) / "outbox.db")
        async with Rheo(SQLiteBackend(path, synchronous="FULL")) as rheo:
            return await _suite("sqlite", rheo, App("sqlite", path), quick)


async def run(quick: bool) -> list[Result]:
    """Every measurement of the suite (``quick``: smaller sizes, three rounds)."""
    return [*await _postgres(quick), *await _sqlite(quick)]
