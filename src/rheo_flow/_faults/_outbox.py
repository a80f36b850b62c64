"""The ``outbox`` scenario's application (docs/outbox.md, "Read, process, write"): each
handler acks its lease, inserts one row into the application's table and appends one
derived event, in one transaction (:meth:`Rheo.transaction
<rheo_flow.Rheo.transaction>`). The table has no unique key, and the derived events get
generated ids: an effect committed twice shows as two rows, or two derived events.

The table lives beside the backend's tables: in the backend's schema on PostgreSQL, in
its file on SQLite. The application reaches it through a connection of its own.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .._model._errors import StaleLease
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._query import Query
from .._rheo import Rheo
from ._history import Recorder

__all__ = ["HOLD_MS", "TABLE", "Effects", "derived_counts", "derived_stream",
           "settle_in_transaction"]

HOLD_MS = 5
"""The longest a handler's transaction stays open on purpose (see
:func:`settle_in_transaction`): short, as SQLite runs one writing transaction at a time."""

TABLE = "rheo_torture_effects"
"""The application's table: ``(stream, source)``, one row per effect."""


def derived_stream(stream: str) -> str:
    """The stream the handlers append their derived events to."""
    return f"{stream[:120]}-out"


class Effects:
    """The application's table on the backend's database, and its own connections."""

    def __init__(self, url: str, rheo: Rheo) -> None:
        backend: Any = rheo.backend
        self._sqlite = url.startswith("sqlite")
        if self._sqlite:
            self._target = str(backend.path)
            self._table = TABLE
        else:  # the server without rheo_flow's URL options (asyncpg takes none of them)
            self._target = url.split("?", 1)[0]
            self._table = f'"{backend.schema}".{TABLE}'

    async def connect(self) -> Any:
        """A new connection of the application's, outside any transaction."""
        if self._sqlite:
            return sqlite3.connect(self._target, isolation_level=None, timeout=30)
        import asyncpg

        return await asyncpg.connect(self._target)

    async def close(self, conn: Any) -> None:
        """Close a connection from :meth:`connect`."""
        if self._sqlite:
            conn.close()
        else:
            await conn.close()

    async def create(self) -> None:
        """Create the table if missing."""
        conn = await self.connect()
        try:
            await self._execute(conn, f"CREATE TABLE IF NOT EXISTS {self._table} "
                                      "(stream TEXT NOT NULL, source TEXT NOT NULL)")
        finally:
            await self.close(conn)

    async def write(self, conn: Any, stream: str, source: str) -> None:
        """The handler's effect: one row for the source event."""
        await self._execute(conn, f"INSERT INTO {self._table} VALUES ($1, $2)", stream, source)

    async def counts(self, stream: str) -> Counter[str]:
        """Rows per source event of ``stream``, as committed."""
        conn = await self.connect()
        try:
            sql = f"SELECT source FROM {self._table} WHERE stream = $1"
            if self._sqlite:
                rows = conn.execute(sql.replace("$1", "?"), (stream,)).fetchall()
            else:
                rows = await conn.fetch(sql, stream)
            return Counter(row[0] for row in rows)
        finally:
            await self.close(conn)

    async def _execute(self, conn: Any, sql: str, *args: Any) -> None:
        if self._sqlite:
            conn.execute(sql.replace("$1", "?").replace("$2", "?"), args)
        else:
            await conn.execute(sql, *args)


async def derived_counts(rheo: Rheo, stream: str) -> Counter[str]:
    """Derived events per source event of ``stream``."""
    found: Counter[str] = Counter()
    async for event in rheo.stream_query(Query(stream=derived_stream(stream)), page_size=1000):
        found[str(event.data.get("source"))] += 1
    return found


async def settle_in_transaction(rheo: Rheo, effects: Effects, stream: str,
                                leases: Sequence[Lease], recorder: Recorder,
                                hold_ms: int = 0) -> None:
    """One read-process-write step: the leases' rows, their derived events and their acks
    in one transaction; each ack's answer recorded as the runtime's would be (a rolled
    back ack is ``failed``). Raises :class:`~rheo_flow.StaleLease` as the helper does.

    The transaction stays open up to ``hold_ms`` (at random) after the writes, before
    the acks: a kill is then likely to land inside it."""
    conn = await effects.connect()
    try:
        try:
            async with rheo.transaction(conn, leases) as tx:
                for lease in leases:
                    await effects.write(conn, stream, lease.event.id)
                await tx.append(derived_stream(stream), [
                    NewEvent("derived", {"source": lease.event.id}) for lease in leases])
                if hold_ms:
                    await asyncio.sleep(random.random() * hold_ms / 1000)
        except StaleLease as exc:
            for lease, result in zip(leases, exc.results, strict=False):
                lost = result.error is not None or result.repeated
                kind = result.error.kind.value if result.error is not None else "failed"
                recorder.settle_result(lease.event.id, "ack", lease.lease_id, lease.attempt,
                                       kind if lost else "failed", result.repeated)
            raise
        for lease, result in zip(leases, tx.results, strict=True):
            recorder.settle_result(lease.event.id, "ack", lease.lease_id, lease.attempt,
                                   "ok", result.repeated)
    finally:
        await effects.close(conn)
