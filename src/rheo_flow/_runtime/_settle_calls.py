"""Settle calls in the runtimes: settling through the decision table, shared by
consumer groups and producers (the vocabulary is in :mod:`rheo_flow._model._settle_results`).

:func:`settle` performs one batched ack / nack / reject, releases the leases from
the runtime's inflight set and applies the runtime decision of every failure:
``drop`` does nothing (the backend redelivers), ``expire`` leaves the lease to
run out, ``nack`` asks for immediate redelivery in one further batched call.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from .. import _telemetry
from .._model._builders import positional_builder
from .._model._lease import Lease
from .._model._settle_results import Decision, SettleKind, SettleResult
from .._rheo import Rheo
from ._inflight import Inflight

__all__ = ["BatchObserver", "SettleCounters", "SettleObserver", "SettleOp", "SettleOutcome",
           "by_settle_call", "count_settled", "dead_lettered", "per_outcome", "settle", "settled"]

log = logging.getLogger("rheo_flow.settle")

SettleOp = Literal["ack", "nack", "reject"]


@dataclass(frozen=True, slots=True)
class SettleOutcome:
    """What happened to one lease in one settle call (passed to observers)."""

    op: SettleOp
    lease: Lease
    result: SettleResult


SettleObserver = Callable[[SettleOutcome], None]

BatchObserver = Callable[[SettleOp, Sequence[Lease], Sequence[SettleResult]], None]
"""What runtimes observe settles with: one call per backend call, with the settled
leases and their results in the same order (follow-up nacks included)."""


_OUTCOME_DOC = """A :class:`SettleOutcome` without the frozen ``__init__``'s cost (one per
settled lease)."""

_outcome: Callable[[SettleOp, Lease, SettleResult], SettleOutcome] = positional_builder(
    SettleOutcome, _OUTCOME_DOC)


def per_outcome(observer: SettleObserver) -> BatchObserver:
    """A batch observer calling ``observer`` with one :class:`SettleOutcome` per lease."""

    def observe(op: SettleOp, leases: Sequence[Lease], results: Sequence[SettleResult]) -> None:
        for lease, result in zip(leases, results, strict=True):
            observer(_outcome(op, lease, result))

    return observe


async def settle(
    rheo: Rheo,
    op: SettleOp,
    leases: Sequence[Lease],
    *,
    reason: str = "",
    delay_ms: int = 0,
    error: str | None = None,
    inflight: Inflight | None = None,
    observer: BatchObserver | None = None,
) -> list[SettleResult]:
    """Settle ``leases`` with ``op`` and apply the decision table to failures.

    ``error`` (nack and reject) is recorded as the deliveries' last error.

    ``observer`` is called once per backend call (this one, then the follow-up
    nack of the failures the decision table sends back, if any).
    """
    if not leases:
        return []
    if inflight is None:
        results = await _call(rheo, op, leases, reason, delay_ms, error)
    else:
        with inflight.settling(leases):
            results = await _call(rheo, op, leases, reason, delay_ms, error)
        inflight.release(leases)
    return await settled(rheo, op, leases, results, error=error, observer=observer)


async def settled(
    rheo: Rheo,
    op: SettleOp,
    leases: Sequence[Lease],
    results: list[SettleResult],
    *,
    error: str | None = None,
    observer: BatchObserver | None = None,
) -> list[SettleResult]:
    """After a settle call returned ``results``: report them to ``observer`` and apply
    the decision table to the failures (see :func:`settle`)."""
    if observer is not None:
        observer(op, leases, results)
    if all(result.error is None for result in results):
        return results  # the common case: nothing to follow up, per batch
    to_nack: list[Lease] = []
    first_kind: SettleKind | None = None  # the follow-up nack's reason names it
    for lease, result in zip(leases, results, strict=True):
        if result.error is None:
            continue
        log.warning(
            "%s of %s/%s p%d s%d failed: %s (%s) -> %s",
            op, lease.stream, lease.group, lease.partition, lease.sequence,
            result.kind, result.error.reason, result.decision,
        )
        if result.decision is Decision.NACK and op != "nack":
            if not to_nack:
                first_kind = result.kind
            to_nack.append(lease)
    if to_nack:
        with _telemetry.follow_up(op):  # the nack span says which failed settle it follows
            nacked = await _call(rheo, "nack", to_nack, f"settle_failed: {first_kind}", 0,
                                 error)
        if observer is not None:
            observer("nack", to_nack, nacked)
        for lease, result in zip(to_nack, nacked, strict=True):
            if not result.ok:
                log.warning("nack after failed %s of %s: %s -> leave to expire",
                            op, lease.lease_id, result.kind)
    return results


async def _call(rheo: Rheo, op: SettleOp, leases: Sequence[Lease], reason: str,
                delay_ms: int, error: str | None) -> list[SettleResult]:
    if op == "ack":
        return await rheo.ack(leases)
    # ``error`` only when there is one: stand-ins for Rheo written before it need not take it.
    extra = {} if error is None else {"error": error}
    if op == "nack":
        return await rheo.nack(leases, reason or "nack", delay_ms=delay_ms, **extra)
    return await rheo.reject(leases, reason or "reject", **extra)


def dead_lettered(rheo: Rheo, op: SettleOp, leases: Sequence[Lease],
                  results: Sequence[SettleResult]) -> int:
    """How many deliveries one settle call dead-lettered: its rejects that took effect,
    and its nacks that took effect on a last attempt (the backend rejects those with
    reason ``"max_attempts"``). Repeats of an earlier settle do not count again."""
    if op == "ack":
        return 0
    if op == "reject":
        return sum(1 for result in results if result.error is None and not result.repeated)
    limits = rheo._max_attempts
    count = 0
    for lease, result in zip(leases, results, strict=True):
        if result.error is None and not result.repeated:
            limit = limits.get((lease.stream, lease.group))
            if limit is not None and lease.attempt >= limit:
                count += 1
    return count


class SettleCounters(Protocol):
    """The settle counters both runtimes keep (:class:`~rheo_flow.ProducerStats`,
    :class:`~rheo_flow.GroupStats`)."""

    acked: int
    rejected: int
    dead_lettered: int
    settle_failures: Counter[str]


def count_settled(counters: SettleCounters, rheo: Rheo, op: SettleOp, leases: Sequence[Lease],
                  results: Sequence[SettleResult]) -> int:
    """Count one settle call's results into ``counters``: its failures by kind, its acks
    and rejects that took effect, the deliveries it dead-lettered. Returns how many of
    its results took effect; the caller counts the nacks among them, as it names them
    (a group tells retries from other nacks, a producer does not)."""
    failed = [result.error for result in results if result.error is not None]
    for error in failed:
        counters.settle_failures[error.kind.value] += 1
    took_effect = len(results) - len(failed)
    if op == "ack":
        counters.acked += took_effect
        return took_effect
    if op == "reject":
        counters.rejected += took_effect
    counters.dead_lettered += dead_lettered(rheo, op, leases, results)
    return took_effect


Item = TypeVar("Item")
CallKey = TypeVar("CallKey", bound=Hashable)


def by_settle_call(items: Iterable[Item], call_of: Callable[[Item], CallKey]
                   ) -> dict[CallKey, list[Item]]:
    """``items`` grouped by the settle call that takes them, in the order they first
    appear: ``call_of`` gives an item's (operation, reason, delay, last error), and each
    group goes out in one backend call."""
    calls: dict[CallKey, list[Item]] = {}
    for item in items:
        calls.setdefault(call_of(item), []).append(item)
    return calls
