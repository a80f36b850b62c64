"""The lag report of the Redis backend: every group of many streams in four round trips.

One reading of the server clock, one of the stream records, one pipeline of the
streams' groups and pauses hashes, then one ``lag.lua`` call per partition (every
group of the partition at once), all in one pipeline: on a Redis Cluster one round
trip per primary, each call on its partition's slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._model._lag import GroupLag, LagReport, PartitionLag
from ..._model._stream import paused_state
from ._codec import stream_record, text
from ._core import RedisCore
from ._scripts import ScriptCall

__all__ = ["LagOperations"]

_GONE = -1
"""What ``lag.lua`` answers for a deleted partition, a deleted group, or no oldest event."""


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
        members: list[tuple[str, int, list[str], dict[str, int]]] = []
        calls: list[ScriptCall] = []
        for at, (name, count) in enumerate(chosen):
            groups = sorted(text(g) for g in hashes[2 * at])
            if not groups:
                continue
            pauses = {text(g): int(until) for g, until in hashes[2 * at + 1].items()}
            members.append((name, count, groups, pauses))
            calls.extend(self._lag_call(name, p, groups, now) for p in range(count))
        replies = await self._eval(calls)
        return LagReport(now, tuple(_groups_of(members, replies, now)))

    def _lag_call(self, stream: str, partition: int, groups: Sequence[str],
                  now: int) -> ScriptCall:
        """The ``lag.lua`` call of one partition for the stream's groups."""
        head = self._keys.partition(stream, partition)
        keys = [head.stream, head.meta, self._keys.times(stream, partition)]
        for group in groups:
            group_keys = self._keys.group(stream, group, partition)
            keys += (group_keys.group, group_keys.dead)
        return "lag", keys, [now]


def _groups_of(members: Sequence[tuple[str, int, list[str], dict[str, int]]],
               replies: Sequence[Any], now: int) -> list[GroupLag]:
    """The report's entries from the ``lag.lua`` replies, partition by partition in the
    order of ``members`` (stream, partition count, groups, pause ends)."""
    out: list[GroupLag] = []
    at = 0
    for stream, count, groups, pauses in members:
        rows = [[int(v) for v in reply] for reply in replies[at:at + count]]
        at += count
        if any(row[0] == _GONE for row in rows):
            continue
        for k, group in enumerate(groups):
            cells = [row[1 + 4 * k:5 + 4 * k] for row in rows]
            if any(frontier == _GONE for frontier, *_ in cells):
                continue
            partitions = tuple(
                PartitionLag(p, row[0], frontier, scheduled,
                             None if oldest == _GONE else oldest)
                for p, (row, (frontier, _, oldest, scheduled)) in enumerate(
                    zip(rows, cells, strict=True)))
            out.append(GroupLag(stream, group, partitions, sum(c[1] for c in cells),
                                *paused_state(pauses.get(group, 0), now)))
    return out
