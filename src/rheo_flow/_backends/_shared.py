"""Pieces of the lease semantics that several backends compute the same way."""

from __future__ import annotations

from collections.abc import Sequence

from .._lease import Lease
from .._query import Query
from .._settle import SettleKind, SettleResult

__all__ = ["fence", "missing_delivery", "query_window", "round_robin"]


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
