"""The in-memory backend: ephemeral, single-process, the reference semantics.

All state lives in dicts; every operation runs without awaiting, so it is atomic
with respect to other tasks on the event loop. Time comes from an injectable
clock so lease expiry is deterministic in tests.

What a settle, renew or expiry does to a delivery, and how far the frontier
moves, is decided by the lease rules of ``_transitions``; this module stores
their outcomes.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._backend import DEFAULT_MAX_ATTEMPTS, AppendRecord, Backend
from .._model._capabilities import Capabilities
from .._model._errors import ConflictError, UnknownGroup, UnknownStream
from .._model._event import Event, make_event_json
from .._model._lease import Lease, make_lease
from .._model._query import Query
from .._model._settle_results import SettleKind, SettleResult, settle_ok
from .._model._stream import DeadLetter, GroupInfo, StartPosition, StreamInfo
from .._model._validation import check_record_text, ordering_mismatch
from .._support._clock import Clock, system_clock
from ._shared import (
    Rotation,
    Waiters,
    fence,
    missing_delivery,
    query_matches,
    query_window,
    round_robin,
    start_position,
)
from ._transitions import (
    TERMINAL,
    DeliveryState,
    Op,
    Settled,
    advance_frontier,
    expire,
    renew_delivery,
    settle_delivery,
)

__all__ = ["MemoryBackend"]

_NEVER = 2**63


@dataclass(slots=True)
class _Delivery:
    sequence: int
    state: DeliveryState = "available"
    attempt: int = 0
    lease_id: str | None = None
    receipt: str | None = None
    consumer_id: str | None = None
    deadline_ms: int = 0
    available_at_ms: int = 0
    settled_by: Op | None = None
    reason: str = ""
    rejected_at_ms: int = 0
    last_error: str | None = None


@dataclass(slots=True)
class _Partition:
    events: dict[int, Event] = field(default_factory=dict)
    high_water: int = 0
    low_water: int = 1


@dataclass(slots=True)
class _Stream:
    name: str
    partitions: list[_Partition]
    created_at_ms: int
    ids: dict[str, Event] = field(default_factory=dict)


@dataclass(slots=True)
class _GroupPartition:
    cursor: int = 0
    """Highest sequence whose delivery exists (materialised)."""
    frontier: int = 0
    active: dict[int, _Delivery] = field(default_factory=dict)
    """Deliveries that are available or leased."""
    done: dict[int, _Delivery] = field(default_factory=dict)
    """Terminal deliveries (acked or rejected)."""
    due: int = 0
    """No active delivery becomes eligible before this time (a lower bound): while it
    lies ahead, ``fetch`` only takes new deliveries and skips scanning the active ones."""


@dataclass(slots=True)
class _Group:
    info: GroupInfo
    partitions: list[_GroupPartition]
    rotation: Rotation[None] = field(default_factory=Rotation)
    """Where the group's next fetch starts its round of partitions."""
    ordered: bool = False
    """``ordering="key"``: a delivery of key K waits for every earlier one of K."""


