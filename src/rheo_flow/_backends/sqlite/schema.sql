-- The rheo_flow schema of an SQLite file (the version is _schema.SCHEMA_VERSION),
-- its migrations and the connection settings.
--
-- Each statement follows the "-- name:" line that names it (_sql.py loads them);
-- comment lines are left out of the statement text. {slot} is filled in with
-- str.format where the statement is used; parameters are SQLite's own ? / ?N.

-- name: create_streams
CREATE TABLE IF NOT EXISTS streams (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    partitions INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    retention_max_age_ms INTEGER,
    retention_max_events INTEGER
)

-- name: create_partitions
CREATE TABLE IF NOT EXISTS partitions (
    stream_id INTEGER NOT NULL,
    part INTEGER NOT NULL,
    high_water INTEGER NOT NULL DEFAULT 0,
    low_water INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (stream_id, part)
) WITHOUT ROWID

-- name: create_events
-- A rowid table (not WITHOUT ROWID): payloads can be large, and SQLite keeps
-- large rows out of the key b-tree only in rowid tables.
CREATE TABLE IF NOT EXISTS events (
    stream_id INTEGER NOT NULL,
    part INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    type TEXT NOT NULL,
    key TEXT,
    data TEXT NOT NULL,
    headers TEXT,
    appended_at_ms INTEGER NOT NULL,
    PRIMARY KEY (stream_id, part, seq),
    UNIQUE (stream_id, event_id)
)

-- name: create_groups
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY,
    stream_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    max_attempts INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    ordering TEXT NOT NULL DEFAULT 'none',
    paused_until_ms INTEGER NOT NULL DEFAULT 0,
    UNIQUE (stream_id, name)
)

-- name: create_group_partitions
-- high_water (schema 7) mirrors the partition's high water in partitions, moved by
-- the append that moves it (statements.sql: mirror_high_water), so that whether
-- the group has new events in the partition is a test on this row alone.
CREATE TABLE IF NOT EXISTS group_partitions (
    group_id INTEGER NOT NULL,
    part INTEGER NOT NULL,
    cursor INTEGER NOT NULL,
    frontier INTEGER NOT NULL,
    high_water INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (group_id, part)
) WITHOUT ROWID

-- name: index_group_partitions_behind
-- Schema 7: the partitions where the group has new events (its cursor below the
-- high water): a fetch reads them without a look at the others.
CREATE INDEX IF NOT EXISTS group_partitions_behind ON group_partitions (group_id, part)
    WHERE cursor < high_water

-- name: create_deliveries
-- {table}: "deliveries", or the new table a migration rebuilds it into. The CHECK
-- is written with OR, not IN (...): SQLite evaluates it on every inserted and
-- updated row, and an IN list builds a temporary lookup table each time.
CREATE TABLE IF NOT EXISTS {table} (
    group_id INTEGER NOT NULL,
    part INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state = 'available' OR state = 'leased' OR state = 'acked'
                              OR state = 'rejected'),
    attempt INTEGER NOT NULL,
    lease_id TEXT,
    receipt TEXT,
    consumer_id TEXT,
    deadline_ms INTEGER NOT NULL DEFAULT 0,
    available_at_ms INTEGER NOT NULL DEFAULT 0,
    settled_by TEXT,
    reason TEXT NOT NULL DEFAULT '',
    rejected_at_ms INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    key TEXT,
    PRIMARY KEY (group_id, part, seq)
) WITHOUT ROWID

