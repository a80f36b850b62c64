"""The leases this backend object built for new ranges, known by identity.

A settle of a range lease checks that the lease's fields match its range: its
sequence inside the range, its lease id's offset from the range's base, its
receipt's attempt, its partition, stream and group. For a :class:`Lease` this
very backend object built from the range (an immutable object it still holds),
those fields are what the range was stored with, so the check is an identity
test, made in the caller's thread before the settle is queued: the backend
thread, every caller's bottleneck, is left the checks only the stored row can
answer (is the sequence still inside a range of that token, is its event still
in flight). A lease that is not vouched for (built elsewhere, copied, or
evicted) takes the full checks; nothing else differs.

Only identity vouches: a registered lease is held here, so its ``id`` cannot
be reused while it is registered. The registry holds at most :data:`LIMIT`
leases; the oldest go first, and leases that took effect are removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ..._model._lease import Lease

__all__ = ["Issued"]

LIMIT: Final = 65_536
"""Leases held at most (a consumer's leases in flight are held by its runtime anyway)."""


class Issued:
    """Leases built by one backend object for its new ranges, by ``id``."""

    __slots__ = ("_leases",)

    def __init__(self) -> None:
        self._leases: dict[int, Lease] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def register(self, leases: list[Lease]) -> None:
        """Vouch for ``leases`` from now on (they were just built from their range)."""
        held = self._leases
        held.update(zip(map(id, leases), leases, strict=True))
        if len(held) > LIMIT:  # leases never settled here: drop the oldest quarter at once
            for key in list(held)[:len(held) - LIMIT * 3 // 4]:
                del held[key]

    def vouch(self, leases: list[Lease]) -> set[int]:
        """The positions in ``leases`` of leases this object built and still holds."""
        held = self._leases
        if not held:
            return set()
        get = held.get
        return {i for i, lease in enumerate(leases) if get(id(lease)) is lease}

    def forget(self, leases: Iterable[Lease]) -> None:
        """Stop holding ``leases`` (settled: a repeat takes the full checks)."""
        # A live ``lease`` is the only live object with its id: popping by id is exact.
        pop = self._leases.pop
        for lease in leases:
            pop(id(lease), None)
