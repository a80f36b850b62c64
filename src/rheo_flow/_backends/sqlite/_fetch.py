"""Fetch: leasing a group's eligible deliveries, a few statements per batch.

A fetch reads the group, then in ONE statement the partitions with work (new
events past the cursor, or a delivery row due) and in another the group's
expired ranges; it visits only those partitions, so an idle partition costs a
comparison and the limit goes where the work is. A partition's due delivery rows
are read on an index by due time, with "<= now" as the index bound, so neither
acked history nor delayed or held work is walked. Candidates are taken
round-robin across the partitions with work; delivery rows are leased again
with one ``executemany``, ranges with a statement each, and a partition's new
sequences as ONE range row (_ranges.py): an unordered group stores no delivery
row per event. A key-ordered group's fetch is :mod:`._fetch_keyed`.

With nothing to lease again (the common case) a fetch writes a range row and a
cursor per partition, and reads the events in one range query each.
"""

from __future__ import annotations

import bisect
import os
import sqlite3
from dataclasses import dataclass
from typing import Any

from ..._backend import MAX_ATTEMPTS_REASON
from ..._model._errors import BackendError
from ..._model._lease import Lease, make_lease
from ..._support._clock import Clock
from .._issued_runs import IssuedRuns
from .._shared import Rotation, round_robin
from .._transitions import Settled, expire
from . import _sql as sql
from ._catalog import get_group
from ._events import decode, load_events
from ._fetch_keyed import KeyedFetch
from ._progress import advance_frontier
from ._ranges import RangeRow, new_token, split_scheduled

__all__ = ["Fetcher", "FreshRange", "leases_of"]

Candidates = list[tuple[int, int, int]]
"""A partition's events to lease again, as (sequence, attempt, source), the soonest
due first; source is -1 for a delivery row, else the place of the expired range
holding the event in the fetch's list of them."""

Due = list[tuple[int, int, int, int]]
"""Events to lease again with when each became due: (due, sequence, attempt, source)."""

NO_NEW_EVENTS = (0, 0)
"""The (cursor, high water) of a partition whose work is only expired ranges."""


@dataclass(slots=True)
class _Progress:
    """What a fetch reads of its group first: its settings, then its work."""

    group_id: int
    max_attempts: int
    stream_id: int
    partitions: int
    ordered: bool
    """The group's ordering is ``"key"`` (its fetch is :class:`KeyedFetch`)."""
    scheduled: bool
    """The stream holds scheduled events (``streams.scheduled``)."""
    cursors: dict[int, tuple[int, int]]
    """Per partition with work: the cursor (highest sequence leased or stored) and
    the high water; :data:`NO_NEW_EVENTS` where the work is expired ranges only."""
    expired: dict[int, list[RangeRow]]
    """Per partition: its expired ranges with events in flight, by sequence."""


class FreshRange:
    """The stored rows of one new range, its leases not built yet (then registered
    with ``issued``: acks of runs of them go per range, :mod:`.._issued_runs`).

    The common fetch leases one new range. Building its events and leases is half
    the Python of a fetch: done in the caller's thread, after the commit, it keeps
    the backend thread (every caller's bottleneck) to SQL and lets it start the
    next transaction meanwhile. Nothing is lost if the caller never builds them:
    the range is stored, its leases expire.
    """

    __slots__ = ("consumer_id", "deadline", "first", "group", "issued", "part", "rows", "stream",
                 "token")

    def __init__(self, rows: list[tuple[Any, ...]], stream: str, group: str, consumer_id: str,
                 part: int, first: int, token: str, deadline: int, issued: IssuedRuns) -> None:
        self.rows = rows
        self.stream = stream
        self.group = group
        self.consumer_id = consumer_id
        self.part = part
        self.first = first
        self.token = token
        self.deadline = deadline
        self.issued = issued

    def leases(self) -> list[Lease]:
        """The range's leases, in sequence order (registered with ``issued``)."""
        group, consumer_id, deadline = self.group, self.consumer_id, self.deadline
        token, first, head = self.token, self.first, f"{self.part}-"
        leases = [make_lease(f"{token}{event.sequence - first:08x}",
                             f"{head}{event.sequence}-1", group, consumer_id, event, 1, deadline)
                  for event in decode(self.stream, self.rows)]
        self.issued.register(self.stream, group, self.part, token, first, leases)
        return leases


