-- Every statement the SQLite backend's operations run (the schema is in schema.sql).
--
-- Each statement follows the "-- name:" line that names it (_sql.py loads them);
-- comment lines are left out of the statement text. {name} is another piece of
-- this file when one has that name (spliced in on loading), else a slot filled in
-- with str.format where the statement is used. Parameters are SQLite's own ? / ?N.

-- Transactions --------------------------------------------------------------------

-- name: begin_read
BEGIN

-- name: begin_write
-- IMMEDIATE takes the write lock before reading anything.
BEGIN IMMEDIATE

-- name: commit
COMMIT

-- name: rollback
ROLLBACK

-- name: savepoint
SAVEPOINT rheo_settle

-- name: rollback_to_savepoint
ROLLBACK TO rheo_settle

-- name: release_savepoint
RELEASE rheo_settle

-- name: savepoint_outbox
-- Around an operation in the application's transaction (_outbox.py): an error
-- undoes the operation's statements only, leaving the application's own.
SAVEPOINT rheo_outbox

-- name: rollback_to_savepoint_outbox
ROLLBACK TO rheo_outbox

-- name: release_savepoint_outbox
RELEASE rheo_outbox

-- name: take_write_lock
-- Changes nothing, but a write statement: the application's transaction takes the
-- write lock (waiting up to its connection's busy timeout) before anything is read.
UPDATE partitions SET high_water = high_water WHERE 0

-- name: database_list
PRAGMA database_list

-- Streams and partitions ----------------------------------------------------------

-- name: find_stream
SELECT id, name, partitions, created_at_ms, retention_max_age_ms, retention_max_events
FROM streams WHERE name = ?

-- name: set_retention
UPDATE streams SET retention_max_age_ms = ?, retention_max_events = ? WHERE id = ?

-- name: insert_stream
INSERT INTO streams (name, partitions, created_at_ms) VALUES (?, ?, ?)

-- name: insert_partition
INSERT INTO partitions (stream_id, part) VALUES (?, ?)

-- name: list_streams
SELECT name FROM streams ORDER BY name

-- name: waters
SELECT part, high_water, low_water FROM partitions WHERE stream_id = ? ORDER BY part

-- name: high_waters
SELECT part, high_water FROM partitions WHERE stream_id = ?

-- name: set_high_water
UPDATE partitions SET high_water = ? WHERE stream_id = ? AND part = ?

-- name: mirror_high_water
-- The same high water into the partition's row of every group of the stream
-- (group_partitions.high_water), in the append's transaction.
UPDATE group_partitions SET high_water = ?1
WHERE part = ?3 AND group_id IN (SELECT id FROM groups WHERE stream_id = ?2)

-- name: set_low_water
UPDATE partitions SET low_water = ? WHERE stream_id = ? AND part = ?

-- name: group_ids
-- A stream's groups: id and ordering.
SELECT id, ordering FROM groups WHERE stream_id = ?

-- name: delete_stream_events
DELETE FROM events WHERE stream_id = ?

-- name: delete_stream_partitions
DELETE FROM partitions WHERE stream_id = ?

-- name: delete_stream
DELETE FROM streams WHERE id = ?

-- Events --------------------------------------------------------------------------

-- name: event_columns
-- The columns events are decoded from (_events.decode), in this order.
part, seq, event_id, type, key, data, headers, appended_at_ms

-- name: insert_event
INSERT INTO events (stream_id, part, seq, event_id, type, key, data, headers, appended_at_ms,
                    deliver_at_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: mark_scheduled
-- The stream holds scheduled events from now on: its fetches look for them.
UPDATE streams SET scheduled = 1 WHERE id = ? AND scheduled = 0

-- name: scheduled_after
-- A partition's scheduled events not due at ?4, past sequence ?3 (events_scheduled).
SELECT seq, deliver_at_ms FROM events INDEXED BY events_scheduled
WHERE stream_id = ?1 AND part = ?2 AND seq > ?3 AND deliver_at_ms IS NOT NULL
  AND deliver_at_ms > ?4
ORDER BY seq LIMIT ?5

-- name: count_scheduled_after
SELECT count(*) FROM events INDEXED BY events_scheduled
WHERE stream_id = ?1 AND part = ?2 AND seq > ?3 AND deliver_at_ms IS NOT NULL
  AND deliver_at_ms > ?4

-- name: insert_new_event
-- An id the stream already holds is skipped (the caller sees it in the change count).
{insert_event} ON CONFLICT (stream_id, event_id) DO NOTHING

-- name: delete_events_after
DELETE FROM events WHERE stream_id = ? AND part = ? AND seq > ?

-- name: delete_events_up_to
DELETE FROM events WHERE stream_id = ? AND part = ? AND seq <= ?

-- name: events_by_id
-- {values}: an IN list (_sql.in_lists).
SELECT {event_columns} FROM events WHERE stream_id = ? AND event_id IN {values}

-- name: events_by_sequence
SELECT {event_columns} FROM events WHERE stream_id = ? AND part = ? AND seq IN {values}

-- name: events_between
SELECT {event_columns} FROM events WHERE stream_id = ? AND part = ? AND seq BETWEEN ? AND ?
ORDER BY seq

-- name: query_events
-- {filters}: the query's conditions among the four below, each with its value.
SELECT {event_columns} FROM events
WHERE stream_id = ? AND part = ? AND seq BETWEEN ? AND ?{filters}
ORDER BY seq LIMIT ?

-- name: with_key
 AND key = ?

-- name: with_type
 AND type = ?

-- name: appended_since
 AND appended_at_ms >= ?

-- name: appended_before
 AND appended_at_ms < ?

-- Groups --------------------------------------------------------------------------

-- name: find_group
SELECT id, max_attempts, created_at_ms, ordering, paused_until_ms FROM groups
WHERE stream_id = ? AND name = ?

-- name: group_of_stream
-- The stream, and its group if there is one (NULLs otherwise), in one statement.
SELECT s.id, s.partitions, s.created_at_ms, g.id, g.max_attempts, g.created_at_ms, g.ordering,
       g.paused_until_ms
FROM streams AS s LEFT JOIN groups AS g ON g.stream_id = s.id AND g.name = ?
WHERE s.name = ?

-- name: set_max_attempts
UPDATE groups SET max_attempts = ? WHERE id = ?

-- name: insert_group
INSERT INTO groups (stream_id, name, max_attempts, created_at_ms, ordering)
VALUES (?, ?, ?, ?, ?)

-- name: insert_group_partition
INSERT INTO group_partitions (group_id, part, cursor, frontier, high_water)
VALUES (?, ?, ?, ?, ?)

-- name: list_groups
SELECT name, max_attempts, created_at_ms, ordering, paused_until_ms FROM groups
WHERE stream_id = ? ORDER BY name

-- name: set_group_pause
-- The end of group ?2's pause, ms (0: not paused; 2^62: until resumed).
UPDATE groups SET paused_until_ms = ?1 WHERE id = ?2

-- name: delete_group_deliveries
DELETE FROM deliveries WHERE group_id = ?

-- name: delete_group_ranges
DELETE FROM ranges WHERE group_id = ?

-- name: delete_group_partitions
DELETE FROM group_partitions WHERE group_id = ?

-- name: delete_group
DELETE FROM groups WHERE id = ?

-- Fetch ---------------------------------------------------------------------------

-- name: fetch_group
-- What fetch needs of the group: its id, max attempts, stream id, partition count,
-- ordering, the end of its pause, and whether the stream had scheduled events.
SELECT g.id, g.max_attempts, s.id, s.partitions, g.ordering, g.paused_until_ms, s.scheduled
FROM streams AS s
JOIN groups AS g ON g.stream_id = s.id AND g.name = ? WHERE s.name = ?

-- name: due
-- When an unsettled delivery is next eligible; spelt exactly as schema.sql's "due",
-- the expression the indexes deliveries_due and deliveries_group_due hold.
CASE state WHEN 'available' THEN available_at_ms ELSE deadline_ms END

-- name: partitions_with_work
-- The partitions where a fetch of group ?1 at time ?2 finds work, with their cursor
-- and high water: new events past the cursor (read on group_partitions_behind, so
-- a partition without them is never read), or a delivery row due (expired ranges:
-- expired_ranges). Whether any row of the group is due is one probe of
-- deliveries_group_due, in a subquery of one row or none that CROSS JOIN keeps
-- as the outer loop; only when one is due are the other partitions read, each
-- probed in deliveries_due. The
-- "<= ?2" bound stops both probes at the first row not yet due, so delayed and
-- held rows are never walked.
SELECT part, cursor, high_water FROM group_partitions INDEXED BY group_partitions_behind
WHERE group_id = ?1 AND cursor < high_water
UNION ALL
SELECT gp.part, gp.cursor, gp.high_water
FROM (SELECT 1 WHERE EXISTS (
          SELECT 1 FROM deliveries INDEXED BY deliveries_group_due
          WHERE group_id = ?1 AND state IN ('available', 'leased') AND {due} <= ?2)) AS due
CROSS JOIN group_partitions AS gp
WHERE gp.group_id = ?1 AND gp.cursor >= gp.high_water
  AND EXISTS (SELECT 1 FROM deliveries INDEXED BY deliveries_due
              WHERE group_id = ?1 AND part = gp.part AND state IN ('available', 'leased')
                AND {due} <= ?2)

-- name: eligible
-- The per-partition scan of fetch: the partition's due delivery rows with when each
-- became due, soonest first (which of several eligible redeliveries comes first is
-- the backend's choice; fetch leases what it takes in sequence order), read on
-- deliveries_due with "<= ?3" as the index bound: the scan never reaches a row not
-- yet due.
-- INDEXED BY makes a missing or unusable partial index an error instead of a
-- silent fall back to the primary key (which also walks acked rows).
SELECT {due}, seq, attempt FROM deliveries INDEXED BY deliveries_due
WHERE group_id = ?1 AND part = ?2 AND state IN ('available', 'leased') AND {due} <= ?3
ORDER BY {due}, seq

-- name: blocked
-- The available_at_ms of a delivery fetch stored blocked (2**62, never due by the
-- clock: _fetch_keyed.BLOCKED_MS) until a release makes it due. A piece, spliced
-- in as the literal so that SQLite plans with the constant.
4611686018427387904

-- name: eligible_by_key
-- The scan of a key-ordered group: due existing deliveries (as eligible reads them)
-- without an earlier unsettled delivery of their key (one probe of deliveries_keyed
-- each). Deliveries fetch stored blocked (available_at_ms {blocked}) are never due.
SELECT d.seq, d.attempt FROM deliveries AS d INDEXED BY deliveries_due
WHERE d.group_id = ?1 AND d.part = ?2 AND d.state IN ('available', 'leased')
  AND {due} <= ?3
  AND (d.key IS NULL OR NOT EXISTS (
      SELECT 1 FROM deliveries AS b INDEXED BY deliveries_keyed
      WHERE b.group_id = ?1 AND b.part = ?2 AND b.key = d.key AND b.key IS NOT NULL
        AND b.state IN ('available', 'leased') AND b.seq < d.seq))
ORDER BY {due}, d.seq

-- name: event_keys_after
-- A partition's events past a sequence, for a key-ordered group's fetch: each with
-- its key and whether the key has an unsettled delivery (one probe of
-- deliveries_keyed per event, in the statement). ?1 group, ?2 part, ?3 stream,
-- ?4 the sequence, ?5 how many; and whether it is scheduled later than ?6 (now).
SELECT e.seq, e.key, e.key IS NOT NULL AND EXISTS (
    SELECT 1 FROM deliveries AS d INDEXED BY deliveries_keyed
    WHERE d.group_id = ?1 AND d.part = ?2 AND d.key = e.key AND d.key IS NOT NULL
      AND d.state IN ('available', 'leased')),
    e.deliver_at_ms IS NOT NULL AND e.deliver_at_ms > ?6
FROM events AS e WHERE e.stream_id = ?3 AND e.part = ?2 AND e.seq > ?4
ORDER BY e.seq LIMIT ?5

-- name: store_blocked
-- A key-ordered group's new deliveries of ?3..?4 not leased by the fetch (which
-- inserted those first): stored blocked (available, attempt 0, available_at_ms
-- {blocked}) behind an earlier one of their key; a scheduled one not due at ?6
-- available at its time instead (never released early, and it holds its key).
INSERT INTO deliveries (group_id, part, seq, state, attempt, available_at_ms, key)
SELECT ?1, part, seq, 'available', 0,
       CASE WHEN deliver_at_ms > ?6 THEN deliver_at_ms ELSE {blocked} END, key
FROM events WHERE stream_id = ?5 AND part = ?2 AND seq BETWEEN ?3 AND ?4
ON CONFLICT (group_id, part, seq) DO NOTHING

-- name: release_key
-- The delivery ?1, ?2, ?3 of a key-ordered group was settled for good: the earliest
-- unsettled delivery of its key, if fetch stored it blocked, is eligible now.
-- Always safe to run: no earlier delivery of that key is unsettled.
UPDATE deliveries SET available_at_ms = 0
WHERE group_id = ?1 AND part = ?2 AND seq = (
    SELECT MIN(b.seq) FROM deliveries AS s
    JOIN deliveries AS b INDEXED BY deliveries_keyed
      ON b.group_id = ?1 AND b.part = ?2 AND b.key = s.key
    WHERE s.group_id = ?1 AND s.part = ?2 AND s.seq = ?3
      AND b.key IS NOT NULL AND b.state IN ('available', 'leased'))
  AND state = 'available' AND available_at_ms = {blocked}

-- name: has_blocked
-- Whether partition ?2 of key-ordered group ?1 holds a delivery fetch stored blocked.
-- Most hold none, and then a settle has no key to release: one probe of
-- deliveries_due (a blocked delivery is due at {blocked}, which no deadline
-- reaches) spares a release_key per settled delivery. The state IN test is the
-- partial index's own condition, which SQLite needs to see to use it.
SELECT 1 FROM deliveries INDEXED BY deliveries_due
WHERE group_id = ?1 AND part = ?2 AND state IN ('available', 'leased')
  AND {due} = {blocked} AND state = 'available'
LIMIT 1

-- name: release_heads
-- After a trim removed deliveries of a key-ordered group's partition: each blocked
-- delivery without an earlier unsettled one of its key is eligible now.
UPDATE deliveries SET available_at_ms = 0
WHERE group_id = ?1 AND part = ?2 AND state = 'available'
  AND available_at_ms = {blocked} AND key IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM deliveries AS b INDEXED BY deliveries_keyed
      WHERE b.group_id = ?1 AND b.part = ?2 AND b.key = deliveries.key
        AND b.key IS NOT NULL AND b.state IN ('available', 'leased')
        AND b.seq < deliveries.seq)

-- name: expire
-- A delivery whose lease expired at max attempts becomes what _transitions.expire says.
UPDATE deliveries SET state = ?, reason = ?, settled_by = ?, rejected_at_ms = ?
WHERE group_id = ? AND part = ? AND seq = ?

-- name: lease_again
UPDATE deliveries SET state = 'leased', attempt = ?, lease_id = ?, receipt = ?,
    consumer_id = ?, deadline_ms = ?, settled_by = NULL
WHERE group_id = ? AND part = ? AND seq = ?

-- name: new_lease_columns
group_id, part, seq, state, attempt, lease_id, receipt, consumer_id, deadline_ms

-- name: new_lease_values
?1, part, seq, 'leased', 1, ?2 || printf('%08x', seq - ?3 + ?4), part || '-' || seq || '-1',
       ?5, ?6

-- name: lease_new_keyed
-- New deliveries of a key-ordered group (an unordered group's are a range row,
-- insert_range), one partition's sequence range leased at once, each carrying its
-- event's key; ?2 is the fetch's lease id prefix, ?4 the number of the range's
-- first lease in the fetch. The lease id and receipt are built exactly as
-- _fetch_keyed.py builds them in Python.
INSERT INTO deliveries ({new_lease_columns}, key)
SELECT {new_lease_values}, key
FROM events WHERE stream_id = ?7 AND part = ?8 AND seq BETWEEN ?3 AND ?9

-- name: set_cursor
UPDATE group_partitions SET cursor = ? WHERE group_id = ? AND part = ?

-- Settle and renew ----------------------------------------------------------------

-- name: settle_group
SELECT g.id, g.max_attempts, s.partitions, g.ordering FROM streams AS s
JOIN groups AS g ON g.stream_id = s.id AND g.name = ? WHERE s.name = ?

-- name: fenced
-- Settles and renews of a batch of leases of one group: one fenced UPDATE run by
-- executemany, each row found by its primary key. ?1..?5 are the batch's
-- constants (reason, now, available at, max attempts, the max attempts reason),
-- ?6..?10 the lease's group, part, seq, lease id and receipt; ?11 a settle's error.
 WHERE group_id = ?6 AND part = ?7 AND seq = ?8 AND state = 'leased'
   AND lease_id = ?9 AND receipt = ?10

-- name: settle_ack
UPDATE deliveries SET state = 'acked', settled_by = 'ack', reason = ''{fenced}

-- name: settle_reject
UPDATE deliveries SET state = 'rejected', settled_by = 'reject', reason = ?1,
    rejected_at_ms = ?2, last_error = COALESCE(?11, last_error){fenced}

-- name: settle_nack
-- A nack of the last allowed attempt dead-letters the delivery.
UPDATE deliveries SET settled_by = 'nack',
    last_error = COALESCE(?11, last_error),
    state = CASE WHEN attempt >= ?4 THEN 'rejected' ELSE 'available' END,
    reason = CASE WHEN attempt >= ?4 THEN ?5 ELSE ?1 END,
    rejected_at_ms = CASE WHEN attempt >= ?4 THEN ?2 ELSE rejected_at_ms END,
    available_at_ms = CASE WHEN attempt >= ?4 THEN available_at_ms ELSE ?3 END{fenced}

-- name: renew
UPDATE deliveries SET deadline_ms = ?1{fenced}

-- name: delivery_rows
-- The columns of _deliveries.Row, in its order; {values}: an IN list.
SELECT seq, state, attempt, lease_id, receipt, settled_by, reason,
       available_at_ms, rejected_at_ms, deadline_ms, last_error
FROM deliveries WHERE group_id = ? AND part = ? AND seq IN {values}

-- name: write_back
UPDATE deliveries SET state = ?, reason = ?, settled_by = ?, available_at_ms = ?,
    rejected_at_ms = ?, deadline_ms = ?, last_error = ?
WHERE group_id = ? AND part = ? AND seq = ?

-- Progress ------------------------------------------------------------------------

-- name: advance_frontier
-- The frontier moved over the settled run after it (see _progress.advance_frontier):
-- up to the first pending delivery row, the first event in flight of the lowest
-- range with any ('0' in done), or the cursor, whichever comes first.
UPDATE group_partitions SET frontier = MAX(frontier, MIN(COALESCE((
    SELECT MIN(seq) - 1 FROM deliveries INDEXED BY deliveries_active
    WHERE group_id = ?1 AND part = ?2 AND state IN ('available', 'leased')), cursor),
    COALESCE((SELECT first_seq + instr(done, '0') - 2 FROM ranges INDEXED BY ranges_open
              WHERE group_id = ?1 AND part = ?2 AND pending > 0
              ORDER BY first_seq LIMIT 1), cursor)))
WHERE group_id = ?1 AND part = ?2

-- name: frontiers
SELECT part, frontier FROM group_partitions WHERE group_id = ? ORDER BY part

-- name: lag_report
-- Every group's lag, one row per partition (_lag.py), of the streams in the JSON
-- array ?2 (NULL: every stream), at the time ?1: per row, one descent of the events'
-- key for the first event past the frontier and, in a stream that ever had a
-- scheduled event, a count of events_scheduled past it; per group, a count of
-- deliveries_rejected (covering: the rejected rows alone).
WITH g AS MATERIALIZED (
    SELECT s.id AS sid, s.name AS sname, s.scheduled AS sched, g.id AS gid,
           g.name AS gname, g.paused_until_ms AS until_ms,
           (SELECT count(*) FROM deliveries AS d INDEXED BY deliveries_rejected
            WHERE d.group_id = g.id AND d.state = 'rejected') AS letters
    FROM streams AS s JOIN groups AS g ON g.stream_id = s.id
    WHERE ?2 IS NULL OR s.name IN (SELECT value FROM json_each(?2))
)
SELECT g.sname, g.gname, gp.part, p.high_water, gp.frontier,
       CASE WHEN g.sched AND p.high_water > gp.frontier THEN
           (SELECT count(*) FROM events AS e INDEXED BY events_scheduled
            WHERE e.stream_id = g.sid AND e.part = gp.part AND e.seq > gp.frontier
              AND e.deliver_at_ms IS NOT NULL AND e.deliver_at_ms > ?1)
       ELSE 0 END,
       CASE WHEN p.high_water > gp.frontier THEN
           (SELECT e.appended_at_ms FROM events AS e
            WHERE e.stream_id = g.sid AND e.part = gp.part AND e.seq > gp.frontier
            ORDER BY e.seq LIMIT 1)
       END,
       g.letters, g.until_ms
FROM g JOIN group_partitions AS gp ON gp.group_id = g.gid
JOIN partitions AS p ON p.stream_id = g.sid AND p.part = gp.part
ORDER BY g.sname, g.gname, gp.part

-- name: dead_letters
SELECT d.part, d.seq, e.event_id, d.attempt, d.reason, d.rejected_at_ms, d.last_error
FROM deliveries AS d INDEXED BY deliveries_rejected
JOIN events AS e ON e.stream_id = ? AND e.part = d.part AND e.seq = d.seq
WHERE d.group_id = ? AND d.state = 'rejected' AND (d.part, d.seq) > (?, ?)
ORDER BY d.part, d.seq LIMIT ?

-- name: redrive
-- Every dead letter of the group whose event is still stored starts over.
UPDATE deliveries SET state = 'available', attempt = 0, lease_id = NULL, receipt = NULL,
    settled_by = NULL, available_at_ms = ?, reason = '', last_error = NULL
WHERE group_id = ? AND state = 'rejected' AND EXISTS (SELECT 1 FROM events AS e
    WHERE e.stream_id = ? AND e.part = deliveries.part AND e.seq = deliveries.seq)

-- name: redrive_at
{redrive} AND part = ? AND seq = ?

-- name: frontier_before_pending
-- Redriven deliveries are pending again: the frontier cannot stay past them.
UPDATE group_partitions SET frontier = MIN(frontier, COALESCE((
    SELECT MIN(d.seq) - 1 FROM deliveries AS d INDEXED BY deliveries_active
    WHERE d.group_id = group_partitions.group_id AND d.part = group_partitions.part
      AND d.state IN ('available', 'leased')), frontier))
WHERE group_id = ?

-- name: delete_deliveries_from
DELETE FROM deliveries WHERE group_id = ? AND part = ? AND seq >= ?

-- name: delete_ranges_from
-- Replay: the ranges from ?3 on go; a range across it keeps the events before it.
DELETE FROM ranges WHERE group_id = ?1 AND part = ?2 AND first_seq >= ?3

-- name: cut_ranges_from
UPDATE ranges SET last_seq = ?3 - 1, done = substr(done, 1, ?3 - first_seq),
    pending = length(replace(substr(done, 1, ?3 - first_seq), '1', ''))
WHERE group_id = ?1 AND part = ?2 AND first_seq < ?3 AND last_seq >= ?3

-- name: rewind
UPDATE group_partitions SET cursor = MIN(cursor, ?), frontier = MIN(frontier, ?)
WHERE group_id = ? AND part = ?

-- name: delete_partition_deliveries
DELETE FROM deliveries WHERE group_id = ? AND part = ?

-- name: delete_partition_ranges
DELETE FROM ranges WHERE group_id = ? AND part = ?

-- name: move_to
UPDATE group_partitions SET cursor = ?, frontier = ? WHERE group_id = ? AND part = ?

-- name: delete_deliveries_up_to
DELETE FROM deliveries WHERE group_id = ? AND part = ? AND seq <= ?

-- name: delete_ranges_up_to
-- Trim: the ranges up to ?3 go; a range across it keeps the events after it.
DELETE FROM ranges WHERE group_id = ?1 AND part = ?2 AND last_seq <= ?3

-- name: cut_ranges_up_to
UPDATE ranges SET first_seq = ?3 + 1, done = substr(done, ?3 - first_seq + 2),
    pending = length(replace(substr(done, ?3 - first_seq + 2), '1', ''))
WHERE group_id = ?1 AND part = ?2 AND first_seq <= ?3 AND last_seq > ?3

-- name: catch_up
UPDATE group_partitions SET cursor = MAX(cursor, ?), frontier = MAX(frontier, ?)
WHERE group_id = ? AND part = ?

-- Range leases (_ranges.py) -------------------------------------------------------

-- name: range_columns
first_seq, last_seq, base_seq, token, attempt, deadline_ms, consumer_id, done, pending

-- name: expired_ranges
-- The group's ranges with events in flight past their deadline, by partition, then
-- soonest expired first: one probe of ranges_expiry when there are none.
SELECT part, {range_columns} FROM ranges INDEXED BY ranges_expiry
WHERE group_id = ? AND pending > 0 AND deadline_ms <= ?
ORDER BY part, deadline_ms, first_seq

-- name: ranges_by_token
SELECT {range_columns} FROM ranges INDEXED BY ranges_token
WHERE group_id = ? AND part = ? AND token = ? AND pending > 0

-- name: range_at
-- The range holding sequence ?3 of a partition, if any (settled ones included).
SELECT {range_columns} FROM ranges
WHERE group_id = ?1 AND part = ?2 AND first_seq <= ?3 ORDER BY first_seq DESC LIMIT 1

-- name: insert_range
INSERT INTO ranges (group_id, part, {range_columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: mark_range
UPDATE ranges SET done = ?, pending = ?, deadline_ms = ?
WHERE group_id = ? AND part = ? AND first_seq = ?

-- name: lease_range_again
-- An expired range leased again (cut at last_seq when the fetch took part of it).
UPDATE ranges SET last_seq = ?, done = ?, pending = ?, base_seq = first_seq, token = ?,
    attempt = ?, deadline_ms = ?, consumer_id = ?
WHERE group_id = ? AND part = ? AND first_seq = ?

-- name: split_delivery
-- An event a range no longer governs, as the delivery row it becomes; OR IGNORE
-- for the acked events of a range leased again (kept with their old lease), which
-- a row may hold already.
INSERT {conflict} INTO deliveries (group_id, part, seq, state, attempt, lease_id, receipt,
    consumer_id, deadline_ms, available_at_ms, settled_by, reason, rejected_at_ms, last_error)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
