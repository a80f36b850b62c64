"""The leases this backend object built for new ranges, known by their fields.

A settle of a range lease checks that the lease's fields match its range: its
sequence inside the range, its lease id's offset from the range's base, its
receipt's attempt, its partition, stream and group. For a lease this backend
object built from the range, those fields were computed then; the registry
keeps them by lease id, and a lease whose fields are those very values (the
same string objects: an identity test each, no formatting) is vouched for in
the caller's thread before the settle is queued. The backend thread, every
caller's bottleneck, is then left the checks only the stored row can answer (is
the sequence still inside a range of that token, is its event still in flight).
A lease not vouched for (built elsewhere, forged, or evicted) takes the full
checks; nothing else differs.

The registry keeps no event, only the fields compared, and at most
:data:`LIMIT` leases: the oldest go first, and leases settled here are removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ..._model._lease import Lease

__all__ = ["Issued"]

LIMIT: Final = 65_536
"""Leases kept at most (about 100 bytes each)."""

_Fields = tuple[str, str, str, int, int]
"""What a lease was issued with, besides its id: receipt, group, stream, partition,
sequence."""


class Issued:
    """Leases built by one backend object for its new ranges, by lease id."""

    __slots__ = ("_fields",)

    def __init__(self) -> None:
        self._fields: dict[str, _Fields] = {}

    def __len__(self) -> int:
        return len(self._fields)

    def register(self, leases: list[Lease]) -> None:
        """Vouch for ``leases`` from now on (they were just built from their range)."""
        held = self._fields
        for lease in leases:
            event = lease.event
            held[lease.lease_id] = (lease.receipt, lease.group, event.stream, event.partition,
                                    event.sequence)
        if len(held) > LIMIT:  # leases never settled here: drop the oldest quarter at once
            for key in list(held)[:len(held) - LIMIT * 3 // 4]:
                del held[key]

    def vouch(self, leases: list[Lease]) -> set[int]:
        """The positions in ``leases`` of leases carrying exactly the fields this object
        issued them with."""
        held = self._fields
        if not held:
            return set()
        get = held.get
        out: set[int] = set()
        for i, lease in enumerate(leases):
            lease_id = lease.lease_id
            if lease_id.__class__ is not str:  # a forged lease may hold anything
                continue
            fields = get(lease_id)
            if fields is None:
                continue
            receipt, group, stream, part, seq = fields
            event = lease.event
            if (lease.receipt is receipt and lease.group is group and event.stream is stream
                    and event.partition is part and event.sequence is seq):
                out.add(i)
        return out

    def forget(self, leases: Iterable[Lease]) -> None:
        """Stop vouching for ``leases`` (settled: a repeat takes the full checks)."""
        pop = self._fields.pop
        for lease in leases:
            if lease.lease_id.__class__ is str:
                pop(lease.lease_id, None)
