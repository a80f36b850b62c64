"""The in-memory backend's stored state: streams, partitions, groups and deliveries.

Plain dataclasses in dicts and lists; the operation mixins (``_fetch``,
``_settle``, ``_progress``) and the backend class (``_backend``) read and
change them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..._model._event import Event
from ..._model._stream import GroupInfo
from .._shared import Rotation
from .._transitions import DeliveryState, Op

__all__ = ["NEVER", "Delivery", "Group", "GroupPartition", "Partition", "Stream", "forget"]

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


@dataclass(slots=True)
class Stream:
    """A stream: its partitions and its event-id index (appends are idempotent on it)."""

    name: str
    partitions: list[Partition]
    created_at_ms: int
    ids: dict[str, Event] = field(default_factory=dict)


@dataclass(slots=True)
class GroupPartition:
    """A group's progress in one partition: cursor, frontier and deliveries."""

    cursor: int = 0
    """Highest sequence whose delivery exists (materialised)."""
    frontier: int = 0
    active: dict[int, Delivery] = field(default_factory=dict)
    """Deliveries that are available or leased."""
    done: dict[int, Delivery] = field(default_factory=dict)
    """Terminal deliveries (acked or rejected)."""
    due: int = 0
    """No active delivery becomes eligible before this time (a lower bound): while it
    lies ahead, ``fetch`` only takes new deliveries and skips scanning the active ones."""


@dataclass(slots=True)
class Group:
    """A consumer group of a stream: its settings and its progress per partition."""

    info: GroupInfo
    partitions: list[GroupPartition]
    rotation: Rotation[None] = field(default_factory=Rotation)
    """Where the group's next fetch starts its round of partitions."""
    ordered: bool = False
    """``ordering="key"``: a delivery of key K waits for every earlier one of K."""


def forget(gp: GroupPartition, first: int, last: int) -> None:
    """Drop the deliveries of sequences ``first..last``: their leases are fenced."""
    for kept in (gp.active, gp.done):
        for seq in [q for q in kept if first <= q <= last]:
            del kept[seq]
    gp.due = 0  # a later delivery of a dropped one's key may be eligible now
