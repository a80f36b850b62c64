"""Fetch: leasing a group's eligible deliveries, round-robin across its partitions.

A partition offers its existing deliveries that are due (available, or leased
past their deadline), the soonest due first, then new sequences past its
cursor; candidates are taken one per partition per round, so one deep
partition does not starve the others. A key-ordered group's partition offers a
delivery of key K only when no earlier one of K is unsettled.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence

from ..._model._lease import Lease, make_lease
from .._shared import round_robin
from .._transitions import expire
from ._core import MemoryCore
from ._state import NEVER, Delivery, Group, GroupPartition, Partition, Stream

__all__ = ["FetchOps"]


class FetchOps(MemoryCore):
    """:meth:`fetch` and the eligibility of one partition's deliveries."""

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
        if g.paused_until > now:
            return []
        ids = _with_work(g, now, len(s.partitions), partitions)
        if not ids:
            return []
        eligible = self._eligible_by_key if g.ordered else self._eligible
        per_partition = [eligible(g, pid, s, now, limit) for pid in ids]
        # Round-robin across partitions so one deep partition does not starve the others.
        order = round_robin([len(c) + n for c, n in per_partition], limit)
        counts = Counter(index for index, _ in order)
        for index, count in counts.items():
            found = per_partition[index][0]  # the soonest due: leased in sequence order
            found[:count] = sorted(found[:count], key=lambda d: d.sequence)
        leases = [self._lease(g, s, ids[index], per_partition[index][0], depth, consumer_id,
                              now + lease_ms) for index, depth in order]
        new = g.work.new
        for index, pid in enumerate(ids):
            gp = g.partitions[pid]
            if len(per_partition[index][0]) > counts[index]:
                gp.may_be_due(now)  # candidates left over: still eligible
            if gp.cursor >= s.partitions[pid].high_water:
                new.discard(pid)
        return leases

    def _lease(self, g: Group, s: Stream, pid: int, candidates: list[Delivery], depth: int,
               consumer_id: str, deadline: int) -> Lease:
        """Lease the candidate at ``depth`` of partition ``pid``: one of ``candidates``
        (existing deliveries), else the partition's next new delivery."""
        gp = g.partitions[pid]
        if depth < len(candidates):
            d = candidates[depth]
        else:  # the next new delivery of the partition
            gp.cursor += 1
            part = s.partitions[pid]
            if part.last_scheduled >= gp.cursor:  # scheduled ones on the way wait
                while (at := part.deliver_at(gp.cursor, self._clock())) is not None:
                    gp.active[gp.cursor] = d = Delivery(gp.cursor)
                    _schedule(gp, d, at)
                    gp.cursor += 1
            d = Delivery(gp.cursor)
            gp.active[gp.cursor] = d
        d.state = "leased"
        d.attempt += 1
        d.lease_id = f"{self._lease_prefix}{next(self._lease_counter):x}"
        d.receipt = f"{pid}-{d.sequence}-{d.attempt}"
        d.consumer_id = consumer_id
        d.deadline_ms = deadline
        d.settled_by = None
        gp.may_be_due(deadline)
        return make_lease(d.lease_id, d.receipt, g.info.group, consumer_id,
                          s.partitions[pid].events[d.sequence], d.attempt, deadline)

    def _eligible(
        self, g: Group, pid: int, s: Stream, now: int, limit: int
    ) -> tuple[list[Delivery], int]:
        """The partition's eligible existing deliveries, the soonest due first (then by
        sequence, as SQLite's index reads them), and how many new ones it can add."""
        gp = g.partitions[pid]
        out: list[Delivery] = []
        if gp.due <= now:
            times = [(d.available_at_ms if d.state == "available" else d.deadline_ms, seq, d)
                     for seq, d in gp.active.items()]
            due = min((t for t, _, _ in times if t > now), default=NEVER)
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
            # stays eligible (``fetch`` lowers ``due`` to now then).
            gp.scanned(due)
        part = s.partitions[pid]
        if part.last_scheduled > gp.cursor:
            return out, _new_before_scheduled(gp, part, now, limit - len(out))
        return out, min(limit - len(out), part.high_water - gp.cursor)

    def _eligible_by_key(
        self, g: Group, pid: int, s: Stream, now: int, limit: int
    ) -> tuple[list[Delivery], int]:
        """:meth:`_eligible` of a key-ordered group: a delivery of key K is eligible only
        when no earlier delivery of K is unsettled. New deliveries past the cursor are
        materialised here (blocked ones stay available), so the second count is 0."""
        gp = g.partitions[pid]
        events = s.partitions[pid].events
        out: list[Delivery] = []
        blocked: set[str] = set()
        """Keys with an unsettled delivery so far in sequence order."""
        if gp.due > now:  # nothing existing is eligible: only their keys matter
            blocked.update(k for q in gp.active if (k := events[q].key) is not None)
        else:
            due = NEVER
            for seq in sorted(gp.active):
                if len(out) >= limit:
                    gp.scanned(now)  # not scanned to the end: some may be eligible already
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
            gp.scanned(due)  # as in _eligible, ``fetch`` files what ``out`` leaves
        part = s.partitions[pid]
        high = part.high_water
        while len(out) < limit and gp.cursor < high:
            gp.cursor += 1
            d = gp.active[gp.cursor] = Delivery(gp.cursor)
            key = events[gp.cursor].key
            if part.last_scheduled >= gp.cursor and (
                    at := part.deliver_at(gp.cursor, now)) is not None:
                _schedule(gp, d, at)  # holds its key until delivered and settled
                if key is not None:
                    blocked.add(key)
            elif key is None or key not in blocked:
                out.append(d)
                if key is not None:
                    blocked.add(key)
        return out, 0


def _schedule(gp: GroupPartition, d: Delivery, at: int) -> None:
    """Make ``d``, a new delivery of an event scheduled for ``at``, available then."""
    d.available_at_ms = at
    gp.may_be_due(at)


def _new_before_scheduled(gp: GroupPartition, part: Partition, now: int, want: int) -> int:
    """How many new deliveries partition ``part`` offers (at most ``want``) when scheduled
    events may lie past the cursor: those right past it become available deliveries at
    their time (the cursor moves over them), and the count passes over the others
    (leasing moves the cursor over them the same way: :meth:`FetchOps._lease`)."""
    high = part.high_water
    while gp.cursor < high and (at := part.deliver_at(gp.cursor + 1, now)) is not None:
        gp.cursor += 1
        gp.active[gp.cursor] = d = Delivery(gp.cursor)
        _schedule(gp, d, at)
    count = 0
    seq = gp.cursor
    while count < want and seq < high:
        seq += 1
        if part.deliver_at(seq, now) is None:
            count += 1
    return count


def _with_work(g: Group, now: int, count: int, partitions: Sequence[int] | None) -> list[int]:
    """The partitions of ``partitions`` (``None``: all ``count``) that may have work at
    ``now``, in the order of this fetch's round: the rotation says where it starts.

    With all partitions the round visits those with new events or due deliveries,
    from the first at or after the start, as SQLite's fetch does; an idle
    partition costs nothing. Every partition returned is visited (its due time
    filed again).
    """
    work = g.work
    if partitions is not None:
        if not partitions:
            return []
        gps = g.partitions
        return [pid for pid in g.rotation.order(None, list(partitions))
                if pid in work.new or gps[pid].due <= now]
    start = g.rotation.start(None, count)
    due = work.pop_due(now)
    ids = sorted(work.new | due if due else work.new)
    at = bisect_left(ids, start)
    return ids[at:] + ids[:at] if at else ids
