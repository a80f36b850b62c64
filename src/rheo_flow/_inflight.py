"""The inflight set shared by consumer groups and producers.

It bounds outstanding leases (``capacity`` is ``max_demand``), renews every one
of them in a single backend call, and lets a drain wait until it is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ._lease import Lease
from ._settle import Decision, SettleResult

__all__ = ["Inflight", "InflightEntry", "wait_event"]

log = logging.getLogger("rheo_flow.inflight")


@dataclass(slots=True)
class InflightEntry:
    """One inflight lease and when it expires on the local monotonic clock."""

    lease: Lease
    expires_at: float
    """``loop.time()`` at which the lease runs out unless renewed."""
    lost: bool = False
    """Set when a renew found the lease stale: settling it would be refused."""


class Inflight:
    """Inflight leases of one runtime, bounded by ``capacity``."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._entries: dict[str, InflightEntry] = {}
        self._changed = asyncio.Event()
        self.lost_count = 0
        """How many inflight entries are marked lost (0 lets runtimes skip the per-lease
        check)."""

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
        return list(self._entries.values())

    def get(self, lease_id: str) -> InflightEntry | None:
        """The entry of a lease, if inflight."""
        return self._entries.get(lease_id)

    def add(self, leases: Iterable[Lease], lease_ms: int) -> None:
        """Track freshly fetched leases."""
        expires_at = asyncio.get_running_loop().time() + lease_ms / 1000
        entries = self._entries
        for lease in leases:
            entries[lease.lease_id] = InflightEntry(lease, expires_at)
        self._changed.set()

    def release(self, leases: Iterable[Lease | str]) -> int:
        """Stop tracking leases (settled, or given up); returns how many were inflight."""
        removed = 0
        pop = self._entries.pop
        for item in leases:
            entry = pop(item if isinstance(item, str) else item.lease_id, None)
            if entry is not None:
                removed += 1
                if entry.lost:
                    self.lost_count -= 1
        if removed:
            self._changed.set()
        return removed

    def oldest_expiry(self, lease_ids: Iterable[str]) -> float | None:
        """The earliest local expiry among the given inflight leases."""
        times = [e.expires_at for i in lease_ids if (e := self._entries.get(i)) is not None]
        return min(times, default=None)

    async def renew_all(self, rheo: _Renewer, lease_ms: int) -> list[SettleResult]:
        """Renew every inflight lease in one backend call.

        Leases the backend reports lost (``stale_lease``, ``receipt_mismatch``)
        are marked lost; an unavailable or ambiguous backend leaves them as they
        are, to be renewed on the next tick.
        """
        entries = [e for e in self._entries.values() if not e.lost]
        if not entries:
            return []
        started = asyncio.get_running_loop().time()
        results = await rheo.renew([e.lease for e in entries], lease_ms=lease_ms)
        for entry, result in zip(entries, results, strict=True):
            if result.ok:
                entry.expires_at = started + lease_ms / 1000
            elif result.decision is Decision.DROP and not entry.lost:
                entry.lost = True
                if self._entries.get(entry.lease.lease_id) is entry:
                    self.lost_count += 1
                log.warning("lease %s lost on renew: %s", entry.lease.lease_id, result.error)
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


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True when set.

    Built on ``asyncio.timeout`` rather than ``asyncio.wait_for``, which on
    Python 3.11 can swallow a cancellation arriving just as the event is set
    (a runtime's stop must never be lost that way).
    """
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()


class _Renewer(Protocol):
    """What :meth:`Inflight.renew_all` needs: the facade's ``renew``."""

    async def renew(self, leases: list[Lease], *, lease_ms: int) -> list[SettleResult]: ...
