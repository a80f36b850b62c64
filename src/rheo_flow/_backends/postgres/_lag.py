"""The PostgreSQL backend's lag report (rule ``lag.report``): one call of the server
function ``lag_report`` (``functions/lag_report.sql``), whatever the number of streams."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import orjson

from ..._model._lag import GroupLag, LagReport, PartitionLag
from ._core import PostgresCore

__all__ = ["LagOps"]


class LagOps(PostgresCore):
    """:meth:`lag_report` in one statement, read in one snapshot at one clock reading."""

    async def lag_report(self, streams: Sequence[str] | None) -> LagReport:
        pool = await self._ready()
        names = None if streams is None else orjson.dumps(list(streams)).decode()
        async with pool.acquire() as conn:
            # One statement: the clock read before it answers when the report is empty.
            rows = await conn.fetch(self._sql.lag_report, names)
            now = rows[0]["read_at_ms"] if rows else int(await conn.fetchval(self._sql.server_now))
        groups = []
        # Columns by position (functions/lag_report.sql): stream, grp, partition,
        # high_water, frontier, lag, scheduled, oldest_unsettled_ms, dead_letters,
        # paused, paused_until_ms, read_at_ms. By position, not name: a scrape of
        # thousands of rows shares the event loop with the consumers.
        for (stream, group), found in groupby(rows, key=lambda r: (r[0], r[1])):
            parts = list(found)
            first = parts[0]
            groups.append(GroupLag(
                stream, group,
                tuple([PartitionLag(r[2], r[3], r[4], r[6], r[7]) for r in parts]),
                first[8], first[9], first[10]))
        return LagReport(now, tuple(groups))
