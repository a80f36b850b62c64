"""A group's progress: frontiers, dead letters, redrive, replay and reset."""

from __future__ import annotations

from collections.abc import Sequence

from ..._model._stream import DeadLetter, StartPosition
from .._shared import start_position
from ._core import MemoryCore
from ._state import NEVER, Delivery, GroupPartition, Partition, forget

__all__ = ["ProgressOps"]


class ProgressOps(MemoryCore):
    """Reading and moving a group's progress, partition by partition."""

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

    def _make_available(self, gp: GroupPartition, d: Delivery, now: int) -> None:
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
        gp.may_be_due(now)

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
            forget(gp, start, NEVER)
            gp.move_cursor(min(gp.cursor, start - 1), s.partitions[pid].high_water)
            gp.frontier = min(gp.frontier, start - 1)

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        s = self._stream(stream)
        g = self._group(stream, group)
        for pid in partitions:
            part = s.partitions[pid]
            self._move_to(g.partitions[pid], part, to)

    def _move_to(self, gp: GroupPartition, part: Partition, start: StartPosition) -> None:
        """Forget every delivery: up to ``start`` counts as settled, the rest is to deliver."""
        position = start_position(start, part.high_water, part.low_water)
        gp.active.clear()
        gp.done.clear()
        gp.move_cursor(position, part.high_water)
        gp.frontier = position
