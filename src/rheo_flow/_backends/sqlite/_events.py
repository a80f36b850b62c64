"""Events: appending (idempotent by event id), reading them back, and trimming.

Events keep their stored JSON text and decode ``data`` on first access. An
append inserts the whole batch with one ``executemany``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from ..._backend import AppendRecord
from ..._model._event import Event, decode_json, make_event_json
from ..._model._query import Query
from ..._support._clock import Clock
from .._shared import query_window
from . import _sql as sql
from ._catalog import Stream, get_stream, waters
from ._progress import advance_frontier

__all__ = ["append", "decode", "load_events", "query", "trim"]


def decode(stream: str, rows: list[tuple[Any, ...]]) -> list[Event]:
    """Events of ``rows`` (``event_columns`` of statements.sql), decoding ``data`` on first
    access."""
    return [
        make_event_json(stream, part, seq, event_id, type_, data, key,
                        decode_json(headers) if headers else {}, appended_at_ms)
        for part, seq, event_id, type_, key, data, headers, appended_at_ms in rows
    ]


def load_events(
    conn: sqlite3.Connection,
    stream_id: int,
    stream: str,
    fresh: dict[int, tuple[int, int]],
    again: dict[int, list[int]],
) -> dict[tuple[int, int], Event]:
    """The events of a fetch's leases by (partition, sequence): one range per partition
    for new deliveries (``fresh``, always contiguous), IN lists for the sorted
    sequences of redeliveries (``again``)."""
    rows: list[tuple[Any, ...]] = []
    for part, (first, last) in fresh.items():
        rows.extend(conn.execute(sql.EVENTS_BETWEEN, (stream_id, part, first, last)))
    for part, seqs in again.items():
        for statement, params in sql.in_lists(sql.EVENTS_BY_SEQUENCE, (stream_id, part), seqs):
            rows.extend(conn.execute(statement, params))
    return {(event.partition, event.sequence): event for event in decode(stream, rows)}


def append(conn: sqlite3.Connection, clock: Clock, stream: str,
           records: list[AppendRecord]) -> list[Event]:
    """Append ``records``; an id the stream holds already returns its stored event."""
    s = get_stream(conn, stream)
    if not records:
        return []
    now = clock()
    high: dict[int, int] = dict(conn.execute(sql.HIGH_WATERS, (s.id,)).fetchall())
    if len({r.id for r in records}) == len(records):
        # Usually no id is stored yet: insert the batch as it is, skipping ids the
        # unique (stream, event id) index already holds. If one was skipped, the
        # batch's rows are removed and it is redone knowing the stored events.
        events = _insert(conn, s, records, now, dict(high), {}, optimistic=True)
        if events is not None:
            return events
    rows: list[tuple[Any, ...]] = []
    for statement, params in sql.in_lists(
        sql.EVENTS_BY_ID, (s.id,), list({r.id for r in records})
    ):
        rows.extend(conn.execute(statement, params))
    known = {event.id: event for event in decode(stream, rows)}
    events = _insert(conn, s, records, now, high, known)
    if events is None:  # only an optimistic insert is undone: this one knows every stored id
        raise sqlite3.DatabaseError("append: an insert knowing every stored id was undone")
    return events


def _insert(
    conn: sqlite3.Connection,
    s: Stream,
    records: list[AppendRecord],
    now: int,
    high: dict[int, int],
    known: dict[str, Event],
    *,
    optimistic: bool = False,
) -> list[Event] | None:
    """Insert the records whose id is not in ``known`` with the next sequences of
    their partitions (``high``: the high waters, updated); the stored events in order.

    ``optimistic``: ``known`` may miss stored ids. When one turns up, nothing stays
    inserted and ``None`` is returned.
    """
    start = dict(high) if optimistic else high
    out: list[Event] = []
    rows: list[tuple[Any, ...]] = []
    for r in records:
        existing = known.get(r.id)
        if existing is not None:
            out.append(existing)
            continue
        part = r.partition
        seq = high[part] + 1
        high[part] = seq
        headers = dict(r.headers) if r.headers else {}
        event = make_event_json(s.name, part, seq, r.id, r.type, r.data_json, r.key, headers, now)
        known[r.id] = event
        out.append(event)
        rows.append((
            s.id, part, seq, r.id, r.type, r.key, r.data_json,
            orjson.dumps(headers).decode() if headers else None, now, r.deliver_at_ms,
        ))
    if not rows:
        return out
    if any(row[9] is not None for row in rows):
        conn.execute(sql.MARK_SCHEDULED, (s.id,))
    touched = {row[1] for row in rows}
    if optimistic:
        before = conn.total_changes
        conn.executemany(sql.INSERT_NEW_EVENT, rows)
        if conn.total_changes - before != len(rows):
            # The write lock is held and the high waters are not moved yet: the
            # rows past them are exactly this batch's.
            conn.executemany(sql.DELETE_EVENTS_AFTER,
                             [(s.id, part, start[part]) for part in touched])
            return None
    else:
        conn.executemany(sql.INSERT_EVENT, rows)
    moves = [(high[part], s.id, part) for part in sorted(touched)]
    conn.executemany(sql.SET_HIGH_WATER, moves)
    conn.executemany(sql.MIRROR_HIGH_WATER, moves)
    return out


def query(conn: sqlite3.Connection, q: Query, limit: int,
          after: tuple[int, int] | None) -> list[Event]:
    """Up to ``limit`` events matching ``q`` after the position ``after``, in position order."""
    s = get_stream(conn, q.stream)
    found = waters(conn, s.id)
    filters = ""
    extra: list[Any] = []
    for clause, value in zip(sql.QUERY_FILTERS, (q.key, q.type, q.since_ms, q.until_ms),
                             strict=True):
        if value is not None:
            filters += clause
            extra.append(value)
    statement = sql.QUERY_EVENTS.format(filters=filters)
    parts = range(s.partitions) if q.partitions is None else sorted(q.partitions)
    out: list[Event] = []
    for part in parts:
        high, low = found[part]
        window = query_window(q, part, after, low, high)
        if window is None:
            continue
        lo, hi = window
        out.extend(decode(s.name, conn.execute(
            statement, (s.id, part, lo, hi, *extra, limit - len(out))).fetchall()))
        if len(out) >= limit:
            break
    return out


def scheduled(conn: sqlite3.Connection, stream: str, after: dict[int, int],
              now: int) -> dict[int, int]:
    """Per partition of ``after``, its events past ``after[partition]`` scheduled later
    than ``now``."""
    s = get_stream(conn, stream)
    return {part: conn.execute(sql.COUNT_SCHEDULED_AFTER, (s.id, part, seq, now)).fetchone()[0]
            for part, seq in after.items()}


def trim(conn: sqlite3.Connection, stream: str, up_to: dict[int, int]) -> dict[int, int]:
    """Remove each partition's events up to its bound; how many each lost.

    Deliveries of removed events are dropped (fencing their leases) and count as
    settled: every group's cursor and frontier move up to the bound, and on.
    """
    s = get_stream(conn, stream)
    found = waters(conn, s.id)
    groups = conn.execute(sql.GROUP_IDS, (s.id,)).fetchall()
    removed: dict[int, int] = {}
    for part, wanted in up_to.items():
        high, low = found[part]
        bound = min(wanted, high)
        removed[part] = conn.execute(sql.DELETE_EVENTS_UP_TO, (s.id, part, bound)).rowcount
        if bound + 1 > low:
            conn.execute(sql.SET_LOW_WATER, (bound + 1, s.id, part))
        for group_id, ordering in groups:
            conn.execute(sql.DELETE_DELIVERIES_UP_TO, (group_id, part, bound))
            conn.execute(sql.DELETE_RANGES_UP_TO, (group_id, part, bound))
            conn.execute(sql.CUT_RANGES_UP_TO, (group_id, part, bound))
            if ordering == "key":  # deliveries blocked behind removed ones are free now
                conn.execute(sql.RELEASE_HEADS, (group_id, part))
            conn.execute(sql.CATCH_UP, (bound, bound, group_id, part))
            advance_frontier(conn, group_id, part)
    return removed
