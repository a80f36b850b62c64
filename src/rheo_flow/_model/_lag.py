"""What a group has left to consume, read from the store: the lag report.

One report answers for every stream and group at once (what a metrics scrape, an
autoscaler or ``rheo-flow lag --json`` reads), at one reading of the backend's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GroupLag", "LagReport", "PartitionLag", "age_seconds"]


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of one group: how far its frontier is behind the high water."""

    partition: int
    high_water: int
    """Highest appended sequence of the partition (0 when empty)."""
    frontier: int
    """The group's contiguous frontier (every delivery up to it is settled)."""
    scheduled: int
    """Of :attr:`lag`, the events whose ``deliver_at`` is still ahead of the clock."""
    oldest_unsettled_ms: int | None
    """When the first event past the frontier was appended (ms since the epoch, the
    backend's clock); ``None`` when nothing is past it."""

    @property
    def lag(self) -> int:
        """``high_water - frontier`` (never below 0): appended but not settled."""
        return max(0, self.high_water - self.frontier)


@dataclass(frozen=True, slots=True)
class GroupLag:
    """One consumer group of one stream, partition by partition."""

    stream: str
    group: str
    partitions: tuple[PartitionLag, ...]
    """Every partition of the stream, in partition order."""
    dead_letters: int
    """How many of the group's deliveries are dead letters (rejected)."""
    paused: bool = False
    """The group is paused (its fetches return nothing) at the report's time."""
    paused_until_ms: int | None = None
    """When the pause ends by itself; ``None`` when not paused or paused until resumed."""

    @property
    def lag(self) -> int:
        """The group's lag summed over its partitions."""
        return sum(p.lag for p in self.partitions)

    @property
    def scheduled(self) -> int:
        """Of :attr:`lag`, the events not due yet, over every partition."""
        return sum(p.scheduled for p in self.partitions)

    @property
    def oldest_unsettled_ms(self) -> int | None:
        """The earliest :attr:`PartitionLag.oldest_unsettled_ms` over the partitions."""
        return min((p.oldest_unsettled_ms for p in self.partitions
                    if p.oldest_unsettled_ms is not None), default=None)


@dataclass(frozen=True, slots=True)
class LagReport:
    """Every group of the streams asked for, read at :attr:`read_at_ms`."""

    read_at_ms: int
    """The backend's clock when the report was read (ages are measured from it)."""
    groups: tuple[GroupLag, ...]
    """By stream, then group name."""

    def group(self, stream: str, group: str) -> GroupLag | None:
        """The entry of one group, or ``None`` when the report has none."""
        for entry in self.groups:
            if entry.stream == stream and entry.group == group:
                return entry
        return None


def age_seconds(since_ms: int | None, now_ms: int) -> float | None:
    """Seconds from ``since_ms`` to ``now_ms`` (a report's ``read_at_ms``), never below 0;
    ``None`` when there is no such time (nothing unsettled)."""
    return None if since_ms is None else max(0, now_ms - since_ms) / 1000
