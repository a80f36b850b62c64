"""Fetch: leasing a group's eligible deliveries, round-robin across its partitions.

A partition offers its existing deliveries that are due (available, or leased
past their deadline), the soonest due first, then new sequences past its
cursor; candidates are taken one per partition per round, so one deep
partition does not starve the others. A key-ordered group's partition offers a
delivery of key K only when no earlier one of K is unsettled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..._model._lease import Lease, make_lease
from .._shared import round_robin
from .._transitions import expire
from ._core import MemoryCore
from ._state import NEVER, Delivery, Group, Stream

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
                d = Delivery(gp.cursor)
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
        self, g: Group, pid: int, s: Stream, now: int, limit: int
    ) -> tuple[list[Delivery], int]:
        """The partition's eligible existing deliveries, the soonest due first (then by
        sequence, as SQLite's index reads them), and how many new ones it can add."""
        gp = g.partitions[pid]
        out: list[Delivery] = []
        if gp.active and gp.due <= now:
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
            # stays eligible (rescanned next time: ``now`` keeps ``due`` in the past).
            gp.due = now if out else due
        return out, min(limit - len(out), s.partitions[pid].high_water - gp.cursor)

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
            d = gp.active[gp.cursor] = Delivery(gp.cursor)
            key = events[gp.cursor].key
            if key is None or key not in blocked:
                out.append(d)
                if key is not None:
                    blocked.add(key)
        if out:
            gp.due = now
        return out, 0

