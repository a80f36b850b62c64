"""Consumer groups of the PostgreSQL backend and their progress: creating and listing
them, frontiers, dead letters, redrive, replay and reset.

Replay and reset move a group's cursors and frontiers in one transaction that
takes the cursor rows first (the lock order of every claim); deleting a
delivery fences its lease, and the event is materialised again at attempt 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import orjson

from ..._backend import DEFAULT_MAX_ATTEMPTS
from ..._model._errors import UnknownGroup
from ..._model._stream import (
    PAUSED_UNTIL_RESUMED,
    DeadLetter,
    GroupInfo,
    Retention,
    StartPosition,
    StreamInfo,
    paused_state,
)
from ..._model._validation import ordering_mismatch
from ._core import PostgresCore
from ._sql import BIGINT_MAX, INTEGER_MAX

if TYPE_CHECKING:
    import asyncpg

__all__ = ["GroupOps"]


ORDERINGS = ("none", "key")
"""``groups.ordering`` (schema version 5) by its stored number: 0 none, 1 key."""


def _position_param(start: StartPosition) -> int | None:
    """A start position as the SQL parameter: a sequence, or NULL for the high water."""
    if start == "earliest":
        return 0
    if start == "latest":
        return None
    return min(int(start), BIGINT_MAX)


def _info(stream: str, group: str, row: asyncpg.Record) -> GroupInfo:
    """The group of a row (max_attempts, created_at_ms, ordering, paused_until_ms, and
    now_ms: the database clock the pause is told by)."""
    return GroupInfo(stream, group, row["max_attempts"], row["created_at_ms"],
                     ORDERINGS[row["ordering"]],
                     *paused_state(row["paused_until_ms"], row["now_ms"]))


class _Rewind(NamedTuple):
    """The statements of one way to move a group back: per-partition positions, the
    deliveries they drop, and the moves of cursors and frontiers to them."""

    positions: str
    deliveries: str
    cursors: str
    frontiers: str


class GroupOps(PostgresCore):
    """Group operations: create, describe, list; frontier, dead letters, redrive, replay,
    reset."""

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None,
        *, ordering: str = "none",
    ) -> GroupInfo:
        """Create the group, or return it (``max_attempts`` updated when given);
        ``ordering`` applies at creation, and ``"key"`` for an existing group without
        it is an InvalidArgument (nothing changes then)."""
        meta = await self._stream(stream)
        pool = await self._ready()
        sql = self._sql
        position = _position_param(start)
        keyed = ordering == "key"
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(sql.insert_group, meta.id, group,
                                      max_attempts or DEFAULT_MAX_ATTEMPTS, int(keyed))
            if row is not None:
                await conn.execute(sql.start_cursors, row["id"], meta.id, position)
                await conn.execute(sql.start_frontiers, row["id"], meta.id, position)
            else:
                [row] = await conn.fetch(sql.group, meta.id, group)
                if keyed and ORDERINGS[row["ordering"]] != "key":
                    raise ordering_mismatch(stream, group, ORDERINGS[row["ordering"]], ordering)
                if max_attempts is not None and max_attempts != row["max_attempts"]:
                    [row] = await conn.fetch(sql.set_max_attempts, row["id"], max_attempts)
        self._groups[(stream, group)] = row["id"]
        return _info(stream, group, row)

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        meta = await self._stream(stream)
        pool = await self._ready()
        row = await pool.fetchrow(self._sql.group, meta.id, group)
        if row is None:
            raise UnknownGroup(stream, group)
        self._groups[(stream, group)] = row["id"]
        return _info(stream, group, row)

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        pool = await self._ready()
        async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read",
                                                            readonly=True):
            streams = await conn.fetch(self._sql.describe_streams)
            group_rows = await conn.fetch(self._sql.describe_groups)
        groups: dict[str, list[GroupInfo]] = {}
        for row in group_rows:
            groups.setdefault(row["stream"], []).append(
                _info(row["stream"], row["name"], row))
        described = []
        for row in streams:
            waters = orjson.loads(row["waters"])  # [[part, high water, low water], ...]
            described.append((StreamInfo(row["name"], row["partitions"], row["created_at_ms"],
                                         {p: high for p, high, _ in waters},
                                         {p: low for p, _, low in waters},
                                         Retention.from_ms(row["retention_max_age_ms"],
                                                           row["retention_max_events"])),
                              groups.get(row["name"], [])))
        return described

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        meta = await self._stream(stream)
        pool = await self._ready()
        rows = await pool.fetch(self._sql.list_groups, meta.id)
        return [_info(stream, r["name"], r) for r in rows]

    async def pause_group(self, stream: str, group: str, until_ms: int | None) -> GroupInfo:
        """Store the pause with the group: every process's next fetch of it finds it."""
        return await self._set_pause(stream, group,
                                     PAUSED_UNTIL_RESUMED if until_ms is None else until_ms)

    async def resume_group(self, stream: str, group: str) -> GroupInfo:
        """End the pause, and notify the stream's channel: consumers waiting on it in
        every process fetch at once."""
        return await self._set_pause(stream, group, 0)

    async def _set_pause(self, stream: str, group: str, until: int) -> GroupInfo:
        meta = await self._stream(stream)
        pool = await self._ready()
        row = await pool.fetchrow(self._sql.set_group_pause, meta.id, until, self._channel,
                                  stream, group)
        if row is None:
            raise UnknownGroup(stream, group)
        self._groups[(stream, group)] = row["id"]
        return _info(stream, group, row)

    # Progress ----------------------------------------------------------------

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        gid = await self._group_id(stream, group)
        pool = await self._ready()
        rows = await pool.fetch(self._sql.frontier, gid)
        return {r["part"]: r["frontier"] for r in rows}

    async def frontiers(self, stream: str) -> dict[str, dict[int, int]]:
        meta = await self._stream(stream)
        pool = await self._ready()
        out: dict[str, dict[int, int]] = {}
        for r in await pool.fetch(self._sql.stream_frontiers, meta.id):
            out.setdefault(r["name"], {})[r["part"]] = r["frontier"]
        return out

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        meta = await self._stream(stream)
        gid = await self._group_id(stream, group)
        part, seq = after if after is not None else (-1, -1)
        pool = await self._ready()
        rows = await pool.fetch(self._sql.dead_letters, gid, meta.id, part, seq, limit)
        return [DeadLetter(stream, group, r["part"], r["seq"], r["event_id"], r["attempt"],
                           r["reason"], r["rejected_at_ms"], r["last_error"]) for r in rows]

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        gid = await self._group_id(stream, group)
        pool = await self._ready()
        parts: list[int] | None = None
        seqs: list[int] | None = None
        if positions is not None:
            wanted = sorted({(p, s) for p, s in positions if 0 <= p <= INTEGER_MAX
                             and 0 < s <= BIGINT_MAX})
            parts, seqs = [p for p, _ in wanted], [s for _, s in wanted]
        count: int = await pool.fetchval(self._sql.redrive, gid, parts, seqs)
        return count

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        sql = self._sql
        await self._rewind(
            stream, group, partitions, min(from_sequence, BIGINT_MAX),
            _Rewind(sql.replay_starts, sql.replay_deliveries, sql.lower_cursors,
                    sql.lower_frontiers))

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        sql = self._sql
        await self._rewind(
            stream, group, partitions, _position_param(to),
            _Rewind(sql.reset_positions, sql.reset_deliveries, sql.set_cursors,
                    sql.set_frontiers))

    async def _rewind(self, stream: str, group: str, partitions: Sequence[int],
                      position: int | None, how: _Rewind) -> None:
        """Move the group's ``partitions`` to the positions ``how`` finds for ``position``."""
        meta = await self._stream(stream)
        gid = await self._group_id(stream, group)
        parts = sorted(set(partitions))
        if not parts:
            return
        pool = await self._ready()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(self._sql.lock_cursors, gid, parts)
            rows = await conn.fetch(how.positions, meta.id, parts, position)
            positions = ([r["part"] for r in rows], [r["position"] for r in rows])
            await conn.execute(how.deliveries, gid, *positions)
            await conn.execute(how.cursors, gid, *positions)
            await conn.execute(self._sql.lock_frontiers, gid, positions[0])
            await conn.execute(how.frontiers, gid, *positions)
