"""Fetch of a key-ordered group: a delivery of key K is leased only once every earlier
delivery of K in its partition is settled (docs/ordering.md).

Such a group's delivery rows carry their event's key. Existing deliveries come
from the index of unsettled rows by due time (only the due ones are read), each
kept only when no earlier unsettled row of its key exists (one probe of
``deliveries_keyed``); new sequences past the cursor are read with their keys
and whether each key has an unsettled delivery (the same probe, in the same
statement), and either leased or stored *blocked*: available, attempt 0,
``available_at_ms`` 2**62, so they are never due and later scans never read
them. Only the partitions with work are visited (:mod:`._fetch`). The statements
that settle a delivery for good make the next blocked one of its key eligible
(``_progress.release_keys``; a trim releases the heads it uncovers), so a fetch
never reads settled history.

Partitions are read lazily while the batch is taken round-robin: each first
reads its share of the batch past its cursor, and reads more (in growing
chunks) only when the others cannot fill the batch, so a fetch reads and probes
about as many events as it leases.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Final

from ..._model._lease import Lease, make_lease
from .._transitions import Settled, expire
from . import _sql as sql
from ._events import load_events
from ._progress import advance_frontier, release_keys

__all__ = ["BLOCKED_MS", "KeyedFetch"]

BLOCKED_MS: Final = 2**62
"""``available_at_ms`` of a delivery stored behind an earlier one of its key."""
SCAN_CHUNK: Final = 256
"""The most events past the cursor read per statement while looking for free keys."""

Made = tuple[int, int, int, str, str, int]
"""A lease of the fetch: part, seq, attempt, lease id, receipt, 1 if new else 0."""


@dataclass(slots=True)
class _Partition:
    """One partition's candidates: existing (seq, attempt), then new sequences."""

    part: int
    cursor: int
    high: int
    chunk: int
    """How many events the next read past the cursor asks for at least."""
    existing: list[tuple[int, int]] = field(default_factory=list)
    """Eligible deliveries (seq, attempt), the soonest due first."""
    fresh: list[int] = field(default_factory=list)
    """New sequences that may be leased, in order."""
    seen: set[str] = field(default_factory=set)
    """Keys read so far: blocked for the rest of the scan (unsettled, or taken by it)."""
    last: int = 0
    """The highest sequence read past the cursor (the cursor before any)."""


