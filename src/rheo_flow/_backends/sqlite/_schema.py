"""Opening a database file: the connection's settings, WAL, and the schema created,
checked or migrated.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Final

from ..._model._errors import BackendError, BackendUnavailable
from ..._support._call_retry import retried_sync
from . import _sql as sql
from ._errors import is_locked

__all__ = ["SCHEMA_VERSION", "connect"]

SCHEMA_VERSION: Final = 8
"""Stored in ``PRAGMA user_version``; bump it (with a migration) on any schema change.

1: first schema. 2: the ``deliveries`` state CHECK is written with ``OR`` instead
of ``IN (...)``: SQLite evaluates a CHECK on every inserted and updated row, and
an ``IN`` list of four builds a temporary lookup table each time, which made
every delivery write about twice as dear. 3: ``deliveries.last_error``, the last
error recorded by a nack or reject. 4: ``groups.ordering`` and ``deliveries.key``
with the partial index ``deliveries_keyed``, for key-ordered groups. 5: no triggers
on ``deliveries``: schema 4's released the next delivery of a key on every settle
and delete of any group, which made every ack about a third dearer, unordered
groups' included; the statements settling a key-ordered group's deliveries
release their keys instead. 6: the ``ranges`` table (range leases of unordered
groups: a row per partition a fetch leases new events from, instead of a delivery
row per event); delivery rows keep their meaning, so leases in flight across the
upgrade settle, expire and are leased again as before. 7: the indexes
``deliveries_due`` and ``deliveries_group_due`` (unsettled deliveries by when they
are due: a nacked one's available time, a leased one's deadline) and
``ranges_expiry`` (open ranges by deadline), and ``group_partitions.high_water``
(the partition's high water, mirrored by every append) with the partial index
``group_partitions_behind``: a fetch finds what is due with the time as an index
bound, and visits only the partitions with work, instead of walking every delayed
or held delivery of every partition; ``deliveries_active`` keeps the sequence and
the state only (a renewal or a delay no longer rewrites its entry). 8: delayed
delivery: ``events.deliver_at_ms``, the partial index ``events_scheduled`` and
``streams.scheduled``."""

def connect(path: str, busy_timeout_ms: int, synchronous: str,
            migrate: bool) -> sqlite3.Connection:
    """Runs in the backend thread: connect, configure, create or check the schema.

    ``migrate=False`` opens an existing database of the current schema only and
    changes nothing else.
    """
    conn = _open_file(path, busy_timeout_ms, migrate)
    try:
        if not migrate:
            # Checked before WAL is switched on: a file that is not ours stays untouched.
            _check_current(conn, path)
        conn.execute(sql.SET_BUSY_TIMEOUT.format(ms=busy_timeout_ms))
        if path != ":memory:":
            # Persistent in the file; WAL lets readers run beside the one writer.
            _enable_wal(conn, busy_timeout_ms / 1000)
        conn.execute(sql.SET_SYNCHRONOUS.format(mode=synchronous))
        if migrate:  # else the version is the current one: nothing to install
            _install(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        raise BackendUnavailable(f"cannot open SQLite database {path!r}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _open_file(path: str, busy_timeout_ms: int, migrate: bool) -> sqlite3.Connection:
    target, uri = path, False
    if not migrate and path != ":memory:":
        if not os.path.isfile(path):
            raise BackendError(f"SQLite database {path!r} does not exist "
                               "(create it with  rheo-flow migrate --url URL)")
        # mode=rw: a file removed meanwhile is an error instead of a new database.
        target, uri = f"{Path(path).resolve().as_uri()}?mode=rw", True
    try:
        return sqlite3.connect(
            target,
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE / COMMIT
            uri=uri,
        )
    except sqlite3.Error as exc:
        raise BackendUnavailable(f"cannot open SQLite database {path!r}: {exc}") from exc


def _check_current(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a file without the current schema (nothing may be created or migrated)."""
    version = conn.execute(sql.GET_VERSION).fetchone()[0]
    if version > SCHEMA_VERSION:
        raise _newer(path, version)
    if version < SCHEMA_VERSION:
        raise BackendError(
            f"SQLite database {path!r} has "
            + ("no rheo_flow schema" if version == 0 else f"schema version {version}")
            + f" (this rheo-flow needs {SCHEMA_VERSION}): run  rheo-flow migrate --url URL"
        )


def _newer(path: str, version: int) -> BackendError:
    return BackendError(f"SQLite database {path!r} has schema version {version}, newer "
                        f"than this rheo-flow supports ({SCHEMA_VERSION}): upgrade rheo-flow")


def _enable_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch the file to WAL, retrying while another connection holds it.

    Changing the journal mode takes an exclusive lock without going through
    SQLite's busy handler: two processes opening a new file at once get
    "database is locked" at once instead of waiting ``busy_timeout_ms``.
    """
    retried_sync(lambda _: conn.execute(sql.SET_WAL), when=is_locked, within_s=timeout_s,
                 first_wait_s=0.002, max_wait_s=0.05)


def _install(conn: sqlite3.Connection, path: str) -> None:
    """Create the schema in a new file or migrate an older one, all or nothing.

    IMMEDIATE: two processes opening a new file at once create the schema once.
    """
    conn.execute(sql.BEGIN_WRITE)
    try:
        version = conn.execute(sql.GET_VERSION).fetchone()[0]
        if version > SCHEMA_VERSION:
            raise _newer(path, version)
        if version == 0:
            for statement in sql.SCHEMA:
                conn.execute(statement)
        for step in range(version, SCHEMA_VERSION) if version else ():
            _MIGRATIONS[step](conn)
        if version < SCHEMA_VERSION:
            conn.execute(sql.SET_VERSION.format(version=SCHEMA_VERSION))
        conn.execute(sql.COMMIT)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute(sql.ROLLBACK)
        raise


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Rebuild ``deliveries`` with schema 2's CHECK (a CHECK cannot be altered in
    place); runs inside the opening ``BEGIN IMMEDIATE``, so all or nothing."""
    conn.execute(sql.CREATE_DELIVERIES.format(table="deliveries_v2"))
    conn.execute(sql.COPY_DELIVERIES_1_TO_2)
    conn.execute(sql.DROP_DELIVERIES)  # and its indexes
    conn.execute(sql.RENAME_DELIVERIES_V2)
    for statement in sql.DELIVERIES_INDEXES:
        conn.execute(statement)


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    """Add ``deliveries.last_error`` (NULL on existing rows: no error was recorded)."""
    if "last_error" not in _columns(conn, "deliveries"):  # a table rebuilt from 1 has it
        conn.execute(sql.ADD_LAST_ERROR)


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    """Add ``groups.ordering`` (``'none'`` for every existing group), ``deliveries.key``
    (NULL: no existing group is key-ordered) and the index of keyed deliveries; in
    place, inside the opening ``BEGIN IMMEDIATE``."""
    if "ordering" not in _columns(conn, "groups"):
        conn.execute(sql.ADD_GROUP_ORDERING)
    if "key" not in _columns(conn, "deliveries"):  # a table rebuilt from 1 has it
        conn.execute(sql.ADD_DELIVERY_KEY)
    conn.execute(sql.INDEX_DELIVERIES_KEYED)


def _migrate_4_to_5(conn: sqlite3.Connection) -> None:
    """Drop schema 4's triggers on ``deliveries`` (the settles release keys now).

    The rows stay as they are: a blocked delivery is released by the next settle
    of its key, as before."""
    for statement in sql.DROP_KEY_TRIGGERS:
        conn.execute(statement)


def _migrate_5_to_6(conn: sqlite3.Connection) -> None:
    """Create the ``ranges`` table; existing delivery rows stay as they are (leases in
    flight keep settling, expiring and being leased again through them)."""
    for statement in sql.RANGES_TABLE:
        conn.execute(statement)


def _migrate_6_to_7(conn: sqlite3.Connection) -> None:
    """Add ``group_partitions.high_water`` (filled in from ``partitions``), create
    the indexes that bound a fetch to its work, built from the unsettled delivery
    rows, the open ranges and the groups' partitions, and rebuild ``deliveries_active``
    with the sequence and state only (the rows stay as they are)."""
    if "high_water" not in _columns(conn, "group_partitions"):
        conn.execute(sql.MIRROR_HIGH_WATERS[0])
    conn.execute(sql.MIRROR_HIGH_WATERS[1])
    for statement in (*sql.DUE_INDEXES, *sql.SLIM_DELIVERIES_ACTIVE):
        conn.execute(statement)


def _migrate_7_to_8(conn: sqlite3.Connection) -> None:
    """Schema 8: groups may be paused, events may be scheduled, streams keep a retention
    policy."""
    _migrate_add_pause(conn)
    _migrate_to_delayed_delivery(conn)
    _migrate_add_retention(conn)


def _migrate_add_pause(conn: sqlite3.Connection) -> None:
    """Add ``groups.paused_until_ms`` (0 on every existing group: none is paused)."""
    if "paused_until_ms" not in _columns(conn, "groups"):
        conn.execute(sql.ADD_GROUP_PAUSE)


def _migrate_to_delayed_delivery(conn: sqlite3.Connection) -> None:
    """Add ``events.deliver_at_ms`` (NULL on existing events: deliverable at once),
    ``streams.scheduled`` (0: no stream had a scheduled event) and the partial index
    ``events_scheduled`` (empty); in place, no row rewritten."""
    add_column, add_flag, index = sql.DELAYED_DELIVERY
    if "deliver_at_ms" not in _columns(conn, "events"):
        conn.execute(add_column)
    if "scheduled" not in _columns(conn, "streams"):
        conn.execute(add_flag)
    conn.execute(index)


def _migrate_add_retention(conn: sqlite3.Connection) -> None:
    """Add ``streams.retention_max_age_ms`` and ``retention_max_events`` (NULL: no
    existing stream has a retention policy)."""
    if "retention_max_events" not in _columns(conn, "streams"):
        for statement in sql.ADD_RETENTION:
            conn.execute(statement)


_MIGRATIONS: Final = {1: _migrate_1_to_2, 2: _migrate_2_to_3, 3: _migrate_3_to_4,
                      4: _migrate_4_to_5, 5: _migrate_5_to_6, 6: _migrate_6_to_7,
                      7: _migrate_7_to_8}
"""The step from each version to the next, run in order inside one transaction."""


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(sql.TABLE_INFO.format(table=table))}
