"""Pieces of the lease semantics that several backends compute the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from .._model._append_records import AppendRecord
from .._model._event import Event
from .._model._lease import Lease
from .._model._query import Query
from .._model._settle_results import SettleKind, SettleResult
from .._model._stream import StartPosition

__all__ = [
    "Rotation",
    "Waiters",
    "fence",
    "missing_delivery",
    "query_matches",
    "query_window",
    "round_robin",
    "start_position",
]

K = TypeVar("K", bound=Hashable)


class Rotation(Generic[K]):
    """Where each group's next fetch starts its round of partitions.

    Every fetch of a group starts one partition further on than the last, so no
    partition is always served last when the limit runs out before the round ends.
    """

    __slots__ = ("_turns",)

    def __init__(self) -> None:
        self._turns: dict[K, int] = {}

    def order(self, group: K, partitions: list[int]) -> list[int]:
        """``partitions`` rotated to start where this fetch of ``group`` starts."""
        if len(partitions) <= 1:
            return partitions
        turn = self.start(group, len(partitions))
        return partitions[turn:] + partitions[:turn]

    def start(self, group: K, count: int) -> int:
        """Where this fetch of ``group`` starts in a round of ``count`` partitions: the
        place :meth:`order` would rotate a list of that length to, without building it."""
        if count <= 1:
            return 0
        turn = (self._turns.get(group, 0) + 1) % count
        self._turns[group] = turn
        return turn

    def groups(self) -> list[K]:
        """The groups with a position."""
        return list(self._turns)

    def forget(self, group: K | None = None) -> None:
        """Drop the position of ``group`` (of every group when ``None``)."""
        if group is None:
            self._turns.clear()
        else:
            self._turns.pop(group, None)


def round_robin(sizes: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """Pick up to ``limit`` slots as ``(index, depth)`` pairs, one per index per round.

    ``sizes[i]`` is how many candidates index ``i`` (a partition) offers; taking
    them round-robin keeps one deep partition from starving the others.
    """
    order: list[tuple[int, int]] = []
    active = [i for i, size in enumerate(sizes) if size > 0]
    depth = 0
    while active and len(order) < limit:
        still = []
        for i in active:
            if len(order) >= limit:
                break
            order.append((i, depth))
            if depth + 1 < sizes[i]:
                still.append(i)
        active = still
        depth += 1
    return order


def fence(lease: Lease, current_lease_id: object, current_receipt: object) -> SettleResult | None:
    """The fencing check of a settle or renew; ``None`` when the lease is still the current one."""
    if current_lease_id != lease.lease_id:
        return SettleResult.failure(
            lease.lease_id, SettleKind.STALE_LEASE, "the delivery was leased again"
        )
    if current_receipt != lease.receipt:
        return SettleResult.failure(
            lease.lease_id, SettleKind.RECEIPT_MISMATCH, "receipt does not match the lease"
        )
    return None


def missing_delivery(lease: Lease, high_water: int) -> SettleResult:
    """The result for a lease whose delivery does not exist (any more)."""
    if 0 < lease.sequence <= high_water:
        return SettleResult.failure(
            lease.lease_id, SettleKind.STALE_LEASE, "the delivery was replayed, reset or trimmed"
        )
    return SettleResult.failure(
        lease.lease_id, SettleKind.INVALID, "lease names no delivery of this backend"
    )


def query_matches(query: Query, event: Event) -> bool:
    """Whether ``event`` passes a query's filters (key, type, append-time range).

    For backends that filter in Python after reading a query's sequence window.
    """
    if query.key is not None and event.key != query.key:
        return False
    if query.type is not None and event.type != query.type:
        return False
    if query.since_ms is not None and event.appended_at_ms < query.since_ms:
        return False
    return not (query.until_ms is not None and event.appended_at_ms >= query.until_ms)


def query_window(
    query: Query, partition: int, after: tuple[int, int] | None, low: int, high: int | None
) -> tuple[int, int | None] | None:
    """The inclusive sequence range a query reads in one partition, or ``None`` for none.

    ``after`` is the page cursor's (partition, sequence); ``low`` and ``high`` are
    the partition's retained bounds (``high=None``: unknown, read to the end).
    """
    if after is not None and partition < after[0]:
        return None
    lo = max(low, query.from_sequence or 1)
    if after is not None and partition == after[0]:
        lo = max(lo, after[1] + 1)
    hi = query.to_sequence if high is None else (
        high if query.to_sequence is None else min(high, query.to_sequence))
    if hi is not None and lo > hi:
        return None
    return lo, hi


class Waiters:
    """Idle consumers waiting for an append, keyed by stream (or any hashable key).

    :meth:`wake` may be called from any thread or event loop: each waiter is
    resolved on its own loop.
    """

    def __init__(self) -> None:
        self._by_key: dict[Hashable, set[asyncio.Future[None]]] = {}

    async def wait(self, key: Hashable, timeout: float) -> bool:
        """Wait until :meth:`wake` is called for ``key``; False after ``timeout`` seconds."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._by_key.setdefault(key, set())
        waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            waiters.discard(waiter)
            if not waiters and self._by_key.get(key) is waiters:
                del self._by_key[key]

    def __contains__(self, key: object) -> bool:
        """Whether anyone waits on ``key``."""
        return bool(self._by_key.get(key))

    def wake(self, key: Hashable) -> None:
        """Wake every waiter of ``key``."""
        for waiter in list(self._by_key.pop(key, ())):
            _resolve_soon(waiter)

    def wake_at(self, key: Hashable, records: Iterable[AppendRecord], now_ms: int) -> None:
        """Wake ``key``'s waiters again when each scheduled event of ``records`` becomes
        due (its ``deliver_at_ms``, by the backend's clock ``now_ms``; a millisecond
        after, the earliest 32 times), so that an idle consumer fetches it then rather
        than a poll interval later: timers of the running loop, for a backend on the
        system's clock (a waiter woken early fetches nothing and waits again)."""
        times = sorted({at for r in records if (at := r.deliver_at_ms) is not None
                        and at > now_ms})
        if times:
            loop = asyncio.get_running_loop()
            for at in times[:32]:
                loop.call_later((at - now_ms + 1) / 1000, self.wake, key)

    def wake_all(self) -> None:
        """Wake every waiter (on close, or when the push channel is lost)."""
        for key in list(self._by_key):
            self.wake(key)


def _resolve_soon(waiter: asyncio.Future[None]) -> None:
    loop = waiter.get_loop()
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _resolve(waiter)
    else:
        loop.call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def start_position(start: StartPosition, high: int, low: int) -> int:
    """Where a group starts (or is reset to) in a partition, within the retained range."""
    if start == "earliest":
        position = 0
    elif start == "latest":
        position = high
    else:
        position = int(start)
    return max(low - 1, min(position, high))
