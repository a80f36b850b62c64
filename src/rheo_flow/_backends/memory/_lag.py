"""The in-memory backend's lag report (rule ``lag.report``): read straight from its state."""

from __future__ import annotations

from collections.abc import Sequence

from ..._model._lag import GroupLag, LagReport, PartitionLag
from ._core import MemoryCore
from ._state import Group, Partition, Stream

__all__ = ["LagOps"]


class LagOps(MemoryCore):
    """:meth:`lag_report` from the streams and groups in memory, with no await between
    reads: the report is one consistent state."""

    async def lag_report(self, streams: Sequence[str] | None) -> LagReport:
        now = self._clock()
        wanted = None if streams is None else set(streams)
        groups = [_group_lag(self._streams[stream], name, g, now)
                  for (stream, name), g in self._groups.items()
                  if wanted is None or stream in wanted]
        groups.sort(key=lambda entry: (entry.stream, entry.group))
        return LagReport(now, tuple(groups))


def _group_lag(s: Stream, name: str, g: Group, now: int) -> GroupLag:
    partitions = []
    letters = 0
    for pid, gp in enumerate(g.partitions):
        part = s.partitions[pid]
        letters += sum(1 for seq, d in gp.done.items()
                       if d.state == "rejected" and seq in part.events)
        scheduled = sum(1 for seq, at in part.scheduled.items()
                        if seq > gp.frontier and at > now and seq in part.events)
        partitions.append(PartitionLag(pid, part.high_water, gp.frontier, scheduled,
                                       _oldest(part, gp.frontier)))
    view = g.view(now)
    return GroupLag(s.name, name, tuple(partitions), letters, view.paused, view.paused_until_ms)


def _oldest(part: Partition, frontier: int) -> int | None:
    """When the first stored event past ``frontier`` was appended."""
    for seq in range(max(frontier + 1, part.low_water), part.high_water + 1):
        event = part.events.get(seq)
        if event is not None:
            return event.appended_at_ms
    return None
