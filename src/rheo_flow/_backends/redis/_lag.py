"""The lag report of the Redis backend: every group of many streams in four round trips.

One reading of the server clock, one of the stream records, one pipeline of the
streams' groups and pauses hashes, then the partitions' reads: on standalone Redis one
``lag_many.lua`` call per stream (naming the stream's keys itself), all in one
pipeline; on a Redis Cluster one ``lag.lua`` call per partition (its keys declared, on
its slot), in one cluster pipeline (one round trip per primary). Every call answers
for every group of its partitions at once (``lag_partition.lua``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._model._lag import GroupLag, LagReport, PartitionLag
from ..._model._stream import paused_state
from ._codec import stream_record, text
from ._core import RedisCore
from ._scripts import ScriptCall

__all__ = ["LagOperations"]

_GONE = -1
"""What the scripts answer for a deleted partition, a deleted group, or no oldest event."""

_Member = tuple[str, int, list[str], dict[str, int]]
"""A stream the report reads: name, partition count, group names, group -> pause end."""


class LagOperations(RedisCore):
    """``lag_report``."""

    async def lag_report(self, streams: Sequence[str] | None) -> LagReport:
        """Every group of ``streams`` (``None``: every stream), read in four round trips
        (see the module docstring); a stream or group deleted meanwhile is left out."""
        seconds, micros = await self._io(self._client.time())  # a Cluster pipelines no TIME
        now = int(seconds) * 1000 + int(micros) // 1000
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
        group (``lag_partition.lua``)."""
        calls: list[ScriptCall] = []
        for name, count, groups, _ in members:
            if self._cluster:
                calls.extend(self._lag_call(name, p, groups, now) for p in range(count))
            else:
                calls.append(("lag_many", [], [now, self._keys.tag_head(name), count,
                                               len(groups), *groups]))
        replies = await self._eval(calls)
        if self._cluster:
            return [[int(v) for v in reply] for reply in replies]
        rows: list[list[int]] = []
        for (_, count, groups, _), reply in zip(members, replies, strict=True):
            width = 1 + 4 * len(groups)
            values = [int(v) for v in reply]
            rows.extend(values[p * width:(p + 1) * width] for p in range(count))
        return rows

    def _lag_call(self, stream: str, partition: int, groups: Sequence[str],
                  now: int) -> ScriptCall:
        """The ``lag.lua`` call of one partition for the stream's groups."""
        head = self._keys.partition(stream, partition)
        keys = [head.stream, head.meta, self._keys.times(stream, partition)]
        for group in groups:
            group_keys = self._keys.group(stream, group, partition)
            keys += (group_keys.group, group_keys.dead)
        return "lag", keys, [now]


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
