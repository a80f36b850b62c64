"""Leases: a consumer's fenced, time-limited claim on one delivery of an event.

Backends build leases in bulk with :func:`make_lease` (positional, several times
cheaper than the frozen dataclass's ``__init__``: see :mod:`._builders`); the result is an ordinary,
immutable :class:`Lease`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ._builders import positional_builder
from ._event import Event

__all__ = ["Lease", "make_lease"]


@dataclass(frozen=True, slots=True)
class Lease:
    """A claim on one event for one group, returned by ``fetch``.

    Settle it with ``ack``, ``nack`` or ``reject`` before ``deadline_ms``, or
    ``renew`` it. Once it has expired and the event was leased again, this lease
    can no longer settle anything (``stale_lease``).
    """

    lease_id: str
    """Unique token of this claim; settles are fenced on it."""
    receipt: str
    """Opaque backend token (e.g. the Redis entry id), checked together with the lease id."""
    group: str
    consumer_id: str
    event: Event
    attempt: int
    """1 on the first delivery, +1 on each redelivery."""
    deadline_ms: int
    """When the lease expires, milliseconds since the Unix epoch (backend clock)."""

    @property
    def stream(self) -> str:
        """The stream of the leased event."""
        return self.event.stream

    @property
    def partition(self) -> int:
        """The partition of the leased event."""
        return self.event.partition

    @property
    def sequence(self) -> int:
        """The sequence of the leased event."""
        return self.event.sequence

    @property
    def deadline(self) -> datetime:
        """The deadline as an aware UTC datetime."""
        return datetime.fromtimestamp(self.deadline_ms / 1000, tz=UTC)


_LEASE_DOC = """A :class:`Lease` from positional fields (lease_id, receipt, group,
consumer_id, event, attempt, deadline_ms), without the frozen ``__init__``'s
cost.

For backends, which build leases in bulk from values they already trust."""

make_lease: Callable[[str, str, str, str, Event, int, int], Lease] = positional_builder(
    Lease, _LEASE_DOC)