def leases_of(fetched: list[Lease] | FreshRange) -> list[Lease]:
    """The leases of a fetch's result."""
    return fetched if fetched.__class__ is list else fetched.leases()  # type: ignore[union-attr]


class Fetcher:
    """The fetch of one backend object.

    Where the round-robin across partitions starts rotates per call, over the
    partitions asked for, as in the reference backend; the round then visits the
    partitions with work from there on. It is kept here, not stored: a fetch
    that finds nothing then writes nothing.
    """

    def __init__(self, clock: Clock, path: str, issued: IssuedRuns) -> None:
        self._clock = clock
        self._path = path
        self._issued = issued
        self._rotation: Rotation[int] = Rotation()

    def fetch(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: list[int] | None,
    ) -> list[Lease] | FreshRange:
        """Lease up to ``limit`` deliveries of ``partitions`` (``None``: all) for ``lease_ms``;
        one new range comes back as its rows, for :func:`leases_of` to build outside the
        transaction."""
        now = self._clock()
        progress = _read_progress(conn, stream, group, now)
        if progress is None:
            return []
        ids = self._with_work(progress, partitions)
        if not ids:
            return []
        if progress.ordered:
            return KeyedFetch(conn, progress.group_id, progress.max_attempts,
                              progress.stream_id, now, limit).run(
                stream, group, consumer_id, lease_ms, progress.cursors, ids)
        if progress.scheduled:
            split_scheduled(conn, progress.group_id, progress.stream_id, progress.cursors, ids,
                            now, limit)
        existing, sizes, expired = _candidates(conn, progress, ids, now, limit)
        if len(ids) == 1:
            order = [(0, d) for d in range(min(sizes[0], limit))]
        else:
            order = round_robin(sizes, limit)  # (index into ids, depth)
        if not order:
            return []
        batch = _Batch(progress, ids, existing, expired, order, now + lease_ms)
        batch.write(conn, consumer_id)
        return batch.leases(conn, stream, group, consumer_id, self._path, self._issued)


    def _with_work(self, progress: _Progress, partitions: list[int] | None) -> list[int]:
        """The partitions of ``partitions`` (``None``: all) with work, in the order of
        this fetch's round: from where the rotation starts it on."""
        work = progress.cursors.keys() | progress.expired.keys()
        if partitions is not None:
            if not partitions:
                return []
            return [part for part in self._rotation.order(progress.group_id, list(partitions))
                    if part in work]
        start = self._rotation.order(progress.group_id, list(range(progress.partitions)))[0]
        ids = sorted(work)
        at = bisect.bisect_left(ids, start)
        return ids[at:] + ids[:at]


def _read_progress(conn: sqlite3.Connection, stream: str, group: str,
                   now: int) -> _Progress | None:
    """The group's settings and its work at ``now``; ``None`` when nothing is fetchable
    (an unknown stream or group raises)."""
    found = conn.execute(sql.FETCH_GROUP, (group, stream)).fetchone()
    if found is None:
        get_group(conn, stream, group)  # raises UnknownStream or UnknownGroup
        return None
    group_id, max_attempts, stream_id, count, ordering, paused_until, scheduled = found
    if paused_until > now:
        return None
    cursors = {part: (cursor, high) for part, cursor, high in conn.execute(
        sql.PARTITIONS_WITH_WORK, (group_id, now))}
    expired: dict[int, list[RangeRow]] = {}
    if ordering != "key":  # only unordered groups hold ranges
        for part, *row in conn.execute(sql.EXPIRED_RANGES, (group_id, now)):
            expired.setdefault(part, []).append(tuple(row))
            cursors.setdefault(part, NO_NEW_EVENTS)
    return _Progress(group_id, max_attempts, stream_id, count, ordering == "key",
                     bool(scheduled), cursors, expired)


