"""The lag report composed from a backend's other reads (the default of
:meth:`~rheo_flow.Backend.lag_report`; backends answer it in fewer round trips)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._model._errors import UnknownGroup, UnknownStream
from .._model._lag import GroupLag, LagReport, PartitionLag
from .._model._query import Query
from ._delay import scheduled_counts

if TYPE_CHECKING:
    from .._backend import Backend

__all__ = ["composed_lag_report"]

_PAGE = 1_000


async def composed_lag_report(backend: Backend, streams: Sequence[str] | None) -> LagReport:
    """Every group of ``streams`` (``None``: of every stream): a stream or group deleted
    while it is read is left out."""
    now = await backend.now_ms()
    wanted = None if streams is None else set(streams)
    groups: list[GroupLag] = []
    for info, group_infos in await backend.describe_streams():
        if wanted is not None and info.name not in wanted:
            continue
        try:
            frontiers = await backend.frontiers(info.name)
        except UnknownStream:
            continue
        high = dict(info.high_water)
        for group_info in sorted(group_infos, key=lambda g: g.group):
            frontier = frontiers.get(group_info.group)
            if frontier is None:
                continue
            try:
                scheduled = await scheduled_counts(backend, info.name, frontier, high)
                partitions = tuple([
                    PartitionLag(p, h, frontier.get(p, 0), scheduled.get(p, 0),
                                 await _oldest(backend, info.name, p, frontier.get(p, 0), h))
                    for p, h in sorted(high.items())])
                letters = await _count_dead_letters(backend, info.name, group_info.group)
            except (UnknownStream, UnknownGroup):
                continue
            groups.append(GroupLag(info.name, group_info.group, partitions, letters,
                                   group_info.paused, group_info.paused_until_ms))
    groups.sort(key=lambda g: (g.stream, g.group))
    return LagReport(now, tuple(groups))


async def _oldest(backend: Backend, stream: str, partition: int, frontier: int,
                  high: int) -> int | None:
    if high <= frontier:
        return None
    events = await backend.query(Query(stream=stream, partitions=[partition],
                                       from_sequence=frontier + 1), 1, None)
    return events[0].appended_at_ms if events else None


async def _count_dead_letters(backend: Backend, stream: str, group: str) -> int:
    count = 0
    after: tuple[int, int] | None = None
    while True:
        page = await backend.dead_letters(stream, group, _PAGE, after)
        count += len(page)
        if len(page) < _PAGE:
            return count
        after = (page[-1].partition, page[-1].sequence)