@dataclass(slots=True)
class KeyedFetch:
    """One fetch of a key-ordered group, run in the backend thread in its transaction."""

    conn: sqlite3.Connection
    group_id: int
    max_attempts: int
    stream_id: int
    now: int
    limit: int

    def run(self, stream: str, group: str, consumer_id: str, lease_ms: int,
            cursors: dict[int, tuple[int, int]], ids: list[int]) -> list[Lease]:
        """Lease up to ``limit`` deliveries of partitions ``ids`` (already rotated)."""
        expired: list[tuple[Settled, int, int]] = []
        share = -(-self.limit // len(ids))
        parts = [self._existing(_Partition(part, *cursors[part], share), expired)
                 for part in ids]
        picked = _in_sequence(self._pick(parts))
        deadline = self.now + lease_ms
        made = self._write(parts, picked, consumer_id, deadline)
        if expired:  # after the writes, so that the releases see what they stored
            self.conn.executemany(sql.EXPIRE, [
                (s.state, s.reason, s.settled_by, s.rejected_at_ms, self.group_id, part, seq)
                for s, part, seq in expired])
            release_keys(self.conn, [(self.group_id, part, seq) for _, part, seq in expired])
            for part in sorted({part for _, part, _ in expired}):
                advance_frontier(self.conn, self.group_id, part)
        events = load_events(self.conn, self.stream_id, stream, *_wanted(made))
        return [make_lease(lease_id, receipt, group, consumer_id, events[(part, seq)],
                           attempt, deadline)
                for part, seq, attempt, lease_id, receipt, _ in made]

    def _existing(self, p: _Partition, expired: list[tuple[Settled, int, int]]) -> _Partition:
        """Fill in the partition's eligible deliveries (expiries at max attempts go to
        ``expired``), up to ``limit``: the soonest due when more are."""
        p.last = p.cursor
        cur = self.conn.execute(sql.ELIGIBLE_BY_KEY, (self.group_id, p.part, self.now))
        try:
            for seq, attempt in cur:
                if len(p.existing) >= self.limit:
                    break
                dead = expire(attempt, self.max_attempts, self.now)
                if dead is not None:
                    expired.append((dead, p.part, seq))
                else:
                    p.existing.append((seq, attempt))
        finally:
            cur.close()
        return p

    def _pick(self, parts: list[_Partition]) -> list[tuple[_Partition, int, int, int]]:
        """Up to ``limit`` candidates round-robin across ``parts``, one per partition per
        round, as (partition, sequence, attempt before, 1 if new else 0)."""
        picked: list[tuple[_Partition, int, int, int]] = []
        active, depth = parts, 0
        while active and len(picked) < self.limit:
            still = []
            for p in active:
                if len(picked) >= self.limit:
                    break
                if depth < len(p.existing):
                    picked.append((p, *p.existing[depth], 0))
                elif self._offers(p, depth):
                    picked.append((p, p.fresh[depth - len(p.existing)], 0, 1))
                else:
                    continue
                still.append(p)
            active, depth = still, depth + 1
        return picked

    def _offers(self, p: _Partition, depth: int) -> bool:
        """Whether ``p`` has a candidate at ``depth``, reading past the cursor as needed."""
        while depth >= len(p.existing) + len(p.fresh) and p.last < p.high:
            self._scan(p, depth + 1 - len(p.existing) - len(p.fresh))
        return depth < len(p.existing) + len(p.fresh)

    def _scan(self, p: _Partition, wanted: int) -> None:
        """Read the next events past what ``p`` read, at least ``wanted`` (chunks grow)."""
        size = min(max(wanted, p.chunk), SCAN_CHUNK)
        p.chunk = min(2 * size, SCAN_CHUNK)
        rows = self.conn.execute(sql.EVENT_KEYS_AFTER, (
            self.group_id, p.part, self.stream_id, p.last, size, self.now)).fetchall()
        if not rows:  # events past the cursor are never removed; stop all the same
            p.high = p.last
            return
        seen = p.seen
        for seq, key, unsettled, later in rows:
            if later:  # scheduled: stored available at its time, holding its key
                if key is not None:
                    seen.add(key)
            elif key is None:
                p.fresh.append(seq)
            elif key not in seen:
                seen.add(key)
                if not unsettled:
                    p.fresh.append(seq)
        p.last = rows[-1][0]

    def _write(self, parts: list[_Partition], picked: list[tuple[_Partition, int, int, int]],
               consumer_id: str, deadline: int) -> list[Made]:
        """Store the leases: existing rows leased again; new rows up to the last new one
        leased, by runs of sequences, with the blocked ones between; the cursors after
        them. Returns the leases in the order picked."""
        prefix = os.urandom(12).hex()
        numbers: dict[tuple[int, int], int] = {}
        for p, seq, _, new in picked:  # existing ones first, then each run in a row
            if not new:
                numbers[(p.part, seq)] = len(numbers)
        taken = {p.part: 0 for p in parts}
        for p, _, _, new in picked:
            taken[p.part] += new
        runs = [(p, *run) for p in parts for run in _runs(p.fresh[:taken[p.part]])]
        for p, first, last in runs:
            base = len(numbers)
            numbers.update(((p.part, seq), base + seq - first) for seq in range(first, last + 1))
        made: list[Made] = [
            (p.part, seq, attempt + 1, f"{prefix}{numbers[(p.part, seq)]:08x}",
             f"{p.part}-{seq}-{attempt + 1}", new) for p, seq, attempt, new in picked]
        again = [(attempt, lease_id, receipt, consumer_id, deadline, self.group_id, part, seq)
                 for part, seq, attempt, lease_id, receipt, new in made if not new]
        if again:
            self.conn.executemany(sql.LEASE_AGAIN, again)
        for p, first, last in runs:
            # The lease id and receipt are built by SQLite exactly as in ``made``.
            self.conn.execute(sql.LEASE_NEW_KEYED, (
                self.group_id, prefix, first, numbers[(p.part, first)], consumer_id, deadline,
                self.stream_id, p.part, last))
        cursors: list[tuple[int, int, int]] = []
        for p in parts:
            count = taken[p.part]
            # Up to the first candidate not leased: the rows below it are blocked ones.
            end = p.fresh[count] - 1 if count < len(p.fresh) else p.last
            if end - p.cursor > count:
                self.conn.execute(sql.STORE_BLOCKED, (
                    self.group_id, p.part, p.cursor + 1, end, self.stream_id, self.now))
            if end > p.cursor:
                cursors.append((end, self.group_id, p.part))
        if cursors:
            self.conn.executemany(sql.SET_CURSOR, cursors)
        return made


def _in_sequence(picked: list[tuple[_Partition, int, int, int]],
                 ) -> list[tuple[_Partition, int, int, int]]:
    """``picked`` with each partition's existing deliveries (picked soonest due first)
    in sequence order, in the places they were picked in; new ones follow them."""
    existing: dict[int, list[tuple[int, int]]] = {}
    for p, seq, attempt, new in picked:
        if not new:
            existing.setdefault(p.part, []).append((seq, attempt))
    ordered = {part: iter(sorted(found)) for part, found in existing.items()}
    return [pick if pick[3] else (pick[0], *next(ordered[pick[0].part]), 0) for pick in picked]


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    """The runs of consecutive sequences of the sorted ``seqs``, as (first, last)."""
    runs: list[tuple[int, int]] = []
    for seq in seqs:
        if runs and runs[-1][1] == seq - 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


def _wanted(made: list[Made]) -> tuple[dict[int, tuple[int, int]], dict[int, list[int]]]:
    """What :func:`load_events` reads for ``made``: per partition one range of its new
    sequences when they are contiguous (the usual batch), else sorted IN lists."""
    fresh: dict[int, list[int]] = {}
    again: dict[int, list[int]] = {}
    for part, seq, *_, new in made:
        (fresh if new else again).setdefault(part, []).append(seq)
    ranges: dict[int, tuple[int, int]] = {}
    for part, seqs in fresh.items():  # picked in sequence order
        if seqs[-1] - seqs[0] + 1 == len(seqs):
            ranges[part] = (seqs[0], seqs[-1])
        else:
            again.setdefault(part, []).extend(seqs)
    for seqs in again.values():
        seqs.sort()
    return ranges, again
