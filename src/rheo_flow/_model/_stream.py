"""Stream and group metadata."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = ["DeadLetter", "GroupInfo", "StartPosition", "StreamInfo"]

StartPosition: TypeAlias = Literal["earliest", "latest"] | int
"""Where a new group starts, or where ``reset`` moves it: the earliest event,
after the latest one, or after a given sequence (in every partition)."""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream's metadata: partition count and per-partition sequence bounds."""

    name: str
    partitions: int
    created_at_ms: int
    high_water: Mapping[int, int]
    """Highest appended sequence per partition (0 when empty)."""
    low_water: Mapping[int, int]
    """Lowest retained sequence per partition (``high_water + 1`` when nothing is retained)."""


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group's settings on one stream."""

    stream: str
    group: str
    max_attempts: int
    created_at_ms: int
    ordering: str = "none"
    """``"key"``: a delivery is leased only once every earlier delivery of its key in its
    partition is settled (docs/ordering.md); ``"none"``: in partition order only."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A delivery rejected for a group (by ``reject`` or past ``max_attempts``)."""

    stream: str
    group: str
    partition: int
    sequence: int
    event_id: str
    attempts: int
    reason: str
    """``"max_attempts"`` when the attempts ran out, else the reject's reason."""
    rejected_at_ms: int
    last_error: str | None = None
    """The last failure recorded by a nack or reject of the delivery (``"Type: message"``
    for a handler that raised), kept when it later ran out of attempts; ``None`` when
    no failure was recorded."""
