"""Range leases of unordered groups: settles and renewals of the events a range holds,
and why a lease without a delivery row failed.

A fetch of an unordered group leases new events as one ``ranges`` row per
partition (schema.sql ``create_ranges``) instead of a delivery row each. An
event's lease id is its range's token and its offset from ``base_seq``; its
receipt is ``part-seq-attempt``, as a delivery row's. Settles and renewals take
the events their ranges hold first (:func:`take`): an ack sets the event's mark;
a nack or a reject sets it and splits the event off into the delivery row
settle would have left; a renewal of every event a range has in flight moves
the range's deadline, one of part of them splits the renewed events off into
leased delivery rows. What is left goes the delivery rows' way, whose misses
:func:`explain` answers from the range holding the event.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..._backend import MAX_ATTEMPTS_REASON
from ..._model._lease import Lease
from ..._model._settle_results import SettleKind, SettleResult
from .._issued_runs import Run
from .._transitions import Op, not_leased
from . import _sql as sql

__all__ = ["RangeRow", "Split", "explain", "new_token", "range_token", "split_scheduled", "take",
           "take_runs"]

RangeRow = tuple[int, int, int, str, int, int, str | None, str, int]
"""A ``ranges`` row as ``range_columns`` of statements.sql reads it: first_seq,
last_seq, base_seq, token, attempt, deadline_ms, consumer_id, done, pending."""

_TOKEN_LENGTH: Final = 24
_LEASE_ID_LENGTH: Final = _TOKEN_LENGTH + 8
_IN_FLIGHT: Final = ord("0")
_DONE: Final = ord("1")


def range_token(lease_id: str) -> str | None:
    """The token of the range a lease id names (``None``: not a range's lease id)."""
    return lease_id[:_TOKEN_LENGTH] if len(lease_id) == _LEASE_ID_LENGTH else None


def new_token() -> str:
    """A range's token: 24 random hex digits."""
    return os.urandom(_TOKEN_LENGTH // 2).hex()


@dataclass(frozen=True, slots=True)
class Split:
    """A settle or renew batch as the range step applies it."""

    op: Op | Literal["renew"]
    now: int
    reason: str = ""
    delay_ms: int = 0
    error: str | None = None
    deadline_ms: int = 0
    """A renewal's new deadline."""

    def row(self, group_id: int, part: int, seq: int, lease: Lease, attempt: int,
            max_attempts: int, consumer: str | None, deadline: int) -> tuple[Any, ...]:
        """The delivery row an event split off a range becomes (``split_delivery``)."""
        op, now = self.op, self.now
        if op == "renew":
            return (group_id, part, seq, "leased", attempt, lease.lease_id, lease.receipt,
                    consumer, self.deadline_ms, 0, None, "", 0, None)
        if op == "reject":
            state, reason, available, rejected = "rejected", self.reason, 0, now
        elif attempt >= max_attempts:  # a nack of the last attempt dead-letters
            state, reason, available, rejected = "rejected", MAX_ATTEMPTS_REASON, 0, now
        else:
            state, reason, available, rejected = "available", self.reason, now + self.delay_ms, 0
        return (group_id, part, seq, state, attempt, lease.lease_id, lease.receipt, consumer,
                deadline, available, op, reason, rejected, self.error)


def take(conn: sqlite3.Connection, leases: list[Lease], split: Split,
         vouched: set[int]) -> tuple[set[int], set[tuple[int, int]]]:
    """Apply ``split`` to the leases whose range still holds their event in flight.

    ``vouched``: the positions of leases built from their range by this backend
    object (:mod:`.._issued_runs`), whose fields need no check against the range's.
    Returns the positions in ``leases`` that took effect, and the (group id,
    partition) pairs whose frontier may move. A lease named twice takes effect
    once; the other goes the delivery rows' way like every lease not taken.
    """
    # By token first: a token names one range (96 random bits), so the group and
    # partition are looked up once per token, and each lease is checked against them.
    wanted: dict[str, list[int]] = {}
    for i, lease in enumerate(leases):
        lease_id = lease.lease_id
        if lease_id.__class__ is str and len(lease_id) == _LEASE_ID_LENGTH:
            found = wanted.get(lease_id[:_TOKEN_LENGTH])
            if found is None:
                wanted[lease_id[:_TOKEN_LENGTH]] = [i]
            else:
                found.append(i)
    groups: dict[tuple[str, str], tuple[int, int] | None] = {}
    taken: set[int] = set()
    finished: set[tuple[int, int]] = set()
    splits: list[tuple[Any, ...]] = []
    for token, positions in wanted.items():
        lease = leases[positions[0]]
        name = (lease.event.stream, lease.group)
        if name not in groups:
            groups[name] = _unordered_group(conn, *name)
        g, part = groups[name], lease.event.partition
        if g is None or part.__class__ is not int:
            continue
        group_id, max_attempts = g
        for row in conn.execute(sql.RANGES_BY_TOKEN, (group_id, part, token)).fetchall():
            took = _take_range(conn, leases, positions, split, (*name, group_id, part), row,
                               max_attempts, splits, vouched)
            if took:
                taken.update(took)
                if split.op in ("ack", "reject") or (
                        split.op == "nack" and row[4] >= max_attempts):
                    finished.add((group_id, part))
    if splits:
        conn.executemany(sql.SPLIT_DELIVERY, splits)
    return taken, finished


def take_runs(conn: sqlite3.Connection, runs: Sequence[Run]) -> set[tuple[int, int]] | None:
    """Ack ``runs`` (:mod:`.._issued_runs`): each run's events marked with one slice of
    its range's marks. Returns the (group id, partition) pairs whose frontier may move;
    ``None``, with nothing written, when a run is not wholly in flight in the range
    its token names (leased again since, an event acked already, the group gone):
    the batch then takes the per-lease way, which answers every lease."""
    groups: dict[tuple[str, str], tuple[int, int] | None] = {}
    # Per range (group id, partition, first sequence): its row and its marks so far.
    marked: dict[tuple[int, int, int], tuple[RangeRow, bytearray, int]] = {}
    rows_of: dict[tuple[int, int, str], list[RangeRow]] = {}
    for run in runs:
        name = (run.stream, run.group)
        if name not in groups:
            groups[name] = _unordered_group(conn, *name)
        g = groups[name]
        if g is None:
            return None
        where = (g[0], run.part, run.token)
        rows = rows_of.get(where)
        if rows is None:
            rows = rows_of[where] = conn.execute(sql.RANGES_BY_TOKEN, where).fetchall()
        for row in rows:
            first, last = row[0], row[1]
            if first <= run.lo and run.hi <= last:
                break
        else:
            return None
        key = (g[0], run.part, first)
        _, marks, taken = marked.get(key) or (row, bytearray(row[7], "ascii"), 0)
        a, b = run.lo - first, run.hi - first + 1
        if marks.find(_DONE, a, b) >= 0:  # acked already (twice in the batch, or before)
            return None
        marks[a:b] = b"1" * (b - a)
        marked[key] = (row, marks, taken + b - a)
    for (group_id, part, first), (row, marks, taken) in marked.items():
        left = row[8] - taken
        conn.execute(sql.MARK_RANGE, (marks.decode("ascii") if left else "1" * len(marks),
                                      left, row[5], group_id, part, first))
    return {(group_id, part) for group_id, part, _ in marked}


def _unordered_group(conn: sqlite3.Connection, stream: str,
                     group: str) -> tuple[int, int] | None:
    """The id and max attempts of an unordered group (only they have ranges)."""
    if stream.__class__ is not str or group.__class__ is not str:
        return None
    row = conn.execute(sql.SETTLE_GROUP, (group, stream)).fetchone()
    if row is None or row[3] != "none":
        return None
    return row[0], row[1]


def _take_range(conn: sqlite3.Connection, leases: list[Lease], positions: list[int],
                split: Split, where: tuple[str, str, int, int], row: RangeRow,
                max_attempts: int, splits: list[tuple[Any, ...]], vouched: set[int]) -> list[int]:
    """The positions this range takes (marked, split off and stored), or none.

    ``where``: the range's stream, group, group id and partition.
    """
    stream, group, group_id, part = where
    first, last, base, _, attempt, deadline, consumer, done, pending = row
    marks = bytearray(done, "ascii")
    receipt_head, receipt_tail = f"{part}-", f"-{attempt}"
    renew = split.op == "renew"
    took: list[int] = []
    events = 0
    for i in positions:
        lease = leases[i]
        event = lease.event
        seq = event.sequence
        if i in vouched:  # built from this token's range: only its bounds may have moved
            if not first <= seq <= last:
                continue
        elif (seq.__class__ is not int or not first <= seq <= last
                or lease.lease_id[_TOKEN_LENGTH:] != f"{seq - base:08x}"
                or lease.receipt != f"{receipt_head}{seq}{receipt_tail}"
                or event.partition != part or lease.group != group or event.stream != stream):
            continue
        if marks[seq - first] != _IN_FLIGHT:
            if renew and done[seq - first] == "0":
                took.append(i)  # renewed twice in the batch: the same renewal
            continue
        marks[seq - first] = _DONE
        took.append(i)
        events += 1
        if split.op != "ack":
            splits.append(split.row(group_id, part, seq, lease, attempt, max_attempts,
                                    consumer, deadline))
    if not took:
        return took
    if renew and events == pending:
        splits[len(splits) - events:] = []  # the whole range renewed: no row split off
        conn.execute(sql.MARK_RANGE, (done, pending, split.deadline_ms, group_id, part, first))
    else:
        left = pending - events
        conn.execute(sql.MARK_RANGE, (marks.decode("ascii") if left else "1" * len(marks),
                                      left, deadline, group_id, part, first))
    return took


def explain(conn: sqlite3.Connection, group_id: int, lease: Lease,
            op: Op | Literal["renew"]) -> SettleResult | None:
    """Why a lease whose event has no delivery row failed, from the range holding the
    event; ``None`` when no range holds it."""
    seq = lease.sequence
    if seq.__class__ is not int:
        return None
    row = conn.execute(sql.RANGE_AT, (group_id, lease.partition, seq)).fetchone()
    if row is None or row[1] < seq:
        return None
    first, _, base, token, attempt, *_, done, _ = row
    if lease.lease_id != f"{token}{seq - base:08x}":
        return SettleResult.failure(
            lease.lease_id, SettleKind.STALE_LEASE, "the delivery was leased again")
    if lease.receipt != f"{lease.partition}-{seq}-{attempt}":
        return SettleResult.failure(
            lease.lease_id, SettleKind.RECEIPT_MISMATCH, "receipt does not match the lease")
    if done[seq - first] == "0":  # held, yet not taken: only a change meanwhile explains it
        return SettleResult.failure(
            lease.lease_id, SettleKind.FAILED, "the delivery changed concurrently; retry")
    return not_leased(lease, "ack", op)  # a mark without a delivery row is an ack


SCHEDULED_READ: Final = 4096
"""How many scheduled events past its window's need a split reads at most."""


def split_scheduled(conn: sqlite3.Connection, group_id: int, stream_id: int,
                    cursors: dict[int, tuple[int, int]], ids: list[int], now: int,
                    limit: int) -> None:
    """An unordered group's fetch in a stream with scheduled events (docs/contract.md,
    "Delayed delivery"): a range covers every event from its first sequence to its
    last, so a scheduled event not due at ``now`` cannot be in one. In each partition
    of ``ids`` whose window of new events holds one, the window (up to ``limit``
    events due, past the scheduled ones) becomes delivery rows, attempt 0: the
    scheduled events available at their time, the others now; the cursor (in
    ``cursors`` too) moves to its end, and the fetch leases the rows due as it leases
    nacked ones. PostgreSQL's ``split_scheduled`` does the same."""
    rows: list[tuple[Any, ...]] = []
    moves: list[tuple[int, int, int]] = []
    for part in ids:
        cursor, high = cursors[part]
        if cursor >= high:
            continue
        found = conn.execute(sql.SCHEDULED_AFTER, (
            stream_id, part, cursor, now, limit + SCHEDULED_READ)).fetchall()
        at = {seq: time for seq, time in found if seq <= high}
        if not at:
            continue
        # seq - cursor - n: the events due between the cursor and the n-th scheduled one.
        hi = cursor + limit + sum(1 for n, seq in enumerate(sorted(at), 1)
                                  if seq - cursor - n < limit)
        hi = min(high, hi, max(at) if len(found) == limit + SCHEDULED_READ else high)
        rows.extend((group_id, part, seq, "available", 0, None, None, None, 0,
                     at.get(seq, now), None, "", 0, None) for seq in range(cursor + 1, hi + 1))
        moves.append((hi, group_id, part))
        cursors[part] = (hi, high)
    if rows:
        conn.executemany(sql.SPLIT_DELIVERY, rows)
        conn.executemany(sql.SET_CURSOR, moves)
