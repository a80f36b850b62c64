"""The lease rules as pure functions, shared by every backend written in Python.

Given a delivery's state and a settle request, :func:`settle_delivery` says what
the delivery becomes (or why nothing changes); given the settled positions after
a frontier, :func:`advance_frontier` says where the frontier moves. Storage
(dicts, rows, documents) stays with each backend; the rules live here once. The
PL/pgSQL and Lua backends keep their own copies, held to the same rules by the
conformance kit.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Literal

from .._backend import MAX_ATTEMPTS_REASON
from .._model._lease import Lease
from .._model._settle_results import SettleKind, SettleResult

__all__ = [
    "TERMINAL",
    "DeliveryState",
    "Op",
    "Settled",
    "advance_frontier",
    "expire",
    "not_leased",
    "renew_delivery",
    "settle_delivery",
]

DeliveryState = Literal["available", "leased", "acked", "rejected"]
"""Where a delivery is: eligible, held by a lease, or settled for good."""

Op = Literal["ack", "nack", "reject"]
"""A settle call."""

TERMINAL: frozenset[str] = frozenset({"acked", "rejected"})
"""The states a delivery never leaves by itself (only replay, reset or redrive reopen it)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What a delivery becomes when a settle (or an expiry at max attempts) changes it.

    ``available_at_ms`` is set for a nack (when the delivery is eligible again),
    ``rejected_at_ms`` for a dead letter; ``settled_by`` is ``None`` for an expiry.
    """

    state: DeliveryState
    reason: str
    settled_by: Op | None
    available_at_ms: int | None = None
    rejected_at_ms: int | None = None

    @property
    def terminal(self) -> bool:
        """Whether the delivery is settled for good (the frontier may move over it)."""
        return self.state in TERMINAL


_ACKED = Settled("acked", "", "ack")


def settle_delivery(
    lease: Lease,
    state: str,
    settled_by: str | None,
    attempt: int,
    max_attempts: int,
    op: Op,
    reason: str,
    delay_ms: int,
    now_ms: int,
) -> Settled | SettleResult:
    """Settle one delivery the lease still holds (fencing already checked).

    Returns the delivery's new state (the caller stores it and reports success),
    or the result of a call that changes nothing: a delivery no longer leased is
    a repeat of its own settle or a stale lease (:func:`not_leased`). An ack
    settles; a reject dead-letters with the caller's reason; a nack of the last
    allowed attempt dead-letters with ``max_attempts``; any other nack makes the
    delivery eligible again after ``delay_ms``.
    """
    if state != "leased":
        return not_leased(lease, settled_by, op)
    if op == "ack":
        return _ACKED
    if op == "reject":
        return Settled("rejected", reason, op, rejected_at_ms=now_ms)
    if attempt >= max_attempts:
        return Settled("rejected", MAX_ATTEMPTS_REASON, op, rejected_at_ms=now_ms)
    return Settled("available", reason, op, available_at_ms=now_ms + delay_ms)


def renew_delivery(lease: Lease, state: str, settled_by: str | None, now_ms: int,
                   lease_ms: int) -> SettleResult:
    """Renew one delivery the lease still holds: the new deadline, or why not.

    A renew is never a repeat: a delivery that is no longer leased is stale.
    """
    if state != "leased":
        return not_leased(lease, settled_by, "renew")
    return SettleResult.success(lease.lease_id, deadline_ms=now_ms + lease_ms)


def not_leased(lease: Lease, settled_by: str | None,
               op: Op | Literal["renew"]) -> SettleResult:
    """The result for a delivery the lease still names but that is no longer leased.

    The same settle again is its repeat (``repeated=True``); a different settle,
    or any renew, is refused as a stale lease naming what settled it.
    """
    if op != "renew" and settled_by == op:
        return SettleResult.success(lease.lease_id, repeated=True)
    return SettleResult.failure(
        lease.lease_id, SettleKind.STALE_LEASE, f"already settled by {settled_by}"
    )


def expire(attempt: int, max_attempts: int, now_ms: int) -> Settled | None:
    """What an expired lease's delivery becomes when a fetch meets it.

    At ``max_attempts`` it is a dead letter (reason ``max_attempts``, rejected
    now); otherwise ``None``: it is eligible again, to be leased as the next attempt.
    """
    if attempt >= max_attempts:
        return Settled("rejected", MAX_ATTEMPTS_REASON, None, rejected_at_ms=now_ms)
    return None


def advance_frontier(frontier: int, settled: Container[int]) -> int:
    """The frontier after moving from ``frontier`` over the settled positions next to it.

    ``settled`` holds the sequences whose deliveries are acked or dead letters;
    the frontier stops before the first one that is not (a hole or a pending
    delivery), so it only ever covers a contiguous settled run.
    """
    while frontier + 1 in settled:
        frontier += 1
    return frontier
