"""The inflight set shared by consumer groups and producers.

It bounds outstanding leases (``capacity`` is ``max_demand``), renews every one
of them in a single backend call, and lets a drain wait until it is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Protocol

from .._model._lease import Lease
from .._model._settle_results import Decision, SettleResult
from .._support._waiting import wait_event

__all__ = ["Inflight", "InflightEntry"]

log = logging.getLogger("rheo_flow.inflight")


@dataclass(slots=True)
class InflightEntry:
    """A snapshot of one inflight lease and when it expires on the local monotonic clock."""

    lease: Lease
    expires_at: float
    """``loop.time()`` at which the lease runs out unless renewed."""
    lost: bool = False
    """Set when a renew found the lease stale: settling it would be refused."""


class _Expiry:
    """When the leases sharing it run out: one per fetched (or renewed) batch."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


_lease_id = attrgetter("lease_id")


class Inflight:
    """Inflight leases of one runtime, bounded by ``capacity``.

    Every lease maps to ``(lease, expiry)`` where the expiry is one object shared by
    the batch it was fetched (or last renewed) with: tracking a fetch costs one
    dict entry per lease and nothing else.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._entries: dict[str, tuple[Lease, _Expiry]] = {}
        self._lost: set[str] = set()
        self._settling: list[Sequence[Lease]] = []
        """Batches whose settle call is under way: a renew skips them (it would find
        them settled before the settle call returns and report them lost)."""
        self._changed = asyncio.Event()

    @property
    def lost_count(self) -> int:
        """How many inflight leases are marked lost (0 lets runtimes skip the per-lease
        check)."""
        return len(self._lost)

    @property
    def lost_ids(self) -> AbstractSet[str]:
        """The ids of the inflight leases marked lost (a live view: empty is the common
        case, which runtimes check once per lease)."""
        return self._lost

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._entries

    @property
    def free(self) -> int:
        """How many more leases may be taken."""
        return max(0, self.capacity - len(self._entries))

    def entries(self) -> list[InflightEntry]:
        """A snapshot of the inflight entries."""
        lost = self._lost
        return [InflightEntry(lease, expiry.at, lease_id in lost)
                for lease_id, (lease, expiry) in self._entries.items()]

    def get(self, lease_id: str) -> InflightEntry | None:
        """A snapshot of the entry of a lease, if inflight."""
        found = self._entries.get(lease_id)
        if found is None:
            return None
        return InflightEntry(found[0], found[1].at, lease_id in self._lost)

    def expires_at(self, lease_id: str) -> float | None:
        """When a lease runs out on the local monotonic clock, if inflight."""
        found = self._entries.get(lease_id)
        return None if found is None else found[1].at

    def is_lost(self, lease_id: str) -> bool:
        """Whether a renew found the lease stale (False when it is not inflight)."""
        return lease_id in self._lost

    def add(self, leases: Iterable[Lease], lease_ms: int) -> None:
        """Track freshly fetched leases (all sharing one expiry)."""
        items = leases if isinstance(leases, list | tuple) else list(leases)
        expiry = _Expiry(asyncio.get_running_loop().time() + lease_ms / 1000)
        self._entries.update(zip(map(_lease_id, items),
                                 zip(items, repeat(expiry), strict=False), strict=True))
        self._changed.set()

    @contextlib.contextmanager
    def settling(self, leases: Sequence[Lease]) -> Iterator[None]:
        """Mark a batch as being settled for the duration of the settle call."""
        batches = self._settling
        batches.append(leases)
        try:
            yield
        finally:
            batches.remove(leases)

    def release(self, leases: Iterable[Lease | str]) -> int:
        """Stop tracking leases (settled, or given up); returns how many were inflight."""
        entries = self._entries
        before = len(entries)
        lost = self._lost
        pop = entries.pop
        for item in leases:
            key = item if isinstance(item, str) else item.lease_id
            pop(key, None)
            if lost:
                lost.discard(key)
        removed = before - len(entries)
        if removed:
            self._changed.set()
        return removed

    def oldest_expiry(self, lease_ids: Iterable[str]) -> float | None:
        """The earliest local expiry among the given inflight leases."""
        entries = self._entries
        times = [found[1].at for i in lease_ids if (found := entries.get(i)) is not None]
        return min(times, default=None)

    async def renew_all(self, rheo: _Renewer, lease_ms: int) -> list[SettleResult]:
        """Renew every inflight lease in one backend call.

        Leases the backend reports lost (``stale_lease``, ``receipt_mismatch``)
        are marked lost; an unavailable or ambiguous backend leaves them as they
        are, to be renewed on the next tick.
        """
        lost = self._lost
        skip = lost
        if self._settling:
            skip = lost.union(lease.lease_id for batch in self._settling for lease in batch)
        live = [(lease_id, lease) for lease_id, (lease, _) in self._entries.items()
                if lease_id not in skip]
        if not live:
            return []
        started = asyncio.get_running_loop().time()
        results = await rheo.renew([lease for _, lease in live], lease_ms=lease_ms)
        renewed = _Expiry(started + lease_ms / 1000)
        entries = self._entries
        for (lease_id, lease), result in zip(live, results, strict=True):
            found = entries.get(lease_id)
            if found is None or found[0] is not lease:
                continue  # settled (or released) while the renew ran
            if result.ok:
                entries[lease_id] = (lease, renewed)
            elif result.decision is Decision.DROP and lease_id not in lost:
                lost.add(lease_id)
                log.warning("lease %s lost on renew: %s", lease_id, result.error)
        return results

    async def wait_changed(self, timeout: float | None = None) -> None:
        """Wait until a lease is added or released (or the timeout passes)."""
        self._changed.clear()
        await wait_event(self._changed, timeout)

    async def wait_empty(self, timeout: float | None = None) -> bool:
        """Wait until nothing is inflight; returns False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._entries:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            await self.wait_changed(remaining)
        return True


class _Renewer(Protocol):
    """What :meth:`Inflight.renew_all` needs: the facade's ``renew``."""

    async def renew(self, leases: list[Lease], *, lease_ms: int) -> list[SettleResult]: ...
