"""Settling and renewing: finding a lease's delivery, fencing, storing the outcome.

The lease rules (:mod:`rheo_flow._backends._transitions`) decide what each
delivery becomes; :meth:`~._core.MemoryCore._apply` stores it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..._model._lease import Lease
from ..._model._settle_results import SettleKind, SettleResult, settle_ok
from .._shared import fence, missing_delivery
from .._transitions import Op, renew_delivery, settle_delivery
from ._core import MemoryCore
from ._state import Delivery, Group, GroupPartition

__all__ = ["SettleOps"]


class SettleOps(MemoryCore):
    """:meth:`ack`, :meth:`nack`, :meth:`reject` and :meth:`renew`."""

    def _find(self, lease: Lease) -> tuple[Group, GroupPartition, Delivery] | SettleResult:
        event = lease.event
        g = self._groups.get((event.stream, lease.group))
        s = self._streams.get(event.stream)
        pid = event.partition
        if g is None or s is None or not 0 <= pid < len(g.partitions):
            return SettleResult.failure(
                lease.lease_id, SettleKind.INVALID, "lease names no group of this backend"
            )
        gp = g.partitions[pid]
        seq = event.sequence
        d = gp.active.get(seq) or gp.done.get(seq)
        if d is None:
            return missing_delivery(lease, s.partitions[pid].high_water)
        if d.lease_id != lease.lease_id or d.receipt != lease.receipt:
            return fence(lease, d.lease_id, d.receipt) or (g, gp, d)
        return g, gp, d

    def _settle(self, leases: Sequence[Lease], op: Op, reason: str, delay_ms: int,
                error: str | None = None) -> list[SettleResult]:
        now = self._clock()
        results: list[SettleResult] = []
        append = results.append
        for lease in leases:
            found = self._find(lease)
            if isinstance(found, SettleResult):
                append(found)
                continue
            g, gp, d = found
            outcome = settle_delivery(lease, d.state, d.settled_by, d.attempt,
                                      g.info.max_attempts, op, reason, delay_ms, now)
            if isinstance(outcome, SettleResult):
                append(outcome)
                continue
            if error is not None:
                d.last_error = error
            self._apply(gp, d, outcome)
            if g.ordered and outcome.terminal:
                gp.may_be_due(0)  # the next delivery of its key may be eligible now
            append(settle_ok(lease.lease_id))
        return results

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return self._settle(leases, "ack", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return self._settle(leases, "nack", reason, delay_ms, error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return self._settle(leases, "reject", reason, 0, error)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        now = self._clock()
        results: list[SettleResult] = []
        for lease in leases:
            found = self._find(lease)
            if isinstance(found, SettleResult):
                results.append(found)
                continue
            _, gp, d = found
            result = renew_delivery(lease, d.state, d.settled_by, now, lease_ms)
            if result.deadline_ms is not None:
                d.deadline_ms = result.deadline_ms
                gp.may_be_due(d.deadline_ms)  # a renew may shorten a lease
            results.append(result)
        return results
