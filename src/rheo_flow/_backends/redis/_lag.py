"""The lag report of the Redis backend: every group of many streams in four round trips.

One reading of the server clock, one of the stream records, one pipeline of the
streams' groups and pauses hashes, then the partitions' reads by ``lag.lua``, which
answers for every group of its partitions at once and names their keys itself: on
standalone Redis one call per 512 group partitions (several streams a call), all in one
pipeline; on a Redis Cluster one call per partition (routed by its stream key to its
slot), in one cluster pipeline (one round trip per primary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..._model._lag import GroupLag, LagReport, PartitionLag
from ..._model._stream import paused_state
from ._codec import stream_record, text
from ._core import RedisCore
from ._scripts import ScriptCall

__all__ = ["LagOperations"]

_GONE = -1
"""What the scripts answer for a deleted partition, a deleted group, or no oldest event."""

_CALL_ROWS = 512
"""How many group partitions one ``lag.lua`` call reads at most (standalone Redis)."""

_Member = tuple[str, int, list[str], dict[str, int]]
"""A stream the report reads: name, partition count, group names, group -> pause end."""


class LagOperations(RedisCore):
    """``lag_report``."""

    async def lag_report(self, streams: Sequence[str] | None) -> LagReport:
        """Every group of ``streams`` (``None``: every stream), read in four round trips
        (see the module docstring); a stream or group deleted meanwhile is left out."""
        now = await self.now_ms()  # its own round trip: a Cluster pipelines no TIME
        records = await self._io(self._client.hgetall(self._keys.streams))
        wanted = None if streams is None else set(streams)
        chosen = sorted((name, stream_record(record)[0])
                        for name, record in ((text(n), r) for n, r in records.items())
                        if wanted is None or name in wanted)
        if not chosen:
            return LagReport(now, ())
        pipe = self._client.pipeline(transaction=False)
        for name, _ in chosen:
            pipe.hkeys(self._keys.groups(name))
            pipe.hgetall(self._keys.pauses(name))
        hashes = await self._io(pipe.execute())
        members: list[_Member] = []
        for at, (name, count) in enumerate(chosen):
            groups = sorted(text(g) for g in hashes[2 * at])
            if groups:
                members.append((name, count, groups, {
                    text(g): int(until) for g, until in hashes[2 * at + 1].items()}))
        rows = await self._lag_rows(members, now)
        return LagReport(now, tuple(_groups_of(members, rows, now)))

    async def _lag_rows(self, members: Sequence[_Member], now: int) -> list[list[int]]:
        """Per partition of every member, in order: the high water, then 4 values per
        group (``lag.lua``)."""
        if self._cluster:  # one call per partition, routed by its stream key
            calls: list[ScriptCall] = [
                ("lag", [self._keys.partition(name, p).stream],
                 [now, self._keys.tag_head(name), p, p + 1, len(groups), *groups])
                for name, count, groups, _ in members for p in range(count)]
        else:
            calls = _batched_calls(self._keys.tag_head, members, now)
        values = [int(v) for reply in await self._eval(calls) for v in reply]
        rows: list[list[int]] = []
        at = 0
        for _, count, groups, _ in members:
            width = 1 + 4 * len(groups)
            for _ in range(count):
                rows.append(values[at:at + width])
                at += width
        return rows


def _batched_calls(tag_head: Callable[[str], str], members: Sequence[_Member],
                   now: int) -> list[ScriptCall]:
    """The ``lag.lua`` calls (standalone Redis) reading every partition of the members,
    in order, each call at most :data:`_CALL_ROWS` group partitions (one script holds
    the server for the time it runs), a stream split over calls when it has more."""
    calls: list[ScriptCall] = []
    args: list[Any] = [now]
    rows = 0
    for name, count, groups, _ in members:
        step = max(1, _CALL_ROWS // len(groups))
        for first in range(0, count, step):
            end = min(count, first + step)
            if rows and rows + (end - first) * len(groups) > _CALL_ROWS:
                calls.append(("lag", [], args))
                args, rows = [now], 0
            args += (tag_head(name), first, end, len(groups), *groups)
            rows += (end - first) * len(groups)
    calls.append(("lag", [], args))
    return calls


def _groups_of(members: Sequence[_Member], rows: Sequence[list[int]],
               now: int) -> list[GroupLag]:
    """The report's entries from the partitions' rows, in the order of ``members``."""
    out: list[GroupLag] = []
    at = 0
    for stream, count, groups, pauses in members:
        mine = rows[at:at + count]
        at += count
        if any(row[0] == _GONE for row in mine):
            continue
        for k, group in enumerate(groups):
            cells = [row[1 + 4 * k:5 + 4 * k] for row in mine]
            if any(cell[0] == _GONE for cell in cells):
                continue
            partitions = tuple(
                PartitionLag(p, row[0], frontier, scheduled,
                             None if oldest == _GONE else oldest)
                for p, (row, (frontier, _, oldest, scheduled)) in enumerate(
                    zip(mine, cells, strict=True)))
            out.append(GroupLag(stream, group, partitions, sum(c[1] for c in cells),
                                *paused_state(pauses.get(group, 0), now)))
    return out
