"""Settling and renewing leases: range leases first, then delivery rows, the whole
batch in one fenced statement when it can, else row by row, each outcome decided
by the lease rules of ``_transitions``.

The events an unordered group's ranges hold are settled per range
(:func:`._ranges.take`): a few statements per batch, not one per event. The
usual batch of delivery rows (every lease current, one group) is one
``executemany`` of a fenced primary-key update, whose SQL encodes the same
rules; the frontier then moves with one statement per partition. Anything else
(a stale, repeated or foreign lease, several groups, one delivery named twice)
goes row by row on Python copies of the rows, written back at once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ..._model._lease import Lease
from ..._model._settle_results import SettleResult, settle_ok
from ..._support._clock import Clock
from .._issued_runs import Run
from .._transitions import Op, renew_delivery, settle_delivery
from . import _sql as sql
from ._deliveries import Deliveries, fenced_update
from ._progress import advance_frontier, release_keys
from ._ranges import Split, take, take_runs

__all__ = ["NOT_VOUCHED", "ack_runs", "renew", "settle"]

NOT_VOUCHED: set[int] = set()
"""No lease vouched for (never mutated)."""


def ack_runs(conn: sqlite3.Connection, leases: list[Lease],
             runs: Sequence[Run]) -> list[SettleResult] | None:
    """Ack ``leases``, which are ``runs`` of new ranges this backend leased
    (:mod:`.._issued_runs`), a slice of marks per run; ``None``, with nothing written,
    when a run is no longer wholly in flight (:func:`settle` then answers each lease)."""
    finished = take_runs(conn, runs)
    if finished is None:
        return None
    for group_id, part in sorted(finished):
        advance_frontier(conn, group_id, part)
    return [settle_ok(lease.lease_id) for lease in leases]


def settle(conn: sqlite3.Connection, clock: Clock, leases: list[Lease], op: Op, reason: str,
           delay_ms: int, error: str | None = None,
           vouched: set[int] = NOT_VOUCHED) -> list[SettleResult]:
    """Ack, nack or reject ``leases``; one result per lease, in order. ``vouched``: the
    positions of leases of new ranges this backend leased (:mod:`.._issued_runs`)."""
    now = clock()
    taken, finished = take(conn, leases, Split(op, now, reason, delay_ms, error), vouched)
    for group_id, part in sorted(finished):
        advance_frontier(conn, group_id, part)
    if len(taken) == len(leases):
        return [settle_ok(lease.lease_id) for lease in leases]
    rest = [lease for i, lease in enumerate(leases) if i not in taken] if taken else leases
    changed = fenced_update(conn, rest, sql.SETTLE[op], (reason, now, now + delay_ms),
                            () if op == "ack" else (error,))
    if changed is None:
        results = _settle_rows(conn, rest, op, reason, delay_ms, now, error)
    else:
        group_id, ordered, parts = changed
        # Every delivery of an ack or reject is settled; a nack's may be dead-lettered
        # (releasing the key of one that was not does nothing).
        if ordered:
            release_keys(conn, [(group_id, lease.event.partition, lease.event.sequence)
                                for lease in rest])
        for part in sorted(parts):
            advance_frontier(conn, group_id, part)
        results = [settle_ok(lease.lease_id) for lease in rest]
    return _merge(leases, taken, results, None)


def _merge(leases: list[Lease], taken: set[int], rest: list[SettleResult],
           deadline_ms: int | None) -> list[SettleResult]:
    """The results in the order of ``leases``: those the ranges took succeeded,
    ``rest`` answers the others in order."""
    if not taken:
        return rest
    others = iter(rest)
    return [SettleResult(lease.lease_id, None, False, deadline_ms) if i in taken
            else next(others) for i, lease in enumerate(leases)]


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
    found = Deliveries(conn, leases, op)
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
          lease_ms: int, vouched: set[int] = NOT_VOUCHED) -> list[SettleResult]:
    """Extend ``leases`` to ``lease_ms`` from now; one result per lease, in order."""
    now = clock()
    deadline = now + lease_ms
    taken, _ = take(conn, leases, Split("renew", now, deadline_ms=deadline), vouched)
    if len(taken) == len(leases):
        return [SettleResult(lease.lease_id, None, False, deadline) for lease in leases]
    rest = [lease for i, lease in enumerate(leases) if i not in taken] if taken else leases
    if fenced_update(conn, rest, sql.RENEW, (deadline, None, None)) is None:
        results = _renew_rows(conn, rest, now, lease_ms)
    else:
        results = [SettleResult(lease.lease_id, None, False, deadline) for lease in rest]
    return _merge(leases, taken, results, deadline)


def _renew_rows(conn: sqlite3.Connection, leases: list[Lease], now: int,
                lease_ms: int) -> list[SettleResult]:
    found = Deliveries(conn, leases, "renew")
    results: list[SettleResult] = []
    for lease, _, d in found.held(leases, results):
        result = renew_delivery(lease, d.state, d.settled_by, now, lease_ms)
        if result.deadline_ms is not None:
            d.renew(result.deadline_ms)
        results.append(result)
    found.write_back()
    return results