class MemoryBackend(Backend):
    """Ephemeral in-process backend; ``clock`` returns epoch milliseconds."""

    name = "memory"
    _CAPABILITIES = Capabilities(durable=False, distributed=False, push_wakeups=True,
                                 key_ordering=True, last_error=True)

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or system_clock
        self._streams: dict[str, _Stream] = {}
        self._groups: dict[tuple[str, str], _Group] = {}
        self._waiters = Waiters()  # idle consumers, by stream name
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

    def _stream(self, name: str) -> _Stream:
        try:
            return self._streams[name]
        except KeyError:
            raise UnknownStream(name) from None

    def _info(self, s: _Stream) -> StreamInfo:
        return StreamInfo(s.name, len(s.partitions), s.created_at_ms,
                          {i: p.high_water for i, p in enumerate(s.partitions)},
                          {i: p.low_water for i, p in enumerate(s.partitions)})

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        existing = self._streams.get(name)
        if existing is not None:
            if len(existing.partitions) != partitions:
                raise ConflictError(
                    f"stream {name!r} exists with {len(existing.partitions)} partitions, "
                    f"not {partitions}"
                )
            return self._info(existing)
        s = _Stream(name, [_Partition() for _ in range(partitions)], self._clock())
        self._streams[name] = s
        return self._info(s)

    async def stream_info(self, name: str) -> StreamInfo:
        return self._info(self._stream(name))

    async def list_streams(self) -> list[str]:
        return sorted(self._streams)

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        s = self._stream(stream)
        for r in records:  # the other stores refuse such text when they encode it
            if not (r.type.isascii() and r.id.isascii() and (r.key is None or r.key.isascii())):
                check_record_text(r.type, r.id, r.key)
        now = self._clock()
        out: list[Event] = []
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
            part.events[event.sequence] = event
            s.ids[r.id] = event
            out.append(event)
        if records:
            self._waiters.wake(stream)
        return out

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
            return g.info
        info = GroupInfo(stream, group, max_attempts or DEFAULT_MAX_ATTEMPTS, self._clock(),
                         "key" if ordering == "key" else "none")
        g = _Group(info, [_GroupPartition() for _ in s.partitions], ordered=ordering == "key")
        self._groups[(stream, group)] = g
        for i, part in enumerate(s.partitions):
            self._move_to(g.partitions[i], part, start)
        return info

    def _group(self, stream: str, group: str) -> _Group:
        self._stream(stream)
        try:
            return self._groups[(stream, group)]
        except KeyError:
            raise UnknownGroup(stream, group) from None

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        return self._group(stream, group).info

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        self._stream(stream)
        return [g.info for key, g in sorted(self._groups.items()) if key[0] == stream]

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        groups: dict[str, list[GroupInfo]] = {name: [] for name in self._streams}
        for (stream, _), g in sorted(self._groups.items()):
            groups[stream].append(g.info)
        return [(self._info(self._streams[name]), groups[name]) for name in sorted(groups)]

    # Leases ------------------------------------------------------------------

    async def fetch(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> list[Lease]:
        s = self._stream(stream)
        g = self._group(stream, group)
        now = self._clock()
        ids = list(range(len(s.partitions))) if partitions is None else list(partitions)
        if not ids:
            return []
        ids = g.rotation.order(None, ids)
        eligible = self._eligible_by_key if g.ordered else self._eligible
        per_partition = [eligible(g, pid, s, now, limit) for pid in ids]
        leases: list[Lease] = []
        group_name = g.info.group
        # Round-robin across partitions so one deep partition does not starve the others.
        order = round_robin([len(c) + n for c, n in per_partition], limit)
        for index, count in Counter(index for index, _ in order).items():
            found = per_partition[index][0]  # the soonest due: leased in sequence order
            found[:count] = sorted(found[:count], key=lambda d: d.sequence)
        for index, depth in order:
            pid = ids[index]
            candidates, _ = per_partition[index]
            gp = g.partitions[pid]
            if depth < len(candidates):
                d = candidates[depth]
            else:  # the next new delivery of the partition
                gp.cursor += 1
                d = _Delivery(gp.cursor)
                gp.active[gp.cursor] = d
            d.state = "leased"
            d.attempt += 1
            d.lease_id = f"{self._lease_prefix}{next(self._lease_counter):x}"
            d.receipt = f"{pid}-{d.sequence}-{d.attempt}"
            d.consumer_id = consumer_id
            d.deadline_ms = deadline = now + lease_ms
            d.settled_by = None
            if deadline < gp.due:
                gp.due = deadline
            leases.append(make_lease(d.lease_id, d.receipt, group_name, consumer_id,
                                     s.partitions[pid].events[d.sequence], d.attempt, deadline))
        return leases

    def _eligible(
        self, g: _Group, pid: int, s: _Stream, now: int, limit: int
    ) -> tuple[list[_Delivery], int]:
        """The partition's eligible existing deliveries, the soonest due first (then by
        sequence, as SQLite's index reads them), and how many new ones it can add."""
        gp = g.partitions[pid]
        out: list[_Delivery] = []
        if gp.active and gp.due <= now:
            times = [(d.available_at_ms if d.state == "available" else d.deadline_ms, seq, d)
                     for seq, d in gp.active.items()]
            due = min((t for t, _, _ in times if t > now), default=_NEVER)
            for _, _, d in sorted(item for item in times if item[0] <= now):
                if len(out) >= limit:
                    due = now  # not all taken: some are eligible already
                    break
                dead = expire(d.attempt, g.info.max_attempts, now)
                if dead is not None:
                    self._apply(gp, d, dead)
                    continue
                out.append(d)
            # What is taken now is leased (its deadline lowers ``due`` again) or
            # stays eligible (rescanned next time: ``now`` keeps ``due`` in the past).
            gp.due = now if out else due
        return out, min(limit - len(out), s.partitions[pid].high_water - gp.cursor)

    def _eligible_by_key(
        self, g: _Group, pid: int, s: _Stream, now: int, limit: int
    ) -> tuple[list[_Delivery], int]:
        """:meth:`_eligible` of a key-ordered group: a delivery of key K is eligible only
        when no earlier delivery of K is unsettled. New deliveries past the cursor are
        materialised here (blocked ones stay available), so the second count is 0."""
        gp = g.partitions[pid]
        events = s.partitions[pid].events
        out: list[_Delivery] = []
        blocked: set[str] = set()
        """Keys with an unsettled delivery so far in sequence order."""
        if gp.due > now:  # nothing existing is eligible: only their keys matter
            blocked.update(k for q in gp.active if (k := events[q].key) is not None)
        else:
            due = _NEVER
            for seq in sorted(gp.active):
                if len(out) >= limit:
                    gp.due = now  # not scanned to the end: some may be eligible already
                    return out, 0
                d = gp.active[seq]
                key = events[seq].key
                if key is not None and key in blocked:
                    continue
                ready_at = d.available_at_ms if d.state == "available" else d.deadline_ms
                if ready_at > now:
                    due = min(due, ready_at)
                elif (dead := expire(d.attempt, g.info.max_attempts, now)) is not None:
                    self._apply(gp, d, dead)  # a dead letter releases its key
                    continue
                else:
                    out.append(d)
                if key is not None:
                    blocked.add(key)
            gp.due = now if out else due
        high = s.partitions[pid].high_water
        while len(out) < limit and gp.cursor < high:
            gp.cursor += 1
            d = gp.active[gp.cursor] = _Delivery(gp.cursor)
            key = events[gp.cursor].key
            if key is None or key not in blocked:
                out.append(d)
                if key is not None:
                    blocked.add(key)
        if out:
            gp.due = now
        return out, 0

    def _find(self, lease: Lease) -> tuple[_Group, _GroupPartition, _Delivery] | SettleResult:
        event = lease.event
        g = self._groups.get((event.stream, lease.group))
        s = self._streams.get(event.stream)
        pid = event.partition
        if g is None or s is None or not 0 <= pid < len(g.partitions):
            return SettleResult.failure(
                lease.lease_id, SettleKind.INVALID, "lease names no group of this backend"
            )
        gp = g.partitions[pid]
        seq = event.sequence
        d = gp.active.get(seq) or gp.done.get(seq)
        if d is None:
            return missing_delivery(lease, s.partitions[pid].high_water)
        if d.lease_id != lease.lease_id or d.receipt != lease.receipt:
            return fence(lease, d.lease_id, d.receipt) or (g, gp, d)
        return g, gp, d

    def _settle(self, leases: Sequence[Lease], op: Op, reason: str, delay_ms: int,
                error: str | None = None) -> list[SettleResult]:
        now = self._clock()
        results: list[SettleResult] = []
        append = results.append
        for lease in leases:
            found = self._find(lease)
            if isinstance(found, SettleResult):
                append(found)
                continue
            g, gp, d = found
            outcome = settle_delivery(lease, d.state, d.settled_by, d.attempt,
                                      g.info.max_attempts, op, reason, delay_ms, now)
            if isinstance(outcome, SettleResult):
                append(outcome)
                continue
            if error is not None:
                d.last_error = error
            self._apply(gp, d, outcome)
            if g.ordered and outcome.terminal:
                gp.due = 0  # the next delivery of its key may be eligible now
            append(settle_ok(lease.lease_id))
        return results

    def _apply(self, gp: _GroupPartition, d: _Delivery, outcome: Settled) -> None:
        """Store what a settle or an expiry made of delivery ``d``."""
        d.state = state = outcome.state
        d.reason = outcome.reason
        d.settled_by = outcome.settled_by
        if state in TERMINAL:  # for good: kept apart, the frontier may move over it
            if outcome.rejected_at_ms is not None:
                d.rejected_at_ms = outcome.rejected_at_ms
            gp.active.pop(d.sequence, None)
            gp.done[d.sequence] = d
            gp.frontier = advance_frontier(gp.frontier, gp.done)
        elif outcome.available_at_ms is not None:
            d.available_at_ms = available = outcome.available_at_ms
            if available < gp.due:
                gp.due = available

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return self._settle(leases, "ack", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return self._settle(leases, "nack", reason, delay_ms, error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return self._settle(leases, "reject", reason, 0, error)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        now = self._clock()
        results: list[SettleResult] = []
        for lease in leases:
            found = self._find(lease)
            if isinstance(found, SettleResult):
                results.append(found)
                continue
            _, gp, d = found
            result = renew_delivery(lease, d.state, d.settled_by, now, lease_ms)
            if result.deadline_ms is not None:
                d.deadline_ms = result.deadline_ms
                gp.due = min(gp.due, d.deadline_ms)  # a renew may shorten a lease
            results.append(result)
        return results

    # Progress ----------------------------------------------------------------

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        g = self._group(stream, group)
        return {i: gp.frontier for i, gp in enumerate(g.partitions)}

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        s = self._stream(stream)
        g = self._group(stream, group)
        out: list[DeadLetter] = []
        for pid, gp in enumerate(g.partitions):
            for seq in sorted(gp.done):
                d = gp.done[seq]
                if d.state != "rejected" or (after is not None and (pid, seq) <= after):
                    continue
                event = s.partitions[pid].events.get(seq)
                if event is None:
                    continue
                out.append(DeadLetter(stream, group, pid, seq, event.id, d.attempt, d.reason,
                                      d.rejected_at_ms, d.last_error))
                if len(out) >= limit:
                    return out
        return out

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        s = self._stream(stream)
        g = self._group(stream, group)
        wanted = None if positions is None else set(positions)
        now = self._clock()
        count = 0
        for pid, gp in enumerate(g.partitions):
            for seq in sorted(gp.done):
                d = gp.done[seq]
                if d.state != "rejected" or (wanted is not None and (pid, seq) not in wanted):
                    continue
                if seq not in s.partitions[pid].events:
                    continue
                self._make_available(gp, d, now)
                count += 1
            gp.frontier = min(gp.frontier, min(gp.active, default=gp.frontier + 1) - 1)
        return count

    def _make_available(self, gp: _GroupPartition, d: _Delivery, now: int) -> None:
        gp.done.pop(d.sequence, None)
        d.state = "available"
        d.attempt = 0
        d.lease_id = None
        d.receipt = None
        d.settled_by = None
        d.available_at_ms = now
        d.reason = ""
        d.last_error = None
        gp.active[d.sequence] = d
        gp.due = min(gp.due, now)

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        s = self._stream(stream)
        g = self._group(stream, group)
        for pid in partitions:
            gp = g.partitions[pid]
            # Trimmed events are gone and count as settled: replay starts at the low water.
            start = max(from_sequence, s.partitions[pid].low_water)
            # Forgetting a delivery fences its lease; it is materialised again, attempt 1.
            _forget(gp, start, _NEVER)
            gp.cursor = min(gp.cursor, start - 1)
            gp.frontier = min(gp.frontier, start - 1)

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        s = self._stream(stream)
        g = self._group(stream, group)
        for pid in partitions:
            part = s.partitions[pid]
            self._move_to(g.partitions[pid], part, to)

    def _move_to(self, gp: _GroupPartition, part: _Partition, start: StartPosition) -> None:
        """Forget every delivery: up to ``start`` counts as settled, the rest is to deliver."""
        position = start_position(start, part.high_water, part.low_water)
        gp.active.clear()
        gp.done.clear()
        gp.cursor = position
        gp.frontier = position

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
            for (gs, _), g in self._groups.items():
                if gs != stream:
                    continue
                gp = g.partitions[pid]
                _forget(gp, 0, bound)
                gp.cursor = max(gp.cursor, bound)
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

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        self._stream(stream)
        return await self._waiters.wait(stream, timeout)


def _forget(gp: _GroupPartition, first: int, last: int) -> None:
    """Drop the deliveries of sequences ``first..last``: their leases are fenced."""
    for kept in (gp.active, gp.done):
        for seq in [q for q in kept if first <= q <= last]:
            del kept[seq]
    gp.due = 0  # a later delivery of a dropped one's key may be eligible now
