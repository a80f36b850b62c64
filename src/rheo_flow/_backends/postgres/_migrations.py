"""The PostgreSQL backend's schema: its versions, and bringing a database up to date.

Each version is a :class:`Migration` whose SQL files (in ``migrations/``) change
tables and indexes; the versions applied are recorded in ``rheo_schema_version``.
The server-side functions (``functions/``: fetch and the steps it calls for a
key-ordered group, settle, renew and the steps they share, advance_frontiers,
append_guarded, and lag_report, whose name and columns are an interface for
tools outside rheo-flow and never change) are not versioned: after the pending
migrations, in the same transaction, every function is installed at its current definition with
``CREATE OR REPLACE``, so a schema at any version ends with the same functions
as a fresh one. The function definitions of earlier releases are kept as test
fixtures, to build the databases those releases left behind.

Tables (migration 1):

* ``streams``, ``partitions`` — stream metadata; ``partitions`` holds the high
  and low water per partition and is the row an append locks;
* ``events`` — one row per event, keyed by (stream, partition, sequence), with a
  unique (stream, event id) for idempotent appends;
* ``groups``; ``cursors`` (per group and partition: the highest materialised
  sequence) and ``frontiers`` (the stored contiguous frontier). They are two
  tables so that a fetch moving a cursor and a settle moving a frontier never
  wait on one another's row lock;
* ``ranges`` (migration 8) — an unordered group's leases: a row per partition a
  fetch leased new events from (first and last sequence, token, attempt,
  deadline, consumer, a bit per event set once the event is acked or split off;
  see ``migrations/v8_ranges.sql``);
* ``deliveries`` — a row per (group, partition, sequence) of a key-ordered group
  once fetch first leases it, and of an unordered group's event a nack, reject,
  dead letter or partial renew split off its range (and of every event leased
  before migration 8). ``state``: 0 available, 1 leased, 2 acked, 3 rejected;
  ``settled_by``: 1 ack, 2 nack, 3 reject.

Migration 5 adds ``groups.ordering`` (0 none, 1 key) and ``deliveries.key``, set
only in key-ordered groups, whose fetch takes the steps of
``functions/fetch_keyed.sql``; migration 6 adds ``deliveries_waiting``, which
migration 7 replaces with ``deliveries_ready``, which migration 10 drops. Migration 11
adds ``groups.paused_until_ms``, the end of a group's pause (0: not paused).

Partial indexes keep fetch cost independent of the acked history and of the
backlog (migration 10): ``deliveries_due`` holds only available rows, by the time
they become due (``available_at_ms``, then sequence), ``deliveries_expiry`` only
leased rows, by deadline: a fetch's scan stops at the first row not due, so
retries delayed into the future and leases held are never read.
``deliveries_rejected`` holds only dead letters, by sequence. ``deliveries_keyed``
holds the unsettled deliveries of key-ordered groups by (key, sequence) and
``deliveries_held`` the held ones, by (key, sequence). Acked rows live in the
primary key alone. Events nobody fetched yet have no delivery row at all. A fetch
first finds the partitions with work (``functions/fetch_work.sql``): the cursors
below their high water, and, from the first entry of each partition in
``deliveries_due``, ``deliveries_expiry`` and ``ranges_expiry``, those with rows
due; it visits no other partition.

Migration 11 adds ``events.deliver_at_ms`` (delayed delivery), the partial index
``events_scheduled`` of the events that have one and ``streams.scheduled``, set
before a stream's first scheduled event: only then does a fetch look for them
(``functions/fetch_scheduled.sql``).

Lock order, followed by every function and statement so that none can deadlock:
``partitions`` → ``cursors`` → ``ranges`` → ``deliveries`` → ``frontiers``, rows
of one table in key order. Fetch takes deliveries, ranges and cursors with
``SKIP LOCKED`` (which never waits), and blocks on one cursor only while it holds
no lock at all (``claim_cursors``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..._model._errors import BackendError
from ._pool import driver
from ._sql import Statements, load, render

if TYPE_CHECKING:
    import asyncpg

__all__ = ["BOOTSTRAP", "FUNCTIONS", "MIGRATIONS", "SCHEMA_VERSION", "VERSION_TABLE",
           "Migration", "ensure_schema"]

log = logging.getLogger("rheo_flow.postgres")


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: the SQL files (``migrations/<name>.sql``, or ``functions/``
    for :data:`FUNCTIONS`) applied in order."""

    version: int
    description: str
    files: tuple[str, ...]

    @property
    def statements(self) -> tuple[str, ...]:
        """Each file's SQL (one or more statements), ``{s}`` not yet rendered."""
        folder = "functions" if self is FUNCTIONS else "migrations"
        return tuple(load(f"{folder}/{name}.sql") for name in self.files)


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(1, "streams, events, groups, deliveries and the fetch/settle/renew functions",
              ("v1_tables",)),
    Migration(2, "fetch, settle and renew with plans that do not depend on table statistics",
              ()),
    Migration(3, "fetch commits durably (version 2's fetch committed asynchronously); "
                 "event ids compare bytewise",
              ("v3_event_ids_bytewise",)),
    Migration(4, "deliveries keep the last error recorded by a nack or reject",
              ("v4_last_error",)),
    Migration(5, "key-ordered groups: groups.ordering, deliveries.key and the index of "
                 "unsettled keyed deliveries",
              ("v5_key_ordering",)),
    Migration(6, "key-ordered fetches find the deliveries to lease again through the index "
                 "of available keyed deliveries",
              ("v6_waiting_deliveries",)),
    Migration(7, "key-ordered groups hold the events waiting for their key until it is "
                 "released, and fetch reads the index of ready keyed deliveries",
              ("v7_ready_deliveries",)),
    Migration(8, "range leases: an unordered group's fetch stores one range per partition "
                 "instead of a delivery row per event",
              ("v8_ranges",)),
    Migration(9, "acks travel per range (ack_ranges), and fetch finds expired ranges by "
                 "their deadline (ranges_expiry)",
              ("v9_range_expiry",)),
    Migration(10, "fetch visits only the partitions with work (fetch_work) and finds the "
                  "delivery rows due by their time (deliveries_due, deliveries_expiry)",
              ("v10_due_deliveries",)),
    Migration(11, "a group may be paused (groups.paused_until_ms, read by fetch); delayed "
                  "delivery (events.deliver_at_ms, the index of scheduled events, "
                  "streams.scheduled); streams keep a retention policy "
                  "(streams.retention_max_age_ms and retention_max_events)",
              ("v11_group_pause", "v11_delayed_delivery", "v11_retention")),
)
"""Versions 2 and 3 changed functions, which :data:`FUNCTIONS` now installs."""

