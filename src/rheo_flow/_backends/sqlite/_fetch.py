"""Fetch: leasing a group's eligible deliveries, a few statements per batch.

A fetch reads the group and every partition's progress in one statement, scans
each partition's eligible existing deliveries on a partial index (so its cost
does not grow with the number of acked events), takes candidates round-robin
across partitions, re-leases existing deliveries with one ``executemany`` and
leases a partition's new sequences with one ``INSERT ... SELECT``: delivery rows
are created only when a sequence past the cursor is actually leased.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass

from ..._model._errors import BackendError
from ..._model._lease import Lease, make_lease
from ..._support._clock import Clock
from .._shared import round_robin
from .._transitions import Settled, expire
from . import _sql as sql
from ._catalog import get_group
from ._events import load_events
from ._fetch_keyed import KeyedFetch
from ._progress import advance_frontier

__all__ = ["Fetcher"]

Candidates = list[tuple[int, int]]
"""A partition's eligible existing deliveries, as (sequence, attempt) in sequence order."""


@dataclass(slots=True)
class _Progress:
    """What a fetch reads of its group first, in one statement."""

    group_id: int
    max_attempts: int
    stream_id: int
    partitions: int
    ordered: bool
    """The group's ordering is ``"key"`` (its fetch is :class:`KeyedFetch`)."""
    cursors: dict[int, tuple[int, int]]
    """Per partition: the cursor (highest sequence with a delivery row) and the high water."""


class Fetcher:
    """The fetch of one backend object.

    Where the round-robin across partitions starts rotates per call, as in the
    reference backend. It is kept here, not stored: a fetch that finds nothing
    then writes nothing.
    """

    def __init__(self, clock: Clock, path: str) -> None:
        self._clock = clock
        self._path = path
        self._rotation: dict[int, int] = {}

    def fetch(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: list[int] | None,
    ) -> list[Lease]:
        """Lease up to ``limit`` deliveries of ``partitions`` (``None``: all) for ``lease_ms``."""
        progress = _read_progress(conn, stream, group)
        if progress is None:
            return []
        now = self._clock()
        ids = list(range(progress.partitions)) if partitions is None else partitions
        if not ids:
            return []
        ids = self._rotate(progress.group_id, ids)
        if progress.ordered:
            return KeyedFetch(conn, progress.group_id, progress.max_attempts,
                              progress.stream_id, now, limit).run(
                stream, group, consumer_id, lease_ms, progress.cursors, ids)
        existing, sizes = _candidates(conn, progress, ids, now, limit)
        if len(ids) == 1:
            order = [(0, d) for d in range(min(sizes[0], limit))]
        else:
            order = round_robin(sizes, limit)  # (index into ids, depth)
        if not order:
            return []
        batch = _Batch(progress, ids, existing, order, now + lease_ms)
        batch.write(conn, consumer_id, self._path, stream)
        return batch.leases(conn, stream, group, consumer_id)

    def _rotate(self, group_id: int, ids: list[int]) -> list[int]:
        rotation = (self._rotation.get(group_id, 0) + 1) % len(ids)
        self._rotation[group_id] = rotation
        return ids[rotation:] + ids[:rotation]


def _read_progress(conn: sqlite3.Connection, stream: str, group: str) -> _Progress | None:
    rows = conn.execute(sql.PROGRESS, (group, stream)).fetchall()
    if not rows:
        get_group(conn, stream, group)  # raises UnknownStream or UnknownGroup
        return None
    group_id, max_attempts, stream_id, count, ordering = rows[0][:5]
    return _Progress(group_id, max_attempts, stream_id, count, ordering == "key",
                     {part: (cursor, high) for *_, part, cursor, high in rows})


def _candidates(conn: sqlite3.Connection, p: _Progress, ids: list[int], now: int,
                limit: int) -> tuple[list[Candidates], list[int]]:
    """Per partition of ``ids``: its eligible existing deliveries, and how many
    candidates it offers in all (those, then new sequences past the cursor).

    Deliveries whose lease expired at max attempts are dead-lettered on the way.
    """
    existing: list[Candidates] = []
    sizes: list[int] = []
    expired: list[tuple[Settled, int, int]] = []
    for part in ids:
        found = _eligible(conn, p, part, now, limit, expired)
        cursor, high = p.cursors[part]
        existing.append(found)
        sizes.append(len(found) + max(0, min(limit - len(found), high - cursor)))
    if expired:
        conn.executemany(sql.EXPIRE, [
            (s.state, s.reason, s.settled_by, s.rejected_at_ms, p.group_id, part, seq)
            for s, part, seq in expired])
        for part in sorted({part for _, part, _ in expired}):
            advance_frontier(conn, p.group_id, part)
    return existing, sizes


