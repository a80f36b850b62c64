"""Stream and group metadata."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, TypeAlias

from ._errors import InvalidArgument

__all__ = ["PAUSED_UNTIL_RESUMED", "DeadLetter", "GroupInfo", "Retention", "StartPosition",
           "StreamInfo", "paused_state"]

_MS = timedelta(milliseconds=1)
MAX_RETENTION_EVENTS = 2**62

StartPosition: TypeAlias = Literal["earliest", "latest"] | int
"""Where a new group starts, or where ``reset`` moves it: the earliest event,
after the latest one, or after a given sequence (in every partition)."""


PAUSED_UNTIL_RESUMED = 2**62
"""The stored end of a pause without one (ms): after every real time, within a signed
64-bit integer. Backends store a group's pause as one integer, its end (0: not paused),
so that a fetch tells a paused group by one comparison with its clock."""


def paused_state(stored_until_ms: int, now_ms: int) -> tuple[bool, int | None]:
    """:attr:`GroupInfo.paused` and :attr:`GroupInfo.paused_until_ms` of a stored pause end
    (0: not paused; :data:`PAUSED_UNTIL_RESUMED`: until resumed) at ``now_ms``."""
    if stored_until_ms <= now_ms:
        return False, None
    return True, None if stored_until_ms >= PAUSED_UNTIL_RESUMED else stored_until_ms


@dataclass(frozen=True, slots=True)
class Retention:
    """A stream's retention policy (docs/contract.md, rule ``retention.settled``): what
    :meth:`~rheo_flow.Rheo.apply_retention` may remove, per partition.

    ``max_age``: events appended longer ago than this (by the backend's clock) go;
    ``max_events``: all but the last ``max_events`` events of each partition go. At
    least one is set; with both, an event goes when either says so. Either way only
    events every group has settled are removed.
    """

    max_age: timedelta | None = None
    """The age past which an event goes: a positive whole number of milliseconds."""
    max_events: int | None = None
    """How many of its latest events each partition keeps (at least 1)."""

    def __post_init__(self) -> None:
        if self.max_age is None and self.max_events is None:
            raise InvalidArgument("a retention policy sets max_age, max_events or both")
        if self.max_age is not None:
            if not isinstance(self.max_age, timedelta):
                raise InvalidArgument(
                    f"max_age must be a timedelta, got {type(self.max_age).__name__}")
            if self.max_age < _MS or self.max_age % _MS:
                raise InvalidArgument(
                    f"max_age must be a positive whole number of milliseconds, got "
                    f"{self.max_age!r}")
        if self.max_events is not None and (
                isinstance(self.max_events, bool) or not isinstance(self.max_events, int)
                or not 1 <= self.max_events <= MAX_RETENTION_EVENTS):
            raise InvalidArgument(
                f"max_events must be an int from 1 to {MAX_RETENTION_EVENTS}, got "
                f"{self.max_events!r}")

    @property
    def max_age_ms(self) -> int | None:
        """``max_age`` in milliseconds (``None`` when unset)."""
        return None if self.max_age is None else self.max_age // _MS

    @classmethod
    def from_ms(cls, max_age_ms: int | None, max_events: int | None) -> Retention | None:
        """The policy stored as ``max_age_ms`` and ``max_events`` (``None`` when neither
        is set: the stream has no policy)."""
        if max_age_ms is None and max_events is None:
            return None
        return cls(None if max_age_ms is None else timedelta(milliseconds=max_age_ms),
                   max_events)


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
    retention: Retention | None = None
    """The stream's retention policy (``None``: none; events stay until trimmed)."""


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
    paused: bool = False
    """The group was paused (docs/concepts.md, "Pausing a group") at the backend's clock
    when the info was read: its fetches return nothing,
    leases already out still settle and renew."""
    paused_until_ms: int | None = None
    """When a pause with an end time ends by itself (ms since the epoch, the backend's
    clock); ``None`` when the group is not paused or is paused until resumed."""


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