SCHEMA_VERSION: Final = MIGRATIONS[-1].version
"""The schema version this code needs; a database at a newer one is refused."""

VERSION_TABLE: Final = "rheo_schema_version"

BOOTSTRAP: Final = Migration(0, "the schema and the table of applied versions", ("bootstrap",))
"""Run under the migration lock before the migrations (never recorded as a version)."""

FUNCTIONS: Final = Migration(SCHEMA_VERSION, "the server-side functions, current definitions",
                             ("states", "advance_frontiers", "fetch_work", "fetch_keyed",
                              "fetch_by_key", "fetch_scheduled", "fetch", "settle_ranged",
                              "settle", "renew", "ack_fetch", "ack_ranges", "append_guarded",
                              "lag_report"))
"""Installed after the migrations whenever any was applied (``CREATE OR REPLACE``)."""

_LATE_FUNCTIONS: Final = ("{s}.held()", "{s}.append_guarded(integer, text, text, text, text, "
                                       "text, text[], text, text, text)",
                           "{s}.append_one(integer, integer, text, text, text, text, text, "
                           "text, text, bigint)",
                           "{s}.lag_report(text[])",
                           "{s}.claim_fresh(integer, integer, integer[], bigint)")
"""Functions added while the current version was unreleased (the named codes of
functions/states.sql, then functions/append_guarded.sql and its append_one, then
functions/lag_report.sql, then fetch's common case, claim_fresh): a schema at the
current version without one gets the current functions installed (or, not
migrating, is refused)."""


def _newer(schema: str, version: int) -> BackendError:
    return BackendError(
        f"PostgreSQL schema {schema!r} is at version {version}, newer than this "
        f"rheo-flow supports ({SCHEMA_VERSION}): upgrade rheo-flow"
    )


async def ensure_schema(conn: asyncpg.Connection, schema: str, *, apply: bool) -> int:
    """Check the schema version; create or upgrade it when ``apply`` (else refuse)."""
    sql = Statements.for_schema(schema)
    asyncpg = driver()
    try:
        version: int = await conn.fetchval(sql.schema_version)
    except asyncpg.UndefinedTableError:
        version = 0
    if version > SCHEMA_VERSION:
        raise _newer(schema, version)
    if version == SCHEMA_VERSION:
        if not all([await conn.fetchval(sql.has_named_codes, render(function, schema))
                    for function in _LATE_FUNCTIONS]):
            # Made at this version before its newest function (the named codes of
            # functions/states.sql, then append_guarded.sql, then lag_report.sql) was added while
            # the version was unreleased: install them.
            if not apply:
                raise BackendError(
                    f"PostgreSQL schema {schema!r} lacks this rheo-flow's functions: run  "
                    "rheo-flow migrate --url URL  (or open with migrate=True)")
            return await _apply_migrations(conn, schema, sql)
        return version
    if not apply and version == 0:
        raise BackendError(
            f"PostgreSQL schema {schema!r} holds no rheo_flow tables: create them with "
            "rheo-flow migrate --url URL  (or open with migrate=True)"
        )
    if not apply:
        raise BackendError(
            f"PostgreSQL schema {schema!r} is at version {version}, this rheo-flow needs "
            f"{SCHEMA_VERSION}: run  rheo-flow migrate --url URL  (or open with migrate=True)"
        )
    return await _apply_migrations(conn, schema, sql)


async def _apply_migrations(conn: asyncpg.Connection, schema: str, sql: Statements) -> int:
    async with conn.transaction():
        await conn.execute(sql.migration_lock, f"rheo_flow.migrate:{schema}")
        if not await conn.fetchval(sql.table_exists, render("{s}." + VERSION_TABLE, schema)):
            for script in BOOTSTRAP.statements:
                await conn.execute(render(script, schema))
        version: int = await conn.fetchval(sql.schema_version)
        if version > SCHEMA_VERSION:
            raise _newer(schema, version)
        for migration in MIGRATIONS:
            if migration.version <= version:
                continue
            for script in migration.statements:
                await conn.execute(render(script, schema))
            await conn.execute(sql.record_version, migration.version, migration.description)
            log.info("applied rheo_flow schema migration %d to %s", migration.version, schema)
        for script in FUNCTIONS.statements:
            await conn.execute(render(script, schema))
        return SCHEMA_VERSION
