"""An application beside rheo_flow, for the read-process-write tests: its own table
``effects (source TEXT NOT NULL)`` on the backend's database, written through its own
connection (asyncpg on PostgreSQL, ``sqlite3`` on SQLite). Shared by
tests/facade/test_read_process_write.py, tests/faults/test_outbox_kill9.py and its child
process, tests/faults/_outbox_child.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from rheo_flow import SETTLED, Consumer, Event, Lease, NewEvent, Rheo, current_lease


@dataclass
class App:
    """Where the application's table lives, and how to reach it."""

    kind: str
    """``"postgres"`` or ``"sqlite"``."""
    url: str
    """The backend's URL (its schema, or its file)."""
    target: str
    """The PostgreSQL server URL (no schema), or the SQLite file's path."""
    schema: str = ""

    @property
    def table(self) -> str:
        return f'"{self.schema}".effects' if self.kind == "postgres" else "effects"

    async def connect(self) -> Any:
        """A new connection of the application's, outside any transaction."""
        if self.kind == "postgres":
            return await asyncpg.connect(self.target)
        return sqlite3.connect(self.target, isolation_level=None, timeout=10)

    async def close(self, conn: Any) -> None:
        if self.kind == "postgres":
            await conn.close()
        else:
            conn.close()

    async def create_table(self) -> None:
        conn = await self.connect()
        try:
            await self.execute(
                conn, f"CREATE TABLE IF NOT EXISTS {self.table} (source TEXT NOT NULL)")
        finally:
            await self.close(conn)

    async def execute(self, conn: Any, sql: str, *args: Any) -> None:
        if self.kind == "postgres":
            await conn.execute(sql, *args)
        else:
            conn.execute(sql.replace("$1", "?"), args)

    async def write(self, conn: Any, source: str) -> None:
        """The handler's own effect: one row per source event."""
        await self.execute(conn, f"INSERT INTO {self.table} VALUES ($1)", source)

    async def effects(self) -> list[str]:
        """Every row of the table, as committed."""
        conn = await self.connect()
        try:
            if self.kind == "postgres":
                rows = await conn.fetch(f"SELECT source FROM {self.table} ORDER BY source")
            else:
                rows = conn.execute(f"SELECT source FROM {self.table} ORDER BY source").fetchall()
            return [row[0] for row in rows]
        finally:
            await self.close(conn)


Step = Callable[[str, Lease], Awaitable[None]]
"""Called at each named step of a handler (``written``, ``acked``, ``committed``)."""


async def _no_step(step: str, lease: Lease) -> None:
    return None


class Billing(Consumer):
    """Reads ``orders``, writes one effect row per order and appends one ``invoice.due``
    per order, all in one transaction with the ack (``Rheo.transaction``).

    ``joined``: the handler begins and commits the transaction itself, the helper joins
    it (the ack is then made before the commit, at the end of the helper's block)."""

    stream = "orders"
    group = "billing"

    def __init__(self, rheo: Rheo, app: App, *, step: Step = _no_step,
                 joined: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.rheo, self.app, self.step, self.joined = rheo, app, step, joined

    async def setup(self, options: Any) -> dict[str, Any]:
        # The append's partition count, read now: read inside the transaction, it would
        # wait (SQLite) behind the backend's writes, which wait for the transaction.
        await self.rheo.stream_info("invoices")
        return {}

    async def handle_event(self, event: Event, context: Any) -> Any:
        lease = current_lease()
        conn = await self.app.connect()
        try:
            if self.joined:
                await self.app.execute(conn, "BEGIN")
            async with self.rheo.transaction(conn, lease) as tx:
                await self.app.write(conn, event.id)
                # A generated id: an invoice appended twice would show as two.
                await tx.append("invoices", NewEvent("invoice.due", {"order": event.id}))
                await self.step("written", lease)
            if self.joined:
                await self.step("acked", lease)
                await self.app.execute(conn, "COMMIT")
            await self.step("committed", lease)
        finally:
            await self.app.close(conn)
        return SETTLED