-- name: index_deliveries_active
-- Only non-terminal rows, by sequence: where a group's frontier stops never
-- depends on the acked ones. Schema 7 keeps the sequence and the state only
-- (covering the frontier's reads; fetch reads deliveries_due): a renewal or a
-- delay no longer rewrites its entry.
CREATE INDEX IF NOT EXISTS deliveries_active ON deliveries (group_id, part, seq, state)
    WHERE state IN ('available', 'leased')

-- name: drop_deliveries_active
-- Schema 7: schema 6's deliveries_active (with the columns fetch read) goes, and
-- index_deliveries_active creates it anew.
DROP INDEX IF EXISTS deliveries_active

-- name: index_deliveries_rejected
CREATE INDEX IF NOT EXISTS deliveries_rejected
    ON deliveries (group_id, part, seq) WHERE state = 'rejected'

-- name: index_deliveries_keyed
-- The unsettled deliveries of key-ordered groups by key (only those groups store
-- a delivery's key): whether an earlier delivery of a key is unsettled is one
-- lookup, whatever the acked history.
CREATE INDEX IF NOT EXISTS deliveries_keyed
    ON deliveries (group_id, part, key, seq)
    WHERE key IS NOT NULL AND state IN ('available', 'leased')

-- name: due
-- When an unsettled delivery is next eligible: an available one at available_at_ms,
-- a leased one at its deadline. statements.sql's "due" must spell it exactly so:
-- SQLite uses an index on an expression only for the same expression.
CASE state WHEN 'available' THEN available_at_ms ELSE deadline_ms END

-- name: index_deliveries_due
-- Schema 7: a partition's unsettled deliveries by when they are due, so that a
-- fetch reads the due ones with "<= now" as an index bound and never walks the
-- delayed or held ones (nor the blocked ones of key-ordered groups, due at 2**62).
CREATE INDEX IF NOT EXISTS deliveries_due
    ON deliveries (group_id, part, {due}, seq, attempt)
    WHERE state IN ('available', 'leased')

-- name: index_deliveries_group_due
-- Schema 7: the same for the whole group: whether any delivery row is due is one
-- probe, whatever the partition count.
CREATE INDEX IF NOT EXISTS deliveries_group_due ON deliveries (group_id, {due})
    WHERE state IN ('available', 'leased')

-- name: create_ranges
-- Range leases of unordered groups (_ranges.py): one row per partition a fetch
-- leases new events from, first_seq .. last_seq leased as a whole under one token
-- and attempt until one deadline. done holds a '0' or '1' per event: '1' once the
-- range no longer governs it (acked, or split off into a delivery row by a nack,
-- a reject, a dead letter or a renew of part of the range); pending counts the
-- '0's. An event's lease id is the token (24 hex digits) and its offset from
-- base_seq (8). An event is governed by its delivery row when it has one, else by
-- the range holding it with its '0'; a '1' without a row is an ack. Fully settled
-- ranges stay (pending 0) so that a repeated ack answers as a repeat; trim,
-- replay, reset and deletion remove or cut them.
CREATE TABLE IF NOT EXISTS ranges (
    group_id INTEGER NOT NULL,
    part INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    base_seq INTEGER NOT NULL,
    token TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL,
    consumer_id TEXT,
    done TEXT NOT NULL,
    pending INTEGER NOT NULL,
    PRIMARY KEY (group_id, part, first_seq)
) WITHOUT ROWID

-- name: index_ranges_open
-- The ranges with events in flight, by sequence (expiry, frontiers): fetch and
-- the frontier never read the settled ones.
CREATE INDEX IF NOT EXISTS ranges_open ON ranges (group_id, part, first_seq, deadline_ms)
    WHERE pending > 0

-- name: index_ranges_expiry
-- Schema 7: the group's ranges with events in flight by deadline, so that a fetch
-- finds the expired ones with one probe, whatever the partitions and ranges held.
CREATE INDEX IF NOT EXISTS ranges_expiry ON ranges (group_id, deadline_ms) WHERE pending > 0

-- name: index_ranges_token
-- The same ranges by token (settles and renewals).
CREATE INDEX IF NOT EXISTS ranges_token ON ranges (group_id, part, token) WHERE pending > 0

-- Migrations ----------------------------------------------------------------------

-- name: copy_deliveries_1_to_2
-- Schema 1 had no last_error: it stays NULL (no error was recorded).
INSERT INTO deliveries_v2 (group_id, part, seq, state, attempt, lease_id, receipt,
                           consumer_id, deadline_ms, available_at_ms, settled_by, reason,
                           rejected_at_ms)
SELECT group_id, part, seq, state, attempt, lease_id, receipt, consumer_id, deadline_ms,
       available_at_ms, settled_by, reason, rejected_at_ms
FROM deliveries

-- name: drop_deliveries
-- Its indexes go with it.
DROP TABLE deliveries

-- name: rename_deliveries_v2
ALTER TABLE deliveries_v2 RENAME TO deliveries

-- name: add_last_error
ALTER TABLE deliveries ADD COLUMN last_error TEXT

-- name: add_delivery_key
-- Schema 4: the key of a key-ordered group's delivery (NULL in other groups).
ALTER TABLE deliveries ADD COLUMN key TEXT

-- name: add_retention_max_age
-- Schema 8: no stream of an older file has a retention policy.
ALTER TABLE streams ADD COLUMN retention_max_age_ms INTEGER

-- name: add_retention_max_events
ALTER TABLE streams ADD COLUMN retention_max_events INTEGER

-- name: add_group_ordering
-- Schema 4: every group of an older file is unordered.
ALTER TABLE groups ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none'

-- name: add_group_pause
-- Schema 8: the end of a group's pause, ms (0: not paused; 2^62: until resumed).
ALTER TABLE groups ADD COLUMN paused_until_ms INTEGER NOT NULL DEFAULT 0

-- name: add_group_high_water
-- Schema 7: the mirrored high water, filled in below.
ALTER TABLE group_partitions ADD COLUMN high_water INTEGER NOT NULL DEFAULT 0

-- name: fill_group_high_water
UPDATE group_partitions SET high_water = (
    SELECT p.high_water FROM groups AS g
    JOIN partitions AS p ON p.stream_id = g.stream_id AND p.part = group_partitions.part
    WHERE g.id = group_partitions.group_id)

-- name: drop_key_settled_trigger
-- Schema 5: schema 4's triggers released a key on every settle or delete of any
-- group (several microseconds a row even when their WHEN was false); the
-- statements that settle a key-ordered group's delivery now release its key.
DROP TRIGGER IF EXISTS deliveries_key_settled

-- name: drop_key_removed_trigger
DROP TRIGGER IF EXISTS deliveries_key_removed

-- Connection settings -------------------------------------------------------------

-- Schema 8, delayed delivery: the time before which no group leases an event (NULL:
-- at once), the scheduled events by position (a fetch looks for those ahead of its
-- cursor with one probe per partition), and whether a stream ever had one (a fetch
-- of a stream that never had one does not look).
-- name: add_event_deliver_at
ALTER TABLE events ADD COLUMN deliver_at_ms INTEGER

-- name: index_events_scheduled
CREATE INDEX IF NOT EXISTS events_scheduled ON events (stream_id, part, seq, deliver_at_ms)
WHERE deliver_at_ms IS NOT NULL

-- name: add_stream_scheduled
ALTER TABLE streams ADD COLUMN scheduled INTEGER NOT NULL DEFAULT 0

-- name: get_version
PRAGMA user_version

-- name: table_info
PRAGMA table_info({table})

-- name: set_version
PRAGMA user_version = {version}

-- name: set_busy_timeout
PRAGMA busy_timeout = {ms}

-- name: set_wal
PRAGMA journal_mode = WAL

-- name: set_synchronous
PRAGMA synchronous = {mode}
