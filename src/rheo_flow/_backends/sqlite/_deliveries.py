"""Delivery rows for settles and renews: the fenced one-statement update of a batch,
and the batch loader the row-by-row path works on.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..._backend import MAX_ATTEMPTS_REASON
from ..._model._lease import Lease
from ..._model._settle_results import SettleKind, SettleResult
from .._shared import fence, missing_delivery
from .._transitions import Op, Settled
from . import _sql as sql
from ._catalog import Group, Stream, find_group, find_stream
from ._ranges import explain

__all__ = ["Deliveries", "Row", "fenced_update"]

_MAX_SEQUENCE: Final = 2**63 - 1
"""The largest SQLite integer."""


@dataclass(slots=True)
class Row:
    """A delivery row loaded for a settle or renew, changed in Python, written back once.

    The fields are the columns of ``delivery_rows`` in statements.sql, in order.
    """

    seq: int
    state: str
    attempt: int
    lease_id: str | None
    receipt: str | None
    settled_by: str | None
    reason: str
    available_at_ms: int
    rejected_at_ms: int
    deadline_ms: int
    last_error: str | None
    dirty: bool = False

    def settle(self, outcome: Settled, error: str | None) -> None:
        """Store what a settle made of the delivery (and the caller's error, if any)."""
        self.state, self.reason, self.settled_by = outcome.state, outcome.reason, outcome.settled_by
        if outcome.available_at_ms is not None:
            self.available_at_ms = outcome.available_at_ms
        if outcome.rejected_at_ms is not None:
            self.rejected_at_ms = outcome.rejected_at_ms
        if error is not None:
            self.last_error = error
        self.dirty = True

    def renew(self, deadline_ms: int) -> None:
        """Store a renewed lease's deadline."""
        self.deadline_ms = deadline_ms
        self.dirty = True


class Deliveries:
    """The delivery rows a batch of leases names, loaded in a few IN queries.

    Settling happens on these Python copies (so two leases on one delivery in one
    batch behave as if settled one after the other) and changed rows are written
    back with one ``executemany``.
    """

    def __init__(self, conn: sqlite3.Connection, leases: list[Lease],
                 op: Op | Literal["renew"]) -> None:
        self._conn = conn
        self._op = op
        self._groups: dict[tuple[str, str], Group | None] = {}
        self._rows: dict[tuple[int, int, int], Row] = {}
        self._high: dict[int, dict[int, int]] = {}
        wanted: dict[tuple[int, int], set[int]] = {}
        for lease in leases:
            g = self._group(lease.stream, lease.group)
            if g is not None and 0 <= lease.partition < g.stream.partitions:
                wanted.setdefault((g.id, lease.partition), set()).add(lease.sequence)
        for (group_id, part), seqs in wanted.items():
            for statement, params in sql.in_lists(sql.DELIVERY_ROWS, (group_id, part),
                                                  sorted(seqs)):
                for row in conn.execute(statement, params):
                    self._rows[(group_id, part, row[0])] = Row(*row)

    def _group(self, stream: str, group: str) -> Group | None:
        key = (stream, group)
        if key not in self._groups:
            s = find_stream(self._conn, stream)
            self._groups[key] = None if s is None else find_group(self._conn, s, group)
        return self._groups[key]

    def held(self, leases: list[Lease],
             results: list[SettleResult]) -> Iterator[tuple[Lease, Group, Row]]:
        """Each lease that still names its delivery, with its group and row.

        Every other lease's result (invalid, stale, receipt mismatch) is appended
        to ``results`` in its place, so the caller appends one result per lease
        it is given and ``results`` follows the order of ``leases``.
        """
        for lease in leases:
            hit = self.find(lease)
            if isinstance(hit, SettleResult):
                results.append(hit)
            else:
                yield lease, *hit

    def find(self, lease: Lease) -> tuple[Group, Row] | SettleResult:
        """The lease's group and row, or why the lease does not hold it."""
        g = self._group(lease.stream, lease.group)
        if g is None or not 0 <= lease.partition < g.stream.partitions:
            return SettleResult.failure(
                lease.lease_id, SettleKind.INVALID, "lease names no group of this backend"
            )
        d = self._rows.get((g.id, lease.partition, lease.sequence))
        if d is None:
            # An unordered group's event may be held by a range lease (_ranges.py).
            return (explain(self._conn, g.id, lease, self._op) if g.ordering == "none" else None
                    ) or missing_delivery(lease, self._high_water(g.stream, lease.partition))
        return fence(lease, d.lease_id, d.receipt) or (g, d)

    def _high_water(self, s: Stream, part: int) -> int:
        if s.id not in self._high:
            self._high[s.id] = dict(self._conn.execute(sql.HIGH_WATERS, (s.id,)).fetchall())
        return self._high[s.id].get(part, 0)

    def write_back(self) -> None:
        """Write every changed row in one ``executemany``."""
        changed = [
            (d.state, d.reason, d.settled_by, d.available_at_ms, d.rejected_at_ms, d.deadline_ms,
             d.last_error, group_id, part, seq)
            for (group_id, part, seq), d in self._rows.items()
            if d.dirty
        ]
        if changed:
            self._conn.executemany(sql.WRITE_BACK, changed)


def fenced_update(
    conn: sqlite3.Connection, leases: list[Lease], statement: str, constants: tuple[Any, ...],
    tail: tuple[Any, ...] = (),
) -> tuple[int, bool, set[int]] | None:
    """Run a fenced settle or renew ``statement`` over ``leases`` in one ``executemany``.

    Returns the group id, whether the group is key-ordered, and the partitions
    changed when every lease was current (the usual batch). Otherwise nothing is
    changed and ``None`` is returned: the batch spans several groups, names no
    group here, or some lease is stale, forged, repeated or named twice, and the
    row-by-row path classifies each one.
    """
    if not leases:
        return None
    first = leases[0]
    stream, group = first.event.stream, first.group
    row = conn.execute(sql.SETTLE_GROUP, (group, stream)).fetchone()
    if row is None:
        return None
    group_id, max_attempts, count, ordering = row
    head = (*constants, max_attempts, MAX_ATTEMPTS_REASON, group_id)
    params: list[tuple[Any, ...]] = []
    for lease in leases:
        event = lease.event
        part, seq = event.partition, event.sequence
        lease_id, receipt = lease.lease_id, lease.receipt
        # Anything a fetch here cannot have produced goes to the row-by-row path,
        # which answers it lease by lease instead of failing the whole batch.
        if (lease.group != group or event.stream != stream
                or part.__class__ is not int or not 0 <= part < count
                or seq.__class__ is not int or not 0 < seq <= _MAX_SEQUENCE
                or lease_id.__class__ is not str or receipt.__class__ is not str):
            return None
        params.append((*head, part, seq, lease_id, receipt, *tail))
    conn.execute(sql.SAVEPOINT)
    # rowcount: the rows this statement changed, not what else the connection did.
    changed = conn.executemany(statement, params).rowcount  # an error rolls it all back
    if changed != len(leases):
        conn.execute(sql.ROLLBACK_TO_SAVEPOINT)
        conn.execute(sql.RELEASE_SAVEPOINT)
        return None
    conn.execute(sql.RELEASE_SAVEPOINT)
    return group_id, ordering == "key", {lease.event.partition for lease in leases}
