"""An SQLite file turned back into an older schema's layout, for tests that rebuild
an older file from one the current schema wrote: schema 8's and 7's additions taken out,
and range leases turned back into delivery rows, as schema 5 stored every lease."""

from __future__ import annotations

import sqlite3


def ranges_to_delivery_rows(conn: sqlite3.Connection) -> None:
    """Store each event a range holds as the delivery row schema 5 would hold (leased
    under the same lease id and receipt, or acked), then drop the ``ranges`` table."""
    rows = conn.execute(
        "SELECT group_id, part, first_seq, last_seq, base_seq, token, attempt, deadline_ms,"
        " consumer_id, done FROM ranges").fetchall()
    for group_id, part, first, last, base, token, attempt, deadline, consumer, done in rows:
        for seq in range(first, last + 1):
            acked = done[seq - first] == "1"
            conn.execute(
                "INSERT OR IGNORE INTO deliveries (group_id, part, seq, state, attempt,"
                " lease_id, receipt, consumer_id, deadline_ms, settled_by)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (group_id, part, seq, "acked" if acked else "leased", attempt,
                 f"{token}{seq - base:08x}", f"{part}-{seq}-{attempt}", consumer, deadline,
                 "ack" if acked else None))
    conn.execute("DROP TABLE ranges")


SCHEMA_7_INDEXES = ("deliveries_due", "deliveries_group_due", "ranges_expiry",
                    "group_partitions_behind")
"""The indexes schema 7 added."""


def undo_schema_8(conn: sqlite3.Connection) -> None:
    """Drop what schema 8 added: the streams' retention columns, delayed delivery
    (:func:`undo_delayed_delivery`) and ``groups.paused_until_ms``."""
    conn.execute("ALTER TABLE streams DROP COLUMN retention_max_age_ms")
    conn.execute("ALTER TABLE streams DROP COLUMN retention_max_events")
    undo_delayed_delivery(conn)
    conn.execute("ALTER TABLE groups DROP COLUMN paused_until_ms")


def undo_schema_7(conn: sqlite3.Connection) -> None:
    """Drop what schema 7 added: its indexes and ``group_partitions.high_water``."""
    for index in SCHEMA_7_INDEXES:
        conn.execute(f"DROP INDEX IF EXISTS {index}")
    conn.execute("ALTER TABLE group_partitions DROP COLUMN high_water")


def undo_delayed_delivery(conn: sqlite3.Connection) -> None:
    """Drop what schema 8 added: ``events_scheduled``, ``events.deliver_at_ms`` and
    ``streams.scheduled``."""
    conn.execute("DROP INDEX IF EXISTS events_scheduled")
    conn.execute("ALTER TABLE events DROP COLUMN deliver_at_ms")
    conn.execute("ALTER TABLE streams DROP COLUMN scheduled")
