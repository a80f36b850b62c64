"""The in-memory backend's stored state: streams, partitions, groups and deliveries.

Plain dataclasses in dicts and lists; the operation mixins (``_fetch``,
``_settle``, ``_progress``) and the backend class (``_backend``) read and
change them. Each group also keeps where it may have work (:class:`Work`), so
that a fetch visits those partitions only, whatever the partition count.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from heapq import heapify, heappop, heappush

from ..._model._event import Event
from ..._model._stream import GroupInfo, Retention, paused_state
from .._shared import Rotation
from .._transitions import DeliveryState, Op

__all__ = [
    "NEVER", "Delivery", "Group", "GroupPartition", "Partition", "Stream", "Work", "forget",
]

NEVER = 2**63
"""A time after every other: no delivery becomes due then."""


@dataclass(slots=True)
class Delivery:
    """One event's delivery to one group: its state, attempts and current lease."""

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
class Partition:
    """One partition of a stream: its retained events by sequence, and its waters."""

    events: dict[int, Event] = field(default_factory=dict)
    high_water: int = 0
    low_water: int = 1
    scheduled: dict[int, int] = field(default_factory=dict)
    """The deliver_at_ms of each event appended with one, by sequence."""
    last_scheduled: int = 0
    """The highest sequence in ``scheduled`` (0: none): a cursor at or past it has no
    scheduled event ahead, and its fetch takes the plain path."""

    def deliver_at(self, seq: int, now: int) -> int | None:
        """When the event at ``seq`` becomes deliverable, if that is later than ``now``."""
        at = self.scheduled.get(seq)
        return at if at is not None and at > now else None


@dataclass(slots=True)
class Stream:
    """A stream: its partitions and its event-id index (appends are idempotent on it)."""

    name: str
    partitions: list[Partition]
    created_at_ms: int
    ids: dict[str, Event] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    """The stream's groups by name: an append tells each where new events are."""
    retention: Retention | None = None


@dataclass(slots=True, eq=False)
class Work:
    """Where a group may have work, so that a fetch visits only those partitions.

    ``new`` holds exactly the partitions whose cursor is below the high water
    (appends add to it; fetch, create_group, reset, replay and trim move cursors
    through :meth:`GroupPartition.move_cursor`). ``due`` is a heap of (time,
    partition), at least one entry per partition at its
    :attr:`GroupPartition.due` while that is not :data:`NEVER`. Entries are not
    removed when ``due`` moves: an entry that surfaces for a partition not due
    yet is dropped (lazy invalidation), and the heap is rebuilt from the
    partitions when it outgrows them.
    """

    partitions: list[GroupPartition] = field(default_factory=list, repr=False)
    new: set[int] = field(default_factory=set)
    due: list[tuple[int, int]] = field(default_factory=list)

    def push(self, at: int, pid: int) -> None:
        """File partition ``pid`` as due at ``at``."""
        heap = self.due
        heappush(heap, (at, pid))
        if len(heap) > 2 * len(self.partitions) + 64:  # mostly stale entries: rebuild
            self.due = [(gp.due, gp.pid) for gp in self.partitions if gp.due < NEVER]
            heapify(self.due)

    def pop_due(self, now: int) -> set[int]:
        """The partitions whose active deliveries may be eligible at ``now``, their
        entries taken off the heap: the fetch visits each, which files it again."""
        heap, partitions = self.due, self.partitions
        found: set[int] = set()
        while heap and heap[0][0] <= now:
            pid = heappop(heap)[1]
            if partitions[pid].due <= now:
                found.add(pid)
        return found


@dataclass(slots=True, eq=False)
class GroupPartition:
    """A group's progress in one partition: cursor, frontier and deliveries."""

    pid: int
    work: Work = field(repr=False)
    """The group's bookkeeping of where it has work (shared by its partitions)."""
    cursor: int = 0
    """Highest sequence whose delivery exists (materialised); set by :meth:`move_cursor`
    except where a fetch moves it over new events."""
    frontier: int = 0
    active: dict[int, Delivery] = field(default_factory=dict)
    """Deliveries that are available or leased."""
    done: dict[int, Delivery] = field(default_factory=dict)
    """Terminal deliveries (acked or rejected)."""
    due: int = NEVER
    """No active delivery becomes eligible before this time (a lower bound): while it
    lies ahead, ``fetch`` only takes new deliveries and skips scanning the active ones
    (and with no new events, skips the partition). Lowered by :meth:`may_be_due`, set
    after a scan by :meth:`scanned`, so that ``work.due`` always files it."""

    def may_be_due(self, at: int) -> None:
        """An active delivery may be eligible from ``at`` on."""
        if at < self.due:
            self.due = at
            self.work.push(at, self.pid)

    def scanned(self, due: int) -> None:
        """A fetch scanned the active deliveries: none is eligible before ``due``."""
        self.due = due
        if due < NEVER:
            self.work.push(due, self.pid)

    def move_cursor(self, cursor: int, high_water: int) -> None:
        """Set the cursor, and whether the partition has new events past it."""
        self.cursor = cursor
        if cursor < high_water:
            self.work.new.add(self.pid)
        else:
            self.work.new.discard(self.pid)


@dataclass(slots=True)
class Group:
    """A consumer group of a stream: its settings and its progress per partition."""

    info: GroupInfo
    partitions: list[GroupPartition]
    work: Work
    rotation: Rotation[None] = field(default_factory=Rotation)
    """Where the group's next fetch starts its round of partitions."""
    ordered: bool = False
    """``ordering="key"``: a delivery of key K waits for every earlier one of K."""
    paused_until: int = 0
    """The end of the group's pause (0: not paused; ``PAUSED_UNTIL_RESUMED``: none)."""

    def view(self, now: int) -> GroupInfo:
        """:attr:`info` with the pause as it stands at ``now``."""
        if self.paused_until <= now:
            return self.info
        paused, until = paused_state(self.paused_until, now)
        return replace(self.info, paused=paused, paused_until_ms=until)

    @classmethod
    def create(cls, info: GroupInfo, partitions: int) -> Group:
        """A group with nothing delivered yet in ``partitions`` partitions."""
        work = Work()
        work.partitions = [GroupPartition(pid, work) for pid in range(partitions)]
        return cls(info, work.partitions, work, ordered=info.ordering == "key")


def forget(gp: GroupPartition, first: int, last: int) -> None:
    """Drop the deliveries of sequences ``first..last``: their leases are fenced."""
    for kept in (gp.active, gp.done):
        for seq in [q for q in kept if first <= q <= last]:
            del kept[seq]
    gp.may_be_due(0)  # a later delivery of a dropped one's key may be eligible now