def _candidates(conn: sqlite3.Connection, p: _Progress, ids: list[int], now: int,
                limit: int) -> tuple[list[Candidates], list[int], list[tuple[int, RangeRow]]]:
    """Per partition of ``ids``: its events to lease again, and how many candidates
    it offers in all (those, then new sequences past the cursor); and the expired
    ranges those name, as (partition, row).

    Delivery rows and ranges whose lease expired at max attempts are
    dead-lettered on the way.
    """
    existing: list[Candidates] = []
    sizes: list[int] = []
    expired: list[tuple[Settled, int, int]] = []
    ranges: list[tuple[int, RangeRow]] = []
    spent: list[tuple[int, RangeRow]] = []
    for part in ids:
        due = _eligible(conn, p, part, now, limit, expired)
        held = _expired_ranges(p, part, limit, ranges, spent)
        if held:  # the soonest due of both
            due = sorted(due + held)[:limit] if due else held
        found = [candidate[1:] for candidate in due]
        cursor, high = p.cursors[part]
        existing.append(found)
        sizes.append(len(found) + max(0, min(limit - len(found), high - cursor)))
    if expired:
        conn.executemany(sql.EXPIRE, [
            (s.state, s.reason, s.settled_by, s.rejected_at_ms, p.group_id, part, seq)
            for s, part, seq in expired])
    if spent:
        _dead_letter(conn, p.group_id, spent, now)
    for part in sorted({part for _, part, _ in expired} | {part for part, _ in spent}):
        advance_frontier(conn, p.group_id, part)
    return existing, sizes, ranges


def _eligible(conn: sqlite3.Connection, p: _Progress, part: int, now: int, limit: int,
              expired: list[tuple[Settled, int, int]]) -> Due:
    """Up to ``limit`` due delivery rows of ``part``, the soonest due first; expired
    ones at max attempts go to ``expired``."""
    found: Due = []
    cur = conn.execute(sql.ELIGIBLE, (p.group_id, part, now))
    try:
        for due, seq, attempt in cur:
            if len(found) >= limit:
                break
            dead = expire(attempt, p.max_attempts, now)
            if dead is not None:
                expired.append((dead, part, seq))
                continue
            found.append((due, seq, attempt, -1))
    finally:
        cur.close()
    return found


def _expired_ranges(p: _Progress, part: int, limit: int, ranges: list[tuple[int, RangeRow]],
                    spent: list[tuple[int, RangeRow]]) -> Due:
    """Up to ``limit`` events in flight of ``part``'s expired ranges, the soonest
    expired first; each range they name is appended to ``ranges``, those at max
    attempts to ``spent`` instead."""
    found: Due = []
    for row in p.expired.get(part, ()):
        first, _, _, _, attempt, deadline, _, done, _ = row
        if attempt >= p.max_attempts:
            spent.append((part, row))
            continue
        if len(found) >= limit:
            continue  # only ranges at max attempts are still of interest
        source = len(ranges)
        ranges.append((part, row))
        at = done.find("0")
        while at >= 0 and len(found) < limit:
            found.append((deadline, first + at, attempt, source))
            at = done.find("0", at + 1)
    return found


def _dead_letter(conn: sqlite3.Connection, group_id: int, spent: list[tuple[int, RangeRow]],
                 now: int) -> None:
    """Expired ranges at max attempts: their events in flight become dead letters
    (delivery rows, rejected with reason ``max_attempts``) and the ranges settle."""
    rows: list[tuple[Any, ...]] = []
    for part, (first, _, base, token, attempt, deadline, consumer, done, _) in spent:
        at = done.find("0")
        while at >= 0:
            seq = first + at
            rows.append((group_id, part, seq, "rejected", attempt, f"{token}{seq - base:08x}",
                         f"{part}-{seq}-{attempt}", consumer, deadline, 0, None,
                         MAX_ATTEMPTS_REASON, now, None))
            at = done.find("0", at + 1)
        conn.execute(sql.MARK_RANGE, ("1" * len(done), 0, deadline, group_id, part, first))
    conn.executemany(sql.SPLIT_DELIVERY, rows)


