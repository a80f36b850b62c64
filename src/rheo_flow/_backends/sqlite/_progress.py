"""Where a group stands: its frontier and dead letters, and what moves it back.

The frontier is stored per (group, partition) and only ever advanced from its
stored value (:func:`advance_frontier`), never recomputed by counting acked
rows. Redrive, replay and reset move it back with the deliveries they reopen or
forget.
"""

from __future__ import annotations

import sqlite3

from ..._model._stream import DeadLetter, StartPosition
from ..._support._clock import Clock
from .._shared import start_position
from . import _sql as sql
from ._catalog import get_group, list_groups, waters

__all__ = ["advance_frontier", "dead_letters", "frontier", "redrive", "release_keys", "replay",
           "reset"]


def advance_frontier(conn: sqlite3.Connection, group_id: int, part: int) -> None:
    """Move the stored frontier up to the first pending delivery, or to the cursor.

    Every sequence up to the cursor has a delivery row or a range holding it
    (fetch creates them in order; replay, reset and trim move the cursor with
    what they delete), so the settled run after the frontier ends right before
    the lowest available or leased row or the first event in flight of the
    lowest open range: one probe of each partial index, whatever the acked history.
    """
    conn.execute(sql.ADVANCE_FRONTIER, (group_id, part))


def release_keys(conn: sqlite3.Connection, settled: list[tuple[int, int, int]]) -> None:
    """After deliveries (group id, partition, sequence) of key-ordered groups were
    settled for good: make the next delivery of each one's key eligible if fetch
    stored it blocked behind them."""
    partitions = {(group_id, part) for group_id, part, _ in settled}
    blocked = {gp for gp in partitions if conn.execute(sql.HAS_BLOCKED, gp).fetchone()}
    if blocked:
        conn.executemany(sql.RELEASE_KEY, [s for s in settled if (s[0], s[1]) in blocked])


def frontier(conn: sqlite3.Connection, stream: str, group: str) -> dict[int, int]:
    """Every partition's frontier."""
    g = get_group(conn, stream, group)
    return dict(conn.execute(sql.FRONTIERS, (g.id,)).fetchall())


def frontiers(conn: sqlite3.Connection, stream: str) -> dict[str, dict[int, int]]:
    """Every group's frontier, by group name, in one read."""
    return {info.group: frontier(conn, stream, info.group)
            for info in list_groups(conn, stream, 0)}


def dead_letters(conn: sqlite3.Connection, stream: str, group: str, limit: int,
                 after: tuple[int, int] | None) -> list[DeadLetter]:
    """Up to ``limit`` dead letters after the position ``after``, in position order."""
    g = get_group(conn, stream, group)
    part, seq = after if after is not None else (-1, -1)
    return [DeadLetter(stream, group, *row)
            for row in conn.execute(sql.DEAD_LETTERS, (g.stream.id, g.id, part, seq, limit))]


def redrive(conn: sqlite3.Connection, clock: Clock, stream: str, group: str,
            positions: list[tuple[int, int]] | None) -> int:
    """Make the dead letters (all, or those at ``positions``) deliverable again, attempt 0."""
    g = get_group(conn, stream, group)
    now = clock()
    if positions is None:
        count = conn.execute(sql.REDRIVE, (now, g.id, g.stream.id)).rowcount
    else:
        count = conn.executemany(
            sql.REDRIVE_AT, [(now, g.id, g.stream.id, part, seq) for part, seq in positions]
        ).rowcount
    if count:
        conn.execute(sql.FRONTIER_BEFORE_PENDING, (g.id,))
    return count


def replay(conn: sqlite3.Connection, stream: str, group: str, from_sequence: int,
           partitions: list[int]) -> None:
    """Forget the deliveries from ``from_sequence`` on: they are delivered again."""
    g = get_group(conn, stream, group)
    low = {part: low for part, (_, low) in waters(conn, g.stream.id).items()}
    # Trimmed events are gone and count as settled: replay starts at the low water.
    starts = [(part, max(from_sequence, low[part])) for part in partitions]
    # Deleting a delivery fences its lease; it is materialised again, attempt 1.
    forgotten = [(g.id, part, start) for part, start in starts]
    conn.executemany(sql.DELETE_DELIVERIES_FROM, forgotten)
    conn.executemany(sql.DELETE_RANGES_FROM, forgotten)
    conn.executemany(sql.CUT_RANGES_FROM, forgotten)
    conn.executemany(sql.REWIND, [(start - 1, start - 1, g.id, part) for part, start in starts])


def reset(conn: sqlite3.Connection, stream: str, group: str, to: StartPosition,
          partitions: list[int]) -> None:
    """Forget every delivery of ``partitions`` and start them at ``to``."""
    g = get_group(conn, stream, group)
    found = waters(conn, g.stream.id)
    conn.executemany(sql.DELETE_PARTITION_DELIVERIES, [(g.id, part) for part in partitions])
    conn.executemany(sql.DELETE_PARTITION_RANGES, [(g.id, part) for part in partitions])
    moves = []
    for part in partitions:
        position = start_position(to, *found[part])
        moves.append((position, position, g.id, part))
    conn.executemany(sql.MOVE_TO, moves)
