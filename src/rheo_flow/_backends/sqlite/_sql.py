"""Every SQL statement of the SQLite backend, by name.

The text lives in two files of this package: ``schema.sql`` (tables, indexes,
migrations, connection settings) and ``statements.sql`` (what the operations
run). This module loads them once and names each statement; the other modules
use these names and hold no SQL of their own.

One templating style: ``{name}`` in a statement is another piece of the same
file when one has that name (a shared WHERE clause or column list, spliced in
here), else a slot the caller fills with ``str.format`` (an IN list's
placeholders, a table name, a PRAGMA value). Values always go in as SQLite's own
``?`` / ``?N`` parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.resources import files
from typing import Any, Final

__all__ = ["in_lists"]

_NAME: Final = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)
_PIECE: Final = re.compile(r"\{(\w+)\}")


def _load(filename: str) -> dict[str, str]:
    """The statements of ``filename`` by name, with this file's pieces spliced in."""
    text = files(__name__.rpartition(".")[0]).joinpath(filename).read_text(encoding="utf-8")
    parts = _NAME.split(text)  # the header, then each name and the text after it
    raw: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line.rstrip() for line in body.splitlines()
                 if line.strip() and not line.lstrip().startswith("--")]
        raw[name] = "\n".join(lines)
    return {name: _splice(raw, body) for name, body in raw.items()}


def _splice(pieces: dict[str, str], text: str) -> str:
    return _PIECE.sub(
        lambda m: _splice(pieces, pieces[m[1]]) if m[1] in pieces else m[0], text)


_SCHEMA: Final = _load("schema.sql")
_STATEMENTS: Final = _load("statements.sql")

# Schema (schema.sql) ---------------------------------------------------------------

CREATE_DELIVERIES: Final = _SCHEMA["create_deliveries"]
"""The ``deliveries`` table; ``{table}`` is its name (a migration builds a new one)."""
DELIVERIES_INDEXES: Final = (
    _SCHEMA["index_deliveries_active"], _SCHEMA["index_deliveries_rejected"],
    _SCHEMA["index_deliveries_keyed"])
RANGES_TABLE: Final = (
    _SCHEMA["create_ranges"], _SCHEMA["index_ranges_open"], _SCHEMA["index_ranges_token"])
"""The ``ranges`` table and its indexes (schema 6)."""
DUE_INDEXES: Final = (
    _SCHEMA["index_deliveries_due"], _SCHEMA["index_deliveries_group_due"],
    _SCHEMA["index_ranges_expiry"], _SCHEMA["index_group_partitions_behind"])
"""The indexes that bound a fetch's scans to its work (schema 7): unsettled
deliveries by due time, open ranges by deadline, partitions with new events."""
MIRROR_HIGH_WATERS: Final = (_SCHEMA["add_group_high_water"], _SCHEMA["fill_group_high_water"])
"""Schema 7's ``group_partitions.high_water``, added and filled in."""
SLIM_DELIVERIES_ACTIVE: Final = (
    _SCHEMA["drop_deliveries_active"], _SCHEMA["index_deliveries_active"])
"""Schema 7's ``deliveries_active``, by sequence only, in place of schema 6's."""
DELAYED_DELIVERY: Final = (
    _SCHEMA["add_event_deliver_at"], _SCHEMA["add_stream_scheduled"],
    _SCHEMA["index_events_scheduled"])
"""Schema 8's ``events.deliver_at_ms``, ``streams.scheduled`` and ``events_scheduled``."""
SCHEMA: Final = (
    *(_SCHEMA[f"create_{table}"]
      for table in ("streams", "partitions", "events", "groups", "group_partitions")),
    CREATE_DELIVERIES.format(table="deliveries"),
    *DELIVERIES_INDEXES,
    *RANGES_TABLE,
    *DUE_INDEXES,
    *DELAYED_DELIVERY,
)
"""A new file's schema, in order."""
COPY_DELIVERIES_1_TO_2: Final = _SCHEMA["copy_deliveries_1_to_2"]
DROP_DELIVERIES: Final = _SCHEMA["drop_deliveries"]
RENAME_DELIVERIES_V2: Final = _SCHEMA["rename_deliveries_v2"]
ADD_LAST_ERROR: Final = _SCHEMA["add_last_error"]
ADD_DELIVERY_KEY: Final = _SCHEMA["add_delivery_key"]
ADD_GROUP_ORDERING: Final = _SCHEMA["add_group_ordering"]
ADD_GROUP_PAUSE: Final = _SCHEMA["add_group_pause"]
ADD_RETENTION: Final = (_SCHEMA["add_retention_max_age"], _SCHEMA["add_retention_max_events"])
DROP_KEY_TRIGGERS: Final = (
    _SCHEMA["drop_key_settled_trigger"], _SCHEMA["drop_key_removed_trigger"])