class _Batch:
    """The leases one fetch makes: delivery rows leased again (lease ids numbered in
    the fetch after one random prefix), expired ranges leased again and new ranges
    (under a new token each)."""

    __slots__ = ("again", "deadline", "existing", "expired", "fresh", "ids", "order", "progress",
                 "relet")

    def __init__(self, progress: _Progress, ids: list[int], existing: list[Candidates],
                 expired: list[tuple[int, RangeRow]], order: list[tuple[int, int]],
                 deadline: int) -> None:
        self.progress = progress
        self.ids = ids
        self.existing = existing
        self.expired = expired
        self.order = order
        self.deadline = deadline
        self.again: list[tuple[int, int, int, str, str]] = []
        """Delivery rows leased again: part, seq, the new attempt, lease id and receipt."""
        self.relet: dict[int, tuple[list[int], str]] = {}
        """Expired ranges leased again, by place in ``expired``: the sequences taken
        (a prefix of its events in flight), the new token."""
        self.fresh: list[tuple[int, int, int, str]] = []
        """New ranges: part, first and last sequence, token."""
        picked = [0] * len(ids)
        for i, _ in order:
            picked[i] += 1
        # A partition's picks are its events to lease again first (the soonest due,
        # leased in sequence order), then new sequences.
        prefix, number = os.urandom(12).hex(), 0
        for i, part in enumerate(ids):
            count = min(picked[i], len(existing[i]))
            existing[i] = sorted(existing[i][:count])
            for seq, attempt, source in existing[i]:
                if source >= 0:
                    if source not in self.relet:
                        self.relet[source] = ([], new_token())
                    self.relet[source][0].append(seq)
                    continue
                self.again.append((part, seq, attempt + 1, f"{prefix}{number:08x}",
                                   f"{part}-{seq}-{attempt + 1}"))
                number += 1
            new = picked[i] - count
            if new:
                cursor = progress.cursors[part][0]
                self.fresh.append((part, cursor + 1, cursor + new, new_token()))

    def write(self, conn: sqlite3.Connection, consumer_id: str) -> None:
        """Store the leases: delivery rows and ranges leased again, new ranges inserted,
        cursors moved."""
        group_id, deadline = self.progress.group_id, self.deadline
        if self.again:
            conn.executemany(sql.LEASE_AGAIN, [
                (attempt, lease_id, receipt, consumer_id, deadline, group_id, part, seq)
                for part, seq, attempt, lease_id, receipt in self.again])
        for source, (seqs, token) in self.relet.items():
            part, row = self.expired[source]
            _lease_again(conn, group_id, part, row, seqs[-1], len(seqs), token, deadline,
                         consumer_id)
        if self.fresh:
            conn.executemany(sql.INSERT_RANGE, [
                (group_id, part, first, last, first, token, 1, deadline, consumer_id,
                 "0" * (last - first + 1), last - first + 1)
                for part, first, last, token in self.fresh])
            conn.executemany(sql.SET_CURSOR,
                             [(last, group_id, part) for part, _, last, _ in self.fresh])

    def leases(self, conn: sqlite3.Connection, stream: str, group: str, consumer_id: str,
               path: str, issued: IssuedRuns) -> list[Lease] | FreshRange:
        """The stored leases with their events, in the order picked."""
        if not self.again and not self.relet and len(self.fresh) == 1:
            return self._fresh_leases(conn, stream, group, consumer_id, path, issued)
        again: dict[int, list[int]] = {}
        for part, seq, *_ in self.again:
            again.setdefault(part, []).append(seq)
        for source, (seqs, _) in self.relet.items():
            again.setdefault(self.expired[source][0], []).extend(seqs)
        for seqs in again.values():
            seqs.sort()
        events = load_events(conn, self.progress.stream_id, stream,
                             {part: (first, last) for part, first, last, _ in self.fresh}, again)
        if len(events) != len(self.order):  # events up to the high water are never removed
            raise BackendError(f"SQLite database {path!r}: events of stream {stream!r} "
                               f"leased by a fetch are missing")
        made: dict[tuple[int, int], Lease] = {}
        deadline = self.deadline
        for part, seq, attempt, lease_id, receipt in self.again:
            made[(part, seq)] = make_lease(lease_id, receipt, group, consumer_id,
                                           events[(part, seq)], attempt, deadline)
        for source, (seqs, token) in self.relet.items():
            part, (first, *_, attempt, _, _, _, _) = self.expired[source]
            for seq in seqs:
                made[(part, seq)] = make_lease(f"{token}{seq - first:08x}",
                                               f"{part}-{seq}-{attempt + 1}", group,
                                               consumer_id, events[(part, seq)], attempt + 1,
                                               deadline)
        for part, first, last, token in self.fresh:
            for seq in range(first, last + 1):
                made[(part, seq)] = make_lease(f"{token}{seq - first:08x}", f"{part}-{seq}-1",
                                               group, consumer_id, events[(part, seq)], 1,
                                               deadline)
        if len(self.ids) == 1 and not (self.again and self.relet):
            return list(made.values())  # again, then new ones: the order picked
        return [made[self._position(i, depth)] for i, depth in self.order]

    def _fresh_leases(self, conn: sqlite3.Connection, stream: str, group: str,
                      consumer_id: str, path: str, issued: IssuedRuns) -> FreshRange:
        """The rows of one new range (the common fetch), its leases still to build."""
        part, first, last, token = self.fresh[0]
        rows = conn.execute(
            sql.EVENTS_BETWEEN, (self.progress.stream_id, part, first, last)).fetchall()
        if len(rows) != last - first + 1:  # events up to the high water are never removed
            raise BackendError(f"SQLite database {path!r}: events {first}..{last} of "
                               f"partition {part} of stream {stream!r} are missing")
        return FreshRange(rows, stream, group, consumer_id, part, first, token, self.deadline,
                          issued)

    def _position(self, i: int, depth: int) -> tuple[int, int]:
        """The (partition, sequence) of the candidate at ``depth`` of partition ``ids[i]``."""
        found, part = self.existing[i], self.ids[i]
        if depth < len(found):
            return part, found[depth][0]
        return part, self.progress.cursors[part][0] + depth - len(found) + 1


