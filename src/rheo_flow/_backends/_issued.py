"""The leases a backend object built, known by their fields (PostgreSQL).

A settle checks every lease it is handed (a lease may be built by anyone): that its
fields are well formed and agree with one another (its sequence, its lease id's
offset from its range's base, its receipt's attempt, its partition, stream and group).
For a lease this backend object built, those fields were computed then; the registry
keeps them by lease id, and a lease whose fields are those very values (the same
objects: an identity test each, no formatting) is vouched for. PostgreSQL sends a
batch of acks vouched for whole without its per-lease checks (``_batch.SettleBatch``).
(SQLite keeps the new ranges it leased instead, and acks runs of their leases per
range: ``_issued_runs.py``.)
A lease not vouched for (built elsewhere, forged, or evicted) takes the full checks;
nothing else differs, and the server or the stored rows fence every settle as before.

The registry keeps no event, only the fields compared, and at most :data:`LIMIT`
leases: the oldest go first, and leases acked are removed (one nacked or rejected
stays until pushed out, which is harmless, since a later ack of it is answered by
the server).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from .._model._lease import Lease

__all__ = ["Issued"]

LIMIT: Final = 65_536
"""Leases kept at most (about 100 bytes each)."""

_Fields = tuple[str, str, str, int, int, int]
"""What a lease was issued with, besides its id: receipt, group, stream, partition,
sequence, attempt."""


class Issued:
    """Leases built by one backend object, by lease id."""

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
                                    event.sequence, lease.attempt)
        if len(held) > LIMIT:  # leases never settled here: drop the oldest quarter at once
            for key in list(held)[:len(held) - LIMIT * 3 // 4]:
                del held[key]

    def vouch(self, leases: Sequence[Lease]) -> set[int]:
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
            receipt, group, stream, part, seq, attempt = fields
            event = lease.event
            if (lease.receipt is receipt and lease.group is group and event.stream is stream
                    and event.partition is part and event.sequence is seq
                    and lease.attempt is attempt):
                out.add(i)
        return out

    def vouches_for_all(self, leases: Sequence[Lease]) -> bool:
        """Whether :meth:`vouch` vouches for every lease of ``leases``."""
        return len(self.vouch(leases)) == len(leases)

    def forget(self, leases: Iterable[Lease]) -> int:
        """Stop vouching for ``leases`` (settled: a repeat takes the full checks); how
        many of them it vouched for (fewer than the leases when one came twice)."""
        held = self._fields
        before = len(held)
        pop = held.pop
        for lease in leases:
            if lease.lease_id.__class__ is str:
                pop(lease.lease_id, None)
        return before - len(held)
