"""Fetch of a key-ordered group: a delivery of key K is leased only once every earlier
delivery of K in its partition is settled (docs/ordering.md).

Such a group's delivery rows carry their event's key. Existing deliveries come
from the partial index of unsettled rows, each kept only when no earlier
unsettled row of its key exists (one probe of ``deliveries_keyed``); new
sequences past the cursor are read with their keys and either leased or stored
*blocked*: available, attempt 0, ``available_at_ms`` 2**62, so later scans pass
over them on the time test alone. The triggers of ``schema.sql`` make the next
blocked delivery of a key eligible when an earlier one leaves the unsettled
rows (settled for good, or removed), so a fetch never reads settled history.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Final

from ..._lease import Lease, make_lease
from .._shared import round_robin
from .._transitions import Settled, expire
from . import _sql as sql
from ._events import load_events
from ._progress import advance_frontier

__all__ = ["BLOCKED_MS", "KeyedFetch"]

BLOCKED_MS: Final = 2**62
"""``available_at_ms`` of a delivery stored behind an earlier one of its key."""
SCAN_CHUNK: Final = 256
"""Events past the cursor read per statement while looking for unblocked keys."""


@dataclass(slots=True)
class _Partition:
    """One partition's candidates: existing (seq, attempt), then new sequences."""

    part: int
    cursor: int
    existing: list[tuple[int, int]] = field(default_factory=list)
    fresh: list[int] = field(default_factory=list)
    """New sequences that may be leased, in order."""
    scanned: list[tuple[int, str | None]] = field(default_factory=list)
    """Every event read past the cursor (seq, key), in order."""

    def position(self, depth: int) -> tuple[int, int, int]:
        """(sequence, attempt before, 1 if new else 0) of the candidate at ``depth``."""
        if depth < len(self.existing):
            seq, attempt = self.existing[depth]
            return seq, attempt, 0
        return self.fresh[depth - len(self.existing)], 0, 1


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
        parts = [self._candidates(part, *cursors[part], expired) for part in ids]
        order = round_robin([len(p.existing) + len(p.fresh) for p in parts], self.limit)
        picked = [(parts[i], *parts[i].position(depth)) for i, depth in order]
        deadline = self.now + lease_ms
        prefix = os.urandom(12).hex()
        made = [(p.part, seq, attempt + 1, f"{prefix}{n:08x}", f"{p.part}-{seq}-{attempt + 1}",
                 new) for n, (p, seq, attempt, new) in enumerate(picked)]
        self._write(parts, made, consumer_id, deadline)
        if expired:  # after the writes: the triggers unblock what they stored behind them
            self.conn.executemany(sql.EXPIRE, [
                (s.state, s.reason, s.settled_by, s.rejected_at_ms, self.group_id, part, seq)
                for s, part, seq in expired])
            for part in sorted({part for _, part, _ in expired}):
                advance_frontier(self.conn, self.group_id, part)
        wanted: dict[int, list[int]] = {}
        for part, seq, *_ in made:
            wanted.setdefault(part, []).append(seq)
        for seqs in wanted.values():
            seqs.sort()
        events = load_events(self.conn, self.stream_id, stream, {}, wanted)
        return [make_lease(lease_id, receipt, group, consumer_id, events[(part, seq)],
                           attempt, deadline)
                for part, seq, attempt, lease_id, receipt, _ in made]

    def _candidates(self, part: int, cursor: int, high: int,
                    expired: list[tuple[Settled, int, int]]) -> _Partition:
        """The partition's eligible deliveries (expiries at max attempts to ``expired``),
        then new sequences of keys not blocked, up to ``limit`` in all."""
        p = _Partition(part, cursor)
        cur = self.conn.execute(sql.ELIGIBLE_BY_KEY, (self.group_id, part, self.now))
        try:
            for seq, attempt in cur:
                if len(p.existing) >= self.limit:
                    break
                dead = expire(attempt, self.max_attempts, self.now)
                if dead is not None:
                    expired.append((dead, part, seq))
                else:
                    p.existing.append((seq, attempt))
        finally:
            cur.close()
        self._scan_new(p, high)
        return p

    def _scan_new(self, p: _Partition, high: int) -> None:
        """Read events past the cursor until enough are free to lease (or none is left)."""
        taken: set[str] = set()
        """Keys blocked for the rest of the scan: unsettled, or taken by this fetch."""
        free: set[str] = set()
        last = p.cursor
        while len(p.existing) + len(p.fresh) < self.limit and last < high:
            rows = self.conn.execute(sql.EVENT_KEYS_AFTER,
                                     (self.stream_id, p.part, last, SCAN_CHUNK)).fetchall()
            if not rows:
                break
            for seq, key in rows:
                if len(p.existing) + len(p.fresh) >= self.limit:
                    break
                p.scanned.append((seq, key))
                last = seq
                if key is None:
                    p.fresh.append(seq)
                    continue
                if key not in taken and key not in free:
                    unsettled = self.conn.execute(
                        sql.KEY_UNSETTLED, (self.group_id, p.part, key)).fetchone()
                    (taken if unsettled is not None else free).add(key)
                if key in free:
                    free.discard(key)
                    taken.add(key)
                    p.fresh.append(seq)

    def _write(self, parts: list[_Partition], made: list[tuple[int, int, int, str, str, int]],
               consumer_id: str, deadline: int) -> None:
        """Store the leases; new rows up to the last new one leased (blocked ones
        between), and the cursors after them."""
        again = [(attempt, lease_id, receipt, consumer_id, deadline, self.group_id, part, seq)
                 for part, seq, attempt, lease_id, receipt, new in made if not new]
        if again:
            self.conn.executemany(sql.LEASE_AGAIN, again)
        leased = {(part, seq): (lease_id, receipt)
                  for part, seq, _, lease_id, receipt, new in made if new}
        rows: list[tuple[object, ...]] = []
        cursors: list[tuple[int, int, int]] = []
        for p in parts:
            taken = [seq for seq in p.fresh if (p.part, seq) in leased]
            # Up to the first candidate not leased: the rows below it are blocked ones.
            skipped = p.fresh[len(taken)] if len(taken) < len(p.fresh) else None
            end = p.scanned[-1][0] if skipped is None and p.scanned else (
                p.cursor if skipped is None else skipped - 1)
            for seq, key in p.scanned:
                if seq > end:
                    break
                lease = leased.get((p.part, seq))
                if lease is None:
                    rows.append((self.group_id, p.part, seq, "available", 0, None, None, None,
                                 0, BLOCKED_MS, key))
                else:
                    rows.append((self.group_id, p.part, seq, "leased", 1, *lease, consumer_id,
                                 deadline, 0, key))
            if end > p.cursor:
                cursors.append((end, self.group_id, p.part))
        if rows:
            self.conn.executemany(sql.LEASE_NEW_KEYED, rows)
        if cursors:
            self.conn.executemany(sql.SET_CURSOR, cursors)