def _lease_again(conn: sqlite3.Connection, group_id: int, part: int, row: RangeRow, cut: int,
                 taken: int, token: str, deadline: int, consumer_id: str) -> None:
    """Lease an expired range again up to ``cut`` (its ``taken`` events in flight there)
    under ``token``, one attempt later.

    A range the fetch limit cut keeps its tail, with its old token, attempt and
    deadline, as a range of its own. The acked events of the part leased again
    keep their old lease as acked delivery rows, so that their acks still repeat
    as acks.
    """
    first, last, base, old_token, attempt, old_deadline, old_consumer, done, pending = row
    if taken < pending:
        conn.execute(sql.INSERT_RANGE, (
            group_id, part, cut + 1, last, base, old_token, attempt, old_deadline, old_consumer,
            done[cut - first + 1:], pending - taken))
    else:
        cut = last
    head = done[:cut - first + 1]
    kept: list[tuple[Any, ...]] = []
    at = head.find("1")
    while at >= 0:
        seq = first + at
        kept.append((group_id, part, seq, "acked", attempt, f"{old_token}{seq - base:08x}",
                     f"{part}-{seq}-{attempt}", old_consumer, old_deadline, 0, "ack", "", 0,
                     None))
        at = head.find("1", at + 1)
    if kept:
        conn.executemany(sql.KEEP_ACKED, kept)
    conn.execute(sql.LEASE_RANGE_AGAIN, (cut, head, taken, token, attempt + 1, deadline,
                                         consumer_id, group_id, part, first))
