"""The leases this backend's fetches built and no ack has taken back yet.

A settle batch must check every lease it is handed (well-formed ids, receipts, types:
a lease may be built by anyone), which costs about as much per lease as building it.
A lease found here as the very object a fetch built needs none of that: its fields
are the ones the server issued. Only the client's checks are skipped; the server
fences every settle as before, so a lease missing here (evicted, never fetched by this
backend) or one whose event changed since (leased again, nacked) is answered exactly as
it would be without this record.

Bounded: past :data:`CAPACITY` the oldest records go first (a lease never settled is
not held for ever); their acks then take the checked path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Final

from ..._model._lease import Lease

__all__ = ["CAPACITY", "IssuedLeases"]

CAPACITY: Final = 16_384
"""Leases recorded at most: more than a consumer keeps in flight in any configuration
the documentation recommends."""


class IssuedLeases:
    """Leases by id, as the fetches of one backend built them."""

    __slots__ = ("_leases", "capacity")

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._leases: dict[str, Lease] = {}
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self._leases)

    def add(self, leases: Iterable[Lease]) -> None:
        """Record leases a fetch built; the oldest records go past the capacity."""
        records = self._leases
        for lease in leases:
            records[lease.lease_id] = lease
        excess = len(records) - self.capacity
        if excess > 0:
            for lease_id in list(islice(records, excess)):
                del records[lease_id]

    def get(self, lease_id: str) -> Lease | None:
        """The lease recorded under ``lease_id``, if any."""
        return self._leases.get(lease_id)

    def take(self, leases: Sequence[Lease]) -> bool:
        """Remove the records of ``leases``, each found as that very object by
        :meth:`get`: True when they were as many as the leases (no lease twice in the
        batch); else every record stays as it was."""
        records = self._leases
        before = len(records)
        pop = records.pop
        for lease in leases:
            pop(lease.lease_id, None)
        if before - len(records) == len(leases):
            return True
        for lease in leases:
            records[lease.lease_id] = lease
        return False