INDEX_DELIVERIES_KEYED: Final = _SCHEMA["index_deliveries_keyed"]
GET_VERSION: Final = _SCHEMA["get_version"]
TABLE_INFO: Final = _SCHEMA["table_info"]
SET_VERSION: Final = _SCHEMA["set_version"]
SET_BUSY_TIMEOUT: Final = _SCHEMA["set_busy_timeout"]
SET_WAL: Final = _SCHEMA["set_wal"]
SET_SYNCHRONOUS: Final = _SCHEMA["set_synchronous"]

# Transactions ----------------------------------------------------------------------

BEGIN_READ: Final = _STATEMENTS["begin_read"]
BEGIN_WRITE: Final = _STATEMENTS["begin_write"]
COMMIT: Final = _STATEMENTS["commit"]
ROLLBACK: Final = _STATEMENTS["rollback"]
SAVEPOINT: Final = _STATEMENTS["savepoint"]
ROLLBACK_TO_SAVEPOINT: Final = _STATEMENTS["rollback_to_savepoint"]
RELEASE_SAVEPOINT: Final = _STATEMENTS["release_savepoint"]
SAVEPOINT_OUTBOX: Final = _STATEMENTS["savepoint_outbox"]
ROLLBACK_TO_SAVEPOINT_OUTBOX: Final = _STATEMENTS["rollback_to_savepoint_outbox"]
RELEASE_SAVEPOINT_OUTBOX: Final = _STATEMENTS["release_savepoint_outbox"]
TAKE_WRITE_LOCK: Final = _STATEMENTS["take_write_lock"]
DATABASE_LIST: Final = _STATEMENTS["database_list"]

# Streams, partitions and groups ----------------------------------------------------

FIND_STREAM: Final = _STATEMENTS["find_stream"]
SET_RETENTION: Final = _STATEMENTS["set_retention"]
INSERT_STREAM: Final = _STATEMENTS["insert_stream"]
INSERT_PARTITION: Final = _STATEMENTS["insert_partition"]
LIST_STREAMS: Final = _STATEMENTS["list_streams"]
WATERS: Final = _STATEMENTS["waters"]
HIGH_WATERS: Final = _STATEMENTS["high_waters"]
SET_HIGH_WATER: Final = _STATEMENTS["set_high_water"]
MIRROR_HIGH_WATER: Final = _STATEMENTS["mirror_high_water"]
"""Run with :data:`SET_HIGH_WATER`'s parameters (high water, stream, partition)."""
SET_LOW_WATER: Final = _STATEMENTS["set_low_water"]
GROUP_IDS: Final = _STATEMENTS["group_ids"]
DELETE_STREAM_EVENTS: Final = _STATEMENTS["delete_stream_events"]
DELETE_STREAM_PARTITIONS: Final = _STATEMENTS["delete_stream_partitions"]
DELETE_STREAM: Final = _STATEMENTS["delete_stream"]
FIND_GROUP: Final = _STATEMENTS["find_group"]
GROUP_OF_STREAM: Final = _STATEMENTS["group_of_stream"]
SET_MAX_ATTEMPTS: Final = _STATEMENTS["set_max_attempts"]
INSERT_GROUP: Final = _STATEMENTS["insert_group"]
INSERT_GROUP_PARTITION: Final = _STATEMENTS["insert_group_partition"]
LIST_GROUPS: Final = _STATEMENTS["list_groups"]
SET_GROUP_PAUSE: Final = _STATEMENTS["set_group_pause"]
DELETE_GROUP: Final = (
    _STATEMENTS["delete_group_deliveries"], _STATEMENTS["delete_group_ranges"],
    _STATEMENTS["delete_group_partitions"],
    _STATEMENTS["delete_group"])
"""A group's rows, table by table (each takes the group id)."""

# Events ----------------------------------------------------------------------------

INSERT_EVENT: Final = _STATEMENTS["insert_event"]
INSERT_NEW_EVENT: Final = _STATEMENTS["insert_new_event"]
MARK_SCHEDULED: Final = _STATEMENTS["mark_scheduled"]
SCHEDULED_AFTER: Final = _STATEMENTS["scheduled_after"]
COUNT_SCHEDULED_AFTER: Final = _STATEMENTS["count_scheduled_after"]
DELETE_EVENTS_AFTER: Final = _STATEMENTS["delete_events_after"]
DELETE_EVENTS_UP_TO: Final = _STATEMENTS["delete_events_up_to"]
EVENTS_BY_ID: Final = _STATEMENTS["events_by_id"]
EVENTS_BY_SEQUENCE: Final = _STATEMENTS["events_by_sequence"]
EVENTS_BETWEEN: Final = _STATEMENTS["events_between"]
QUERY_EVENTS: Final = _STATEMENTS["query_events"]
"""``{filters}``: the query's conditions among :data:`QUERY_FILTERS`."""
QUERY_FILTERS: Final = (
    _STATEMENTS["with_key"], _STATEMENTS["with_type"], _STATEMENTS["appended_since"],
    _STATEMENTS["appended_before"])
"""The conditions on key, type, appended since, appended before (one value each)."""

# Leases ----------------------------------------------------------------------------