def _eligible(conn: sqlite3.Connection, p: _Progress, part: int, now: int, limit: int,
              expired: list[tuple[Settled, int, int]]) -> Candidates:
    """Up to ``limit`` eligible deliveries of ``part``; expired ones go to ``expired``."""
    found: Candidates = []
    cur = conn.execute(sql.ELIGIBLE, (p.group_id, part, now, now))
    try:
        for seq, attempt in cur:
            if len(found) >= limit:
                break
            dead = expire(attempt, p.max_attempts, now)
            if dead is not None:
                expired.append((dead, part, seq))
                continue
            found.append((seq, attempt))
    finally:
        cur.close()
    return found


class _Batch:
    """The leases one fetch makes: existing deliveries leased again, and ranges of
    new sequences, numbered in the fetch after one random lease id prefix."""

    __slots__ = ("again", "deadline", "existing", "fresh", "ids", "order", "prefix", "progress")

    def __init__(self, progress: _Progress, ids: list[int], existing: list[Candidates],
                 order: list[tuple[int, int]], deadline: int) -> None:
        self.progress = progress
        self.ids = ids
        self.existing = existing
        self.order = order
        self.deadline = deadline
        self.prefix = os.urandom(12).hex()
        self.again: list[tuple[int, int, int, str, str]] = []
        """Leased again: part, seq, the new attempt, lease id and receipt."""
        self.fresh: list[tuple[int, int, int, int]] = []
        """New deliveries: part, first and last sequence, the first lease number."""
        picked = [0] * len(ids)
        for i, _ in order:
            picked[i] += 1
        # A partition's picks are its eligible deliveries first, then new sequences.
        number = 0
        for i, part in enumerate(ids):
            count = min(picked[i], len(existing[i]))
            for seq, attempt in existing[i][:count]:
                self.again.append((part, seq, attempt + 1, f"{self.prefix}{number:08x}",
                                   f"{part}-{seq}-{attempt + 1}"))
                number += 1
            new = picked[i] - count
            if new:
                cursor = progress.cursors[part][0]
                self.fresh.append((part, cursor + 1, cursor + new, number))
                number += new

    def write(self, conn: sqlite3.Connection, consumer_id: str, path: str, stream: str) -> None:
        """Store the leases: re-leased rows updated, new rows inserted, cursors moved."""
        p, deadline = self.progress, self.deadline
        if self.again:
            conn.executemany(sql.LEASE_AGAIN, [
                (attempt, lease_id, receipt, consumer_id, deadline, p.group_id, part, seq)
                for part, seq, attempt, lease_id, receipt in self.again])
        for part, first, last, base in self.fresh:
            # The lease id and receipt are built by SQLite exactly as in leases().
            inserted = conn.execute(sql.LEASE_NEW, (
                p.group_id, self.prefix, first, base, consumer_id, deadline, p.stream_id, part,
                last)).rowcount
            if inserted != last - first + 1:  # events past the cursor are never removed
                raise BackendError(
                    f"SQLite database {path!r}: events {first}..{last} of partition "
                    f"{part} of stream {stream!r} are missing")
        if self.fresh:
            conn.executemany(sql.SET_CURSOR,
                             [(last, p.group_id, part) for part, _, last, _ in self.fresh])

    def leases(self, conn: sqlite3.Connection, stream: str, group: str,
               consumer_id: str) -> list[Lease]:
        """The stored leases with their events, in the order picked."""
        again: dict[int, list[int]] = {}
        for part, seq, *_ in self.again:
            again.setdefault(part, []).append(seq)
        for seqs in again.values():
            seqs.sort()
        events = load_events(conn, self.progress.stream_id, stream,
                             {part: (first, last) for part, first, last, _ in self.fresh}, again)
        made: dict[tuple[int, int], Lease] = {}
        for part, seq, attempt, lease_id, receipt in self.again:
            made[(part, seq)] = make_lease(lease_id, receipt, group, consumer_id,
                                           events[(part, seq)], attempt, self.deadline)
        for part, first, last, base in self.fresh:
            for seq in range(first, last + 1):
                made[(part, seq)] = make_lease(f"{self.prefix}{seq - first + base:08x}",
                                               f"{part}-{seq}-1", group, consumer_id,
                                               events[(part, seq)], 1, self.deadline)
        if len(self.ids) == 1:
            return list(made.values())  # re-deliveries, then new ones: the order picked
        return [made[self._position(i, depth)] for i, depth in self.order]

    def _position(self, i: int, depth: int) -> tuple[int, int]:
        """The (partition, sequence) of the candidate at ``depth`` of partition ``ids[i]``."""
        found, part = self.existing[i], self.ids[i]
        if depth < len(found):
            return part, found[depth][0]
        return part, self.progress.cursors[part][0] + depth - len(found) + 1

