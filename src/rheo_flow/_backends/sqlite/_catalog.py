"""Streams and groups: their rows looked up by name, and the operations on them.

Every function runs in the backend thread inside the operation's transaction
(``conn`` is the backend's connection); ``clock`` gives creation times.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from ..._backend import DEFAULT_MAX_ATTEMPTS
from ..._model._errors import ConflictError, UnknownGroup, UnknownStream
from ..._model._stream import GroupInfo, Retention, StartPosition, StreamInfo, paused_state
from ..._model._validation import ordering_mismatch
from ..._support._clock import Clock
from .._shared import start_position
from . import _sql as sql

__all__ = [
    "Group",
    "Stream",
    "create_group",
    "create_stream",
    "delete_group",
    "delete_stream",
    "find_group",
    "find_stream",
    "get_group",
    "get_stream",
    "list_groups",
    "list_streams",
    "pause_group",
    "set_retention",
    "stream_info",
    "waters",
]


@dataclass(slots=True)
class Stream:
    """A row of ``streams``."""

    id: int
    name: str
    partitions: int
    created_at_ms: int
    retention_max_age_ms: int | None = None
    retention_max_events: int | None = None


@dataclass(slots=True)
class Group:
    """A row of ``groups``, with its stream's."""

    id: int
    stream: Stream
    name: str
    max_attempts: int
    created_at_ms: int
    ordering: str = "none"
    paused_until_ms: int = 0

    def info(self, now: int) -> GroupInfo:
        """The group as the contract describes it, paused or not at ``now``."""
        return GroupInfo(self.stream.name, self.name, self.max_attempts, self.created_at_ms,
                         self.ordering, *paused_state(self.paused_until_ms, now))


def find_stream(conn: sqlite3.Connection, name: str) -> Stream | None:
    """The stream named ``name``, or ``None``."""
    row = conn.execute(sql.FIND_STREAM, (name,)).fetchone()
    return None if row is None else Stream(*row)


def get_stream(conn: sqlite3.Connection, name: str) -> Stream:
    """The stream named ``name``; :class:`~rheo_flow.UnknownStream` if there is none."""
    s = find_stream(conn, name)
    if s is None:
        raise UnknownStream(name)
    return s


def find_group(conn: sqlite3.Connection, s: Stream, name: str) -> Group | None:
    """The group ``name`` of stream ``s``, or ``None``."""
    row = conn.execute(sql.FIND_GROUP, (s.id, name)).fetchone()
    return None if row is None else Group(row[0], s, name, *row[1:])


def get_group(conn: sqlite3.Connection, stream: str, name: str) -> Group:
    """The group, in one statement; UnknownStream or UnknownGroup names what is missing."""
    row = conn.execute(sql.GROUP_OF_STREAM, (name, stream)).fetchone()
    if row is None:
        raise UnknownStream(stream)
    if row[3] is None:
        raise UnknownGroup(stream, name)
    return Group(row[3], Stream(row[0], stream, row[1], row[2]), name, *row[4:])


def waters(conn: sqlite3.Connection, stream_id: int) -> dict[int, tuple[int, int]]:
    """Every partition's high and low water, by partition."""
    return {part: (high, low) for part, high, low in conn.execute(sql.WATERS, (stream_id,))}


def stream_info(conn: sqlite3.Connection, s: Stream) -> StreamInfo:
    """The stream as the contract describes it."""
    found = waters(conn, s.id)
    return StreamInfo(s.name, s.partitions, s.created_at_ms,
                      {part: high for part, (high, _) in found.items()},
                      {part: low for part, (_, low) in found.items()},
                      Retention.from_ms(s.retention_max_age_ms, s.retention_max_events))


def set_retention(conn: sqlite3.Connection, stream: str, retention: Retention | None) -> None:
    """Store the stream's retention policy (``None``: none)."""
    s = get_stream(conn, stream)
    conn.execute(sql.SET_RETENTION, (
        None if retention is None else retention.max_age_ms,
        None if retention is None else retention.max_events, s.id))


