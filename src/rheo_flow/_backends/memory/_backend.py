"""The :class:`MemoryBackend` class: construction, streams, groups, reads and retention.

The operations on deliveries live in mixins by concern (``_fetch``, ``_settle``,
``_progress``, ``_lag``), all on :class:`~._core.MemoryCore`; this module builds the
backend and holds what is left: streams and appends, groups, queries, trim,
deletion and the wait for appends.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence

from ..._backend import DEFAULT_MAX_ATTEMPTS, AppendRecord, Backend
from ..._model._capabilities import Capabilities
from ..._model._errors import ConflictError, UnknownStream
from ..._model._event import Event, make_event_json
from ..._model._query import Query
from ..._model._stream import (
    PAUSED_UNTIL_RESUMED,
    GroupInfo,
    Retention,
    StartPosition,
    StreamInfo,
)
from ..._model._validation import check_record_text, ordering_mismatch
from ..._support._clock import Clock, system_clock
from .._shared import Waiters, query_matches, query_window
from .._transitions import advance_frontier
from ._fetch import FetchOps
from ._lag import LagOps
from ._progress import ProgressOps
from ._settle import SettleOps
from ._state import Group, Partition, Stream, forget

__all__ = ["MemoryBackend"]


class MemoryBackend(FetchOps, SettleOps, ProgressOps, LagOps, Backend):
    """Ephemeral in-process backend; ``clock`` returns epoch milliseconds."""

    name = "memory"
    _CAPABILITIES = Capabilities(durable=False, distributed=False, push_wakeups=True,
                                 key_ordering=True, last_error=True, pause=True,
                                 delayed_delivery=True, retention=True)

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or system_clock
        self._streams = {}
        self._groups = {}
        self._waiters = Waiters()
        # Lease ids need only be unique here: a random prefix and a counter cost less than uuids.
        self._lease_prefix = os.urandom(8).hex()
        self._lease_counter = itertools.count(1)

    @classmethod
    def from_url(cls, url: str) -> MemoryBackend:
        """``memory://`` (nothing after the scheme is used)."""
        return cls()

    @property
    def capabilities(self) -> Capabilities:
        """Ephemeral, single-process, with in-process push wake-ups and key ordering."""
        return self._CAPABILITIES

    # Streams -----------------------------------------------------------------

    def _info(self, s: Stream) -> StreamInfo:
        return StreamInfo(s.name, len(s.partitions), s.created_at_ms,
                          {i: p.high_water for i, p in enumerate(s.partitions)},
                          {i: p.low_water for i, p in enumerate(s.partitions)}, s.retention)

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        existing = self._streams.get(name)
        if existing is not None:
            if len(existing.partitions) != partitions:
                raise ConflictError(
                    f"stream {name!r} exists with {len(existing.partitions)} partitions, "
                    f"not {partitions}"
                )
            return self._info(existing)
        s = Stream(name, [Partition() for _ in range(partitions)], self._clock())
        self._streams[name] = s
        return self._info(s)

    async def stream_info(self, name: str) -> StreamInfo:
        return self._info(self._stream(name))

    async def list_streams(self) -> list[str]:
        return sorted(self._streams)

    async def set_retention(self, stream: str, retention: Retention | None) -> None:
        self._stream(stream).retention = retention

    async def now_ms(self) -> int:
        return self._clock()

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        s = self._stream(stream)
        for r in records:  # the other stores refuse such text when they encode it
            if not (r.type.isascii() and r.id.isascii() and (r.key is None or r.key.isascii())):
                check_record_text(r.type, r.id, r.key)
        now = self._clock()
        out: list[Event] = []
        touched: set[int] = set()
        for r in records:
            existing = s.ids.get(r.id)
            if existing is not None:
                out.append(existing)
                continue
            part = s.partitions[r.partition]
            part.high_water += 1
            # Decoded on first read: stored events share nothing with the caller's objects.
            event = make_event_json(stream, r.partition, part.high_water, r.id, r.type,
                                    r.data_json, r.key, dict(r.headers) if r.headers else {},
                                    now)
            if r.deliver_at_ms is not None:
                part.scheduled[part.high_water] = r.deliver_at_ms
                part.last_scheduled = part.high_water
            part.events[event.sequence] = event
            s.ids[r.id] = event
            touched.add(r.partition)
            out.append(event)
        for g in s.groups.values():  # their cursors were at most the old high waters
            g.work.new.update(touched)
        if records:
            self._waiters.wake(stream)
            if self._clock is system_clock:  # the timers run on the system's clock
                self._waiters.wake_at(stream, records, now)
        return out

    async def scheduled(self, stream: str, after: Mapping[int, int]) -> dict[int, int]:
        s = self._stream(stream)
        now = self._clock()
        return {pid: sum(1 for seq, at in s.partitions[pid].scheduled.items()
                         if seq > last and at > now and seq in s.partitions[pid].events)
                for pid, last in after.items()}

    # Groups ------------------------------------------------------------------

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None,
        *, ordering: str = "none",
    ) -> GroupInfo:
        s = self._stream(stream)
        g = self._groups.get((stream, group))
        if g is not None:
            if ordering == "key" and g.info.ordering != "key":
                raise ordering_mismatch(stream, group, g.info.ordering, ordering)
            if max_attempts is not None and max_attempts != g.info.max_attempts:
                g.info = GroupInfo(stream, group, max_attempts, g.info.created_at_ms,
                                   g.info.ordering)
            return g.view(self._clock())
        info = GroupInfo(stream, group, max_attempts or DEFAULT_MAX_ATTEMPTS, self._clock(),
                         "key" if ordering == "key" else "none")
        g = Group.create(info, len(s.partitions))
        self._groups[(stream, group)] = s.groups[group] = g
        for i, part in enumerate(s.partitions):
            self._move_to(g.partitions[i], part, start)
        return info

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        return self._group(stream, group).view(self._clock())

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        self._stream(stream)
        now = self._clock()
        return [g.view(now) for key, g in sorted(self._groups.items()) if key[0] == stream]

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        groups: dict[str, list[GroupInfo]] = {name: [] for name in self._streams}
        now = self._clock()
        for (stream, _), g in sorted(self._groups.items()):
            groups[stream].append(g.view(now))
        return [(self._info(self._streams[name]), groups[name]) for name in sorted(groups)]

    async def pause_group(self, stream: str, group: str, until_ms: int | None) -> GroupInfo:
        g = self._group(stream, group)
        g.paused_until = PAUSED_UNTIL_RESUMED if until_ms is None else until_ms
        return g.view(self._clock())

    async def resume_group(self, stream: str, group: str) -> GroupInfo:
        g = self._group(stream, group)
        g.paused_until = 0
        self._waiters.wake(stream)
        return g.view(self._clock())

    # Reads and retention -----------------------------------------------------

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        s = self._stream(query.stream)
        pids = range(len(s.partitions)) if query.partitions is None else sorted(query.partitions)
        out: list[Event] = []
        for pid in pids:
            part = s.partitions[pid]
            window = query_window(query, pid, after, part.low_water, part.high_water)
            if window is None:
                continue
            lo, hi = window  # hi is None only for an unknown high water: never here
            for seq in range(lo, (part.high_water if hi is None else hi) + 1):
                e = part.events.get(seq)
                if e is None or not query_matches(query, e):
                    continue
                out.append(e)
                if len(out) >= limit:
                    return out
        return out

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        s = self._stream(stream)
        removed: dict[int, int] = {}
        for pid, bound in up_to.items():
            part = s.partitions[pid]
            bound = min(bound, part.high_water)
            count = 0
            for seq in range(part.low_water, bound + 1):
                e = part.events.pop(seq, None)
                if e is not None:
                    s.ids.pop(e.id, None)
                    count += 1
            part.low_water = max(part.low_water, bound + 1)
            removed[pid] = count
            for g in s.groups.values():
                gp = g.partitions[pid]
                forget(gp, 0, bound)
                gp.move_cursor(max(gp.cursor, bound), part.high_water)
                gp.frontier = advance_frontier(max(gp.frontier, bound), gp.done)
        return removed

    async def delete_stream(self, stream: str) -> None:
        if self._streams.pop(stream, None) is None:
            raise UnknownStream(stream)
        for key in [k for k in self._groups if k[0] == stream]:
            del self._groups[key]
        self._waiters.wake(stream)  # woken waiters find the stream gone

    async def delete_group(self, stream: str, group: str) -> None:
        self._group(stream, group)
        del self._groups[(stream, group)]
        del self._streams[stream].groups[group]

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        self._stream(stream)
        return await self._waiters.wait(stream, timeout)
