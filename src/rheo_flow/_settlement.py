"""Settling through the decision table, shared by consumer groups and producers.

:func:`settle` performs one batched ack / nack / reject, releases the leases from
the runtime's inflight set and applies the runtime decision of every failure:
``drop`` does nothing (the backend redelivers), ``expire`` leaves the lease to
run out, ``nack`` asks for immediate redelivery in one further batched call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from . import _telemetry
from ._inflight import Inflight
from ._lease import Lease
from ._rheo import Rheo
from ._settle import Decision, SettleResult

__all__ = ["SettleObserver", "SettleOp", "SettleOutcome", "settle"]

log = logging.getLogger("rheo_flow.settle")

SettleOp = Literal["ack", "nack", "reject"]


@dataclass(frozen=True, slots=True)
class SettleOutcome:
    """What happened to one lease in one settle call (passed to observers)."""

    op: SettleOp
    lease: Lease
    result: SettleResult


SettleObserver = Callable[[SettleOutcome], None]


async def settle(
    rheo: Rheo,
    op: SettleOp,
    leases: Sequence[Lease],
    *,
    reason: str = "",
    delay_ms: int = 0,
    inflight: Inflight | None = None,
    observer: SettleObserver | None = None,
) -> list[SettleResult]:
    """Settle ``leases`` with ``op`` and apply the decision table to failures."""
    if not leases:
        return []
    if op == "ack":
        results = await rheo.ack(leases)
    elif op == "nack":
        results = await rheo.nack(leases, reason or "nack", delay_ms=delay_ms)
    else:
        results = await rheo.reject(leases, reason or "reject")
    if inflight is not None:
        inflight.release(leases)
    if observer is None and all(result.error is None for result in results):
        return results  # the common case: nothing to report or follow up, per batch
    to_nack: list[Lease] = []
    for lease, result in zip(leases, results, strict=True):
        if observer is not None:
            observer(SettleOutcome(op, lease, result))
        if result.ok:
            continue
        log.warning(
            "%s of %s/%s p%d s%d failed: %s (%s) -> %s",
            op, lease.stream, lease.group, lease.partition, lease.sequence,
            result.kind, result.error.reason if result.error else "", result.decision,
        )
        if result.decision is Decision.NACK and op != "nack":
            to_nack.append(lease)
    if to_nack:
        kind = {r.lease_id: r.kind for r in results}
        first = kind[to_nack[0].lease_id]
        with _telemetry.follow_up(op):  # the nack span says which failed settle it follows
            retry = await rheo.nack(to_nack, f"settle_failed: {first}")
        for lease, result in zip(to_nack, retry, strict=True):
            if observer is not None:
                observer(SettleOutcome("nack", lease, result))
            if not result.ok:
                log.warning("nack after failed %s of %s: %s -> leave to expire",
                            op, lease.lease_id, result.kind)
    return results