FETCH_GROUP: Final = _STATEMENTS["fetch_group"]
PARTITIONS_WITH_WORK: Final = _STATEMENTS["partitions_with_work"]
ELIGIBLE: Final = _STATEMENTS["eligible"]
ELIGIBLE_BY_KEY: Final = _STATEMENTS["eligible_by_key"]
EVENT_KEYS_AFTER: Final = _STATEMENTS["event_keys_after"]
LEASE_NEW_KEYED: Final = _STATEMENTS["lease_new_keyed"]
STORE_BLOCKED: Final = _STATEMENTS["store_blocked"]
RELEASE_KEY: Final = _STATEMENTS["release_key"]
"""Run after a key-ordered group's delivery is settled for good (group, part, seq)."""
HAS_BLOCKED: Final = _STATEMENTS["has_blocked"]
"""Whether a key-ordered group's partition (group, part) holds a blocked delivery."""
RELEASE_HEADS: Final = _STATEMENTS["release_heads"]
EXPIRE: Final = _STATEMENTS["expire"]
LEASE_AGAIN: Final = _STATEMENTS["lease_again"]
SET_CURSOR: Final = _STATEMENTS["set_cursor"]
SETTLE_GROUP: Final = _STATEMENTS["settle_group"]
SETTLE: Final[dict[str, str]] = {
    op: _STATEMENTS[f"settle_{op}"] for op in ("ack", "nack", "reject")}
"""The fenced settle of one lease, by op (parameters: see ``fenced`` in statements.sql)."""
RENEW: Final = _STATEMENTS["renew"]
DELIVERY_ROWS: Final = _STATEMENTS["delivery_rows"]
WRITE_BACK: Final = _STATEMENTS["write_back"]

# Progress --------------------------------------------------------------------------

ADVANCE_FRONTIER: Final = _STATEMENTS["advance_frontier"]
FRONTIERS: Final = _STATEMENTS["frontiers"]
DEAD_LETTERS: Final = _STATEMENTS["dead_letters"]
LAG_REPORT: Final = _STATEMENTS["lag_report"]
REDRIVE: Final = _STATEMENTS["redrive"]
REDRIVE_AT: Final = _STATEMENTS["redrive_at"]
FRONTIER_BEFORE_PENDING: Final = _STATEMENTS["frontier_before_pending"]
DELETE_DELIVERIES_FROM: Final = _STATEMENTS["delete_deliveries_from"]
REWIND: Final = _STATEMENTS["rewind"]
DELETE_PARTITION_DELIVERIES: Final = _STATEMENTS["delete_partition_deliveries"]
MOVE_TO: Final = _STATEMENTS["move_to"]
DELETE_DELIVERIES_UP_TO: Final = _STATEMENTS["delete_deliveries_up_to"]
CATCH_UP: Final = _STATEMENTS["catch_up"]
DELETE_RANGES_FROM: Final = _STATEMENTS["delete_ranges_from"]
CUT_RANGES_FROM: Final = _STATEMENTS["cut_ranges_from"]
DELETE_PARTITION_RANGES: Final = _STATEMENTS["delete_partition_ranges"]
DELETE_RANGES_UP_TO: Final = _STATEMENTS["delete_ranges_up_to"]
CUT_RANGES_UP_TO: Final = _STATEMENTS["cut_ranges_up_to"]

# Range leases ----------------------------------------------------------------------

EXPIRED_RANGES: Final = _STATEMENTS["expired_ranges"]
"""A group's expired ranges (group, now): the partition, then ``_ranges.RangeRow``."""
RANGES_BY_TOKEN: Final = _STATEMENTS["ranges_by_token"]
RANGE_AT: Final = _STATEMENTS["range_at"]
INSERT_RANGE: Final = _STATEMENTS["insert_range"]
MARK_RANGE: Final = _STATEMENTS["mark_range"]
LEASE_RANGE_AGAIN: Final = _STATEMENTS["lease_range_again"]
SPLIT_DELIVERY: Final = _STATEMENTS["split_delivery"].format(conflict="")
"""An event split off a range into a delivery row (the 14 columns of the statement)."""
KEEP_ACKED: Final = _STATEMENTS["split_delivery"].format(conflict="OR IGNORE")
"""The same, skipping an event that has a row already."""

# IN lists --------------------------------------------------------------------------

# SQLite's default variable limit was 999 before 3.32; stay below it. IN lists are
# padded to a few fixed sizes so the statement cache keeps hitting.
_IN_SIZES: Final = (1, 8, 64, 256, 900)


def in_lists(
    statement: str, params: tuple[Any, ...], values: list[Any]
) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """``statement`` with its ``{values}`` slot as ``(?, ?, ...)``, covering ``values``.

    Yields one statement and its parameters (``params``, then a chunk of
    ``values`` padded to a fixed size) per chunk.
    """
    for start in range(0, len(values), _IN_SIZES[-1]):
        chunk = values[start:start + _IN_SIZES[-1]]
        size = next(n for n in _IN_SIZES if n >= len(chunk))
        padded = chunk + [chunk[-1]] * (size - len(chunk))
        yield statement.format(values="(" + ", ".join("?" * size) + ")"), (*params, *padded)