def create_stream(conn: sqlite3.Connection, clock: Clock, name: str,
                  partitions: int) -> StreamInfo:
    """Create the stream, or return it when it exists with as many partitions."""
    existing = find_stream(conn, name)
    if existing is not None:
        if existing.partitions != partitions:
            raise ConflictError(
                f"stream {name!r} exists with {existing.partitions} partitions, "
                f"not {partitions}"
            )
        return stream_info(conn, existing)
    now = clock()
    stream_id = _inserted_id(conn.execute(sql.INSERT_STREAM, (name, partitions, now)))
    conn.executemany(sql.INSERT_PARTITION, [(stream_id, p) for p in range(partitions)])
    return stream_info(conn, Stream(stream_id, name, partitions, now))


def _inserted_id(cursor: sqlite3.Cursor) -> int:
    """The rowid an INSERT just stored (sqlite3 types it as optional)."""
    if cursor.lastrowid is None:
        raise sqlite3.DatabaseError("an INSERT reported no row id")
    return cursor.lastrowid


def list_streams(conn: sqlite3.Connection) -> list[str]:
    """Every stream's name, sorted."""
    return [r[0] for r in conn.execute(sql.LIST_STREAMS)]


def create_group(
    conn: sqlite3.Connection,
    clock: Clock,
    stream: str,
    group: str,
    start: StartPosition,
    max_attempts: int | None,
    ordering: str = "none",
) -> GroupInfo:
    """Create the group at ``start``, or return it (with ``max_attempts`` changed if given).

    ``ordering`` applies at creation; ``"key"`` for an existing group without it is an
    InvalidArgument."""
    s = get_stream(conn, stream)
    g = find_group(conn, s, group)
    if g is not None:
        if ordering == "key" and g.ordering != "key":
            raise ordering_mismatch(stream, group, g.ordering, ordering)
        if max_attempts is not None and max_attempts != g.max_attempts:
            conn.execute(sql.SET_MAX_ATTEMPTS, (max_attempts, g.id))
            g.max_attempts = max_attempts
        return g.info(clock())
    now = clock()
    attempts = max_attempts or DEFAULT_MAX_ATTEMPTS
    ordering = "key" if ordering == "key" else "none"
    group_id = _inserted_id(conn.execute(sql.INSERT_GROUP, (s.id, group, attempts, now, ordering)))
    rows = []
    for part, (high, low) in waters(conn, s.id).items():
        position = start_position(start, high, low)
        rows.append((group_id, part, position, position, high))
    conn.executemany(sql.INSERT_GROUP_PARTITION, rows)
    return GroupInfo(stream, group, attempts, now, ordering)


def list_groups(conn: sqlite3.Connection, stream: str, now: int) -> list[GroupInfo]:
    """Every group of the stream, sorted by name, paused or not at ``now``."""
    s = get_stream(conn, stream)
    return [GroupInfo(stream, name, max_attempts, created, ordering,
                      *paused_state(paused_until, now))
            for name, max_attempts, created, ordering, paused_until
            in conn.execute(sql.LIST_GROUPS, (s.id,))]


def describe_streams(conn: sqlite3.Connection, now: int
                     ) -> list[tuple[StreamInfo, list[GroupInfo]]]:
    """Every stream's info and groups, by name, in one read (one hop to the reader)."""
    return [(stream_info(conn, get_stream(conn, name)), list_groups(conn, name, now))
            for name in list_streams(conn)]


def pause_group(conn: sqlite3.Connection, stream: str, group: str, until: int,
                now: int) -> GroupInfo:
    """Store the end of the group's pause (0: none), and return the group."""
    g = get_group(conn, stream, group)
    conn.execute(sql.SET_GROUP_PAUSE, (until, g.id))
    g.paused_until_ms = until
    return g.info(now)


def delete_stream(conn: sqlite3.Connection, stream: str) -> None:
    """Delete the stream, its events and its groups."""
    s = get_stream(conn, stream)
    for group_id, _ in conn.execute(sql.GROUP_IDS, (s.id,)).fetchall():
        _delete_group_rows(conn, group_id)
    for statement in (sql.DELETE_STREAM_EVENTS, sql.DELETE_STREAM_PARTITIONS, sql.DELETE_STREAM):
        conn.execute(statement, (s.id,))


def delete_group(conn: sqlite3.Connection, stream: str, group: str) -> None:
    """Delete the group and its deliveries."""
    _delete_group_rows(conn, get_group(conn, stream, group).id)


def _delete_group_rows(conn: sqlite3.Connection, group_id: int) -> None:
    """Delete every row of the group: its deliveries, progress and the group itself."""
    for statement in sql.DELETE_GROUP:
        conn.execute(statement, (group_id,))
