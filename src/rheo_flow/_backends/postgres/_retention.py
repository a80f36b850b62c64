"""Retention in the PostgreSQL backend: trimming old events, deleting streams and groups.

Each runs in one transaction that locks the stream's rows first (partitions for
a trim, the stream row for a deletion), which orders it against appends and
group creation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..._model._errors import UnknownGroup, UnknownStream
from ..._model._stream import Retention
from ._core import PostgresCore

if TYPE_CHECKING:
    import asyncpg

__all__ = ["RetentionOps"]


class RetentionOps(PostgresCore):
    """Retention operations: trim, delete a stream, delete a group."""

    async def set_retention(self, stream: str, retention: Retention | None) -> None:
        pool = await self._ready()
        row = await pool.fetchrow(
            self._sql.set_retention, stream, None if retention is None else retention.max_age_ms,
            None if retention is None else retention.max_events)
        if row is None:
            raise UnknownStream(stream)

    async def now_ms(self) -> int:
        pool = await self._ready()
        return int(await pool.fetchval(self._sql.server_now))

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        meta = await self._stream(stream)
        parts = sorted(up_to)
        if not parts:
            return {}
        pool = await self._ready()
        sql = self._sql
        async with pool.acquire() as conn, conn.transaction():
            highs = await conn.fetch(sql.lock_partitions, meta.id, parts)
            bounds = ([r["part"] for r in highs],
                      [min(max(up_to[r["part"]], 0), r["high_water"]) for r in highs])
            counted = await conn.fetch(sql.trim_events, meta.id, *bounds)
            removed = dict.fromkeys(parts, 0)
            removed.update({r["part"]: r["removed"] for r in counted})
            await conn.execute(sql.raise_low_water, meta.id, *bounds)
            groups = [r["id"] for r in await conn.fetch(sql.stream_groups, meta.id)]
            if groups:
                await self._settle_trimmed(conn, groups, bounds)
        return removed

    async def _settle_trimmed(self, conn: asyncpg.Connection, groups: list[int],
                              bounds: tuple[list[int], list[int]]) -> None:
        """Drop every group's deliveries up to the bounds (fencing their leases) and
        count them as settled: cursors and frontiers move up to the bound, then on."""
        triples = [(g, p, b) for g in groups for p, b in zip(*bounds, strict=True)]
        args = ([g for g, _, _ in triples], [p for _, p, _ in triples],
                [b for _, _, b in triples])
        sql = self._sql
        await conn.execute(sql.lock_trimmed_cursors, *args)
        released = await conn.fetchrow(sql.trim_deliveries, *args)
        if released is not None and released["keys"] is not None:  # key-ordered groups' unsettled
            await conn.execute(sql.release_keys, *released)
        for statement in (sql.raise_cursors, sql.lock_trimmed_frontiers, sql.raise_frontiers):
            await conn.execute(statement, *args)
        await conn.execute(sql.advance_frontiers, args[0], args[1])

    async def delete_stream(self, stream: str) -> None:
        pool = await self._ready()
        sql = self._sql
        async with pool.acquire() as conn, conn.transaction():
            stream_id = await conn.fetchval(sql.lock_stream, stream)
            if stream_id is None:
                raise UnknownStream(stream)
            groups = [r["id"] for r in await conn.fetch(sql.stream_groups, stream_id)]
            await self._delete_groups(conn, groups)
            for statement in (sql.delete_events, sql.delete_partitions, sql.delete_stream):
                await conn.execute(statement, stream_id)
        self._streams.pop(stream, None)
        for key in [k for k in self._groups if k[0] == stream]:
            del self._groups[key]

    async def delete_group(self, stream: str, group: str) -> None:
        pool = await self._ready()
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(self._sql.lock_stream_of_group, stream, group)
            if row is None:
                raise UnknownStream(stream)
            if row["group_id"] is None:
                raise UnknownGroup(stream, group)
            await self._delete_groups(conn, [row["group_id"]])
        self._groups.pop((stream, group), None)

    async def _delete_groups(self, conn: asyncpg.Connection, groups: list[int]) -> None:
        sql = self._sql
        for statement in (sql.delete_deliveries, sql.delete_frontiers, sql.delete_cursors,
                          sql.delete_groups):
            await conn.execute(statement, groups)
