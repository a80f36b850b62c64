"""Settling and renewing leases: the whole batch in one fenced statement when it can,
else row by row, each outcome decided by the lease rules of ``_transitions``.

The usual batch (every lease current, one group) is one ``executemany`` of a
fenced primary-key update, whose SQL encodes the same rules; the frontier then
moves with one statement per partition. Anything else (a stale, repeated or
foreign lease, several groups, one delivery named twice) goes row by row on
Python copies of the rows, written back at once.
"""

from __future__ import annotations

import sqlite3

from ..._model._lease import Lease
from ..._model._settle_results import SettleResult, settle_ok
from ..._support._clock import Clock
from .._transitions import Op, renew_delivery, settle_delivery
from . import _sql as sql
from ._deliveries import Deliveries, fenced_update
from ._progress import advance_frontier, release_keys

__all__ = ["renew", "settle"]


def settle(conn: sqlite3.Connection, clock: Clock, leases: list[Lease], op: Op, reason: str,
           delay_ms: int, error: str | None = None) -> list[SettleResult]:
    """Ack, nack or reject ``leases``; one result per lease, in order."""
    now = clock()
    changed = fenced_update(conn, leases, sql.SETTLE[op], (reason, now, now + delay_ms),
                            () if op == "ack" else (error,))
    if changed is None:
        return _settle_rows(conn, leases, op, reason, delay_ms, now, error)
    group_id, ordered, parts = changed
    # Every delivery of an ack or reject is settled; a nack's may be dead-lettered
    # (releasing the key of one that was not does nothing).
    if ordered:
        release_keys(conn, [(group_id, lease.event.partition, lease.event.sequence)
                            for lease in leases])
    for part in sorted(parts):
        advance_frontier(conn, group_id, part)
    return [settle_ok(lease.lease_id) for lease in leases]


def _settle_rows(
    conn: sqlite3.Connection,
    leases: list[Lease],
    op: Op,
    reason: str,
    delay_ms: int,
    now: int,
    error: str | None = None,
) -> list[SettleResult]:
    """Settle row by row on Python copies: any batch, including several streams or
    groups and one delivery named twice."""
    found = Deliveries(conn, leases)
    terminal: set[tuple[int, int]] = set()
    released: list[tuple[int, int, int]] = []
    results: list[SettleResult] = []
    for lease, g, d in found.held(leases, results):
        outcome = settle_delivery(lease, d.state, d.settled_by, d.attempt, g.max_attempts, op,
                                  reason, delay_ms, now)
        if isinstance(outcome, SettleResult):
            results.append(outcome)
            continue
        d.settle(outcome, error)
        if outcome.terminal:
            terminal.add((g.id, lease.partition))
            if g.ordering == "key":
                released.append((g.id, lease.partition, d.seq))
        results.append(settle_ok(lease.lease_id))
    found.write_back()
    release_keys(conn, released)
    for group_id, part in sorted(terminal):
        advance_frontier(conn, group_id, part)
    return results


def renew(conn: sqlite3.Connection, clock: Clock, leases: list[Lease],
          lease_ms: int) -> list[SettleResult]:
    """Extend ``leases`` to ``lease_ms`` from now; one result per lease, in order."""
    now = clock()
    deadline = now + lease_ms
    if fenced_update(conn, leases, sql.RENEW, (deadline, None, None)) is None:
        return _renew_rows(conn, leases, now, lease_ms)
    return [SettleResult(lease.lease_id, None, False, deadline) for lease in leases]


def _renew_rows(conn: sqlite3.Connection, leases: list[Lease], now: int,
                lease_ms: int) -> list[SettleResult]:
    found = Deliveries(conn, leases)
    results: list[SettleResult] = []
    for lease, _, d in found.held(leases, results):
        result = renew_delivery(lease, d.state, d.settled_by, now, lease_ms)
        if result.deadline_ms is not None:
            d.renew(result.deadline_ms)
        results.append(result)
    found.write_back()
    return results
