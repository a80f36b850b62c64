"""The SQLite backend: single-node durable storage in one file, on the stdlib ``sqlite3``.

Semantics are those of the in-memory reference backend, kept in tables
(``schema.sql``):

* ``events`` — one row per event, keyed by (stream, partition, sequence), with a
  unique (stream, event id) for idempotent appends;
* ``partitions`` — high and low water per stream partition;
* ``group_partitions`` — per (group, partition): the *cursor* (highest sequence
  leased or stored), the stored contiguous *frontier*, and the partition's high
  water mirrored, so that the partitions with new events are an index range;
* ``deliveries`` — materialised deliveries. Rows are created lazily when fetch
  leases a sequence past the cursor, so an event nobody fetched costs no row.

Terminal (acked, rejected) rows stay until replay, reset or trim, exactly like the
reference: they answer a repeated settle with ``repeated=True``. Fetch never reads
them: it reads partial indexes of the unsettled rows by due time with the time
as the bound, and only the partitions with work, so its cost grows neither with
the acked events nor with the delayed or held ones nor with idle partitions.
The frontier is advanced from its stored value by walking forward from it, never
by counting acked rows.

Concurrency: every write (fetch included) is one ``BEGIN IMMEDIATE``
transaction, which takes SQLite's single writer lock before reading anything,
so processes sharing the file serialise their claims and can never lease one
delivery twice. WAL mode lets readers proceed while a writer works.

Batches: an operation is one hop to the backend thread and one transaction (or a
share of one: operations queued while the thread is busy commit together), with
a few statements per batch rather than per event.

The modules, one concern each:

* ``_backend`` — :class:`SQLiteBackend`: settings, URL, lifecycle, the operations;
* ``_writer`` — the backend thread, its queue and group commit;
* ``_schema`` — opening a file: settings, WAL, schema creation and migrations;
* ``_sql`` — every statement by name, loaded from ``schema.sql`` and ``statements.sql``;
* ``_errors`` — ``sqlite3`` errors as settle kinds;
* ``_catalog`` — streams and groups;
* ``_events`` — append, query, trim;
* ``_fetch`` — leasing;
* ``_deliveries`` and ``_settle`` — settles and renews, fast path and row by row;
* ``_progress`` — frontier, dead letters, redrive, replay, reset;
* ``_outbox`` — append and ack in the application's transaction, on its connection.
"""

from __future__ import annotations

from ._backend import DEFAULT_BUSY_TIMEOUT_MS, SQLiteBackend
from ._schema import SCHEMA_VERSION

__all__ = ["DEFAULT_BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "SQLiteBackend"]
