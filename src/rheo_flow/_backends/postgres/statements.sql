-- Every statement the PostgreSQL backend runs, one per "-- name:" section.
-- {s} stands for the quoted schema name; everything else travels as bind
-- parameters. Comment lines are documentation and are not sent. The lock order
-- every statement follows is described in _migrations.py. Codes are named as
-- in the functions (functions/states.sql): {s}.delivery_rejected(), not 3.

-- Streams ---------------------------------------------------------------------

-- name: stream
SELECT id, partitions, created_at_ms FROM {s}.streams WHERE name = $1

-- name: insert_stream
INSERT INTO {s}.streams (name, partitions, created_at_ms)
VALUES ($1, $2, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (name) DO NOTHING
RETURNING id, partitions, created_at_ms

-- name: insert_partitions
INSERT INTO {s}.partitions (stream_id, part) SELECT $1, generate_series(0, $2 - 1)

-- name: partitions
SELECT p.part, p.high_water, p.low_water, s.retention_max_age_ms, s.retention_max_events
FROM {s}.partitions p JOIN {s}.streams s ON s.id = p.stream_id
WHERE p.stream_id = $1 ORDER BY p.part

-- name: set_retention
UPDATE {s}.streams SET retention_max_age_ms = $2, retention_max_events = $3
WHERE name = $1 RETURNING id

-- name: server_now
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint

-- name: list_streams
SELECT name FROM {s}.streams ORDER BY name COLLATE "C"

-- Every stream with its partitions' waters, and then every group: what
-- `rheo-flow streams` lists, in two statements however many streams there are.
-- The waters come as one JSON text of [part, high water, low water] triples:
-- asyncpg decodes integer arrays only after looking their types up, a query of
-- its own (~15 ms for integer[] and bigint[]) on each new connection, which was
-- most of a one-off listing's time in the database.
-- name: describe_streams
SELECT s.name, s.partitions, s.created_at_ms, s.retention_max_age_ms, s.retention_max_events,
       json_agg(json_build_array(p.part, p.high_water, p.low_water) ORDER BY p.part)
           AS waters
FROM {s}.streams s JOIN {s}.partitions p ON p.stream_id = s.id
GROUP BY s.id ORDER BY s.name COLLATE "C"

-- name: describe_groups
SELECT s.name AS stream, g.name, g.max_attempts, g.created_at_ms, g.ordering,
       g.paused_until_ms, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
FROM {s}.groups g JOIN {s}.streams s ON s.id = g.stream_id
ORDER BY g.name COLLATE "C"

-- The append (functions/append_guarded.sql): numbers new events under the
-- partition row locks (taken in partition order), inserts them, moves the high
-- water, and sends ONE notification. The batch travels as a few texts, not as
-- arrays asyncpg encodes element by element: partitions as an array literal, ids,
-- types and keys as JSON arrays of strings, and the events' data as one JSON array
-- of their JSON texts (each element reaches the table exactly as encoded);
-- headers, rarely set, as an array of JSON texts (every parameter typed text: a
-- json codec the application set on its own connection, used by the outbox, never
-- re-encodes them); the times of scheduled events as an array literal. A
-- duplicate event id appends nothing and answers o_duplicate (in a subtransaction
-- of the function's: the application's transaction goes on): the caller then
-- separates the ids already stored and appends the rest.
-- name: append
SELECT o_appended_at_ms, o_seqs, o_duplicate
FROM {s}.append_guarded($1, $2, $3, $4, $5, $6, $7::text[], $8, $9, $10)

-- The append of one event (functions/append_guarded.sql, append_one): the same
-- answer for one event, without a subtransaction; every parameter of the event's
-- text typed text, as above.
-- name: append_one
SELECT o_appended_at_ms, o_seq, o_duplicate
FROM {s}.append_one($1, $2, $3::text, $4::text, $5::text, $6::text, $7::text, $8, $9, $10)

-- Before a stream's first scheduled event is appended (its own transaction, committed
-- first): from then on its fetches look for scheduled events (functions/fetch.sql).
-- name: mark_scheduled
UPDATE {s}.streams SET scheduled = true WHERE id = $1 AND NOT scheduled

-- Per partition ($2) the events after $3 (aligned) scheduled later than now.
-- name: scheduled_counts
SELECT k.part, (SELECT count(*) FROM {s}.events e
                WHERE e.stream_id = $1 AND e.part = k.part AND e.seq > k.after
                  AND e.deliver_at_ms IS NOT NULL
                  AND e.deliver_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
FROM unnest($2::integer[], $3::bigint[]) AS k(part, after)

-- What a connection reaches, to tell whether an application's connection is on the
-- backend's database (the outbox, _outbox.py): the database, the server's start time
-- in microseconds (a fingerprint of the server any role may read) and the oid of the
-- backend's schema there ($1, NULL when missing); all as text, whatever codecs the
-- connection has.
-- name: database_identity
SELECT current_database()::text AS database,
       (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text AS started,
       (SELECT n.oid::text FROM pg_namespace n WHERE n.nspname = $1) AS schema_oid

-- name: stored_events
SELECT part, seq, event_id, type, key, data::text, headers::text, appended_at_ms
FROM {s}.events WHERE stream_id = $1 AND event_id = ANY($2::text[])

-- A filter left NULL matches every event.
-- name: query_events
SELECT part, seq, event_id, type, key, data::text, headers::text, appended_at_ms
FROM {s}.events WHERE stream_id = $1 AND part = $2 AND seq BETWEEN $3 AND $4
    AND ($6::text IS NULL OR key = $6) AND ($7::text IS NULL OR type = $7)
    AND ($8::bigint IS NULL OR appended_at_ms >= $8)
    AND ($9::bigint IS NULL OR appended_at_ms < $9)
ORDER BY seq LIMIT $5

-- Groups ----------------------------------------------------------------------

-- A group's row, with the database clock (ms) its pause is told paused or not by.
-- name: group
SELECT g.id, g.max_attempts, g.created_at_ms, g.ordering, g.paused_until_ms,
       (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
FROM {s}.groups g WHERE g.stream_id = $1 AND g.name = $2

-- The end of the pause of group $5 of stream $1, ms ($2; 0: not paused, 2^62: until
-- resumed); a resume notifies the stream's channel ($3, payload $4: the stream's
-- name) so that consumers waiting on it fetch at once.
-- name: set_group_pause
UPDATE {s}.groups SET paused_until_ms = $2::bigint WHERE stream_id = $1 AND name = $5
RETURNING id, max_attempts, created_at_ms, ordering, paused_until_ms,
          (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms,
          CASE WHEN $2::bigint = 0 THEN pg_notify($3, $4) END AS notified

-- name: groups_by_name
SELECT u.stream, u.grp AS group_name, g.id AS group_id, s.partitions, s.id AS stream_id,
       s.created_at_ms
FROM unnest($1::text[], $2::text[]) AS u(stream, grp)
JOIN {s}.streams s ON s.name = u.stream
JOIN {s}.groups g ON g.stream_id = s.id AND g.name = u.grp

-- A group's ordering ($4): 0 none, 1 key (ordering_none(), ordering_by_key(): schema
-- version 5, functions/states.sql).
-- name: insert_group
INSERT INTO {s}.groups (stream_id, name, max_attempts, created_at_ms, ordering)
VALUES ($1, $2, $3, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, $4)
ON CONFLICT (stream_id, name) DO NOTHING
RETURNING id, max_attempts, created_at_ms, ordering, paused_until_ms, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms

-- A new group's cursors and frontiers start at the position ($3; NULL: the high
-- water), never below the low water.
-- name: start_cursors
INSERT INTO {s}.cursors (group_id, part, cursor)
SELECT $1, p.part,
       GREATEST(p.low_water - 1, LEAST(COALESCE($3::bigint, p.high_water), p.high_water))
FROM {s}.partitions p WHERE p.stream_id = $2

-- name: start_frontiers
INSERT INTO {s}.frontiers (group_id, part, frontier)
SELECT $1, p.part,
       GREATEST(p.low_water - 1, LEAST(COALESCE($3::bigint, p.high_water), p.high_water))
FROM {s}.partitions p WHERE p.stream_id = $2

-- name: set_max_attempts
UPDATE {s}.groups SET max_attempts = $2 WHERE id = $1
RETURNING id, max_attempts, created_at_ms, ordering, paused_until_ms, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms

-- name: list_groups
SELECT name, max_attempts, created_at_ms, ordering, paused_until_ms, (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
FROM {s}.groups WHERE stream_id = $1 ORDER BY name COLLATE "C"

-- Leases ----------------------------------------------------------------------

-- A settle or renew batch travels as five array literals (text the server
-- parses), not as arrays asyncpg encodes element by element: every element is
-- an integer or a validated 32-digit hex lease id, so the literals need no quoting.
-- name: fetch
SELECT * FROM {s}.fetch($1, $2, $3, $4, $5)

-- name: settle
SELECT * FROM {s}.settle($1, $2::text::integer[], $3::text::integer[], $4::text::bigint[],
                         $5::text::uuid[], $6::text::integer[], $7, $8, $9)

-- The acks of a batch of one group, per range (functions/ack_ranges.sql).
-- name: ack_ranges
SELECT * FROM {s}.ack_ranges($1, $2::text::integer[], $3::text::text[], $4::text::integer[],
                             $5::text::bigint[], $6::text::bigint[], $7::text::varbit[],
                             $8::text::integer[])

-- The acks of a batch per range and the next fetch, in one call.
-- name: ack_ranges_fetch
SELECT * FROM {s}.ack_ranges_fetch($1::text::integer[], $2::text::text[], $3::text::integer[],
                                   $4::text::bigint[], $5::text::bigint[], $6::text::varbit[],
                                   $7::text::integer[], $8, $9, $10, $11, $12)

-- The acks of a batch and the next fetch, in one call (functions/ack_fetch.sql).
-- name: ack_fetch
SELECT * FROM {s}.ack_fetch($1::text::integer[], $2::text::integer[], $3::text::bigint[],
                            $4::text::uuid[], $5::text::integer[], $6, $7, $8, $9, $10)

-- name: renew
SELECT * FROM {s}.renew($1::text::integer[], $2::text::integer[], $3::text::bigint[],
                        $4::text::uuid[], $5::text::integer[], $6)

-- Progress --------------------------------------------------------------------

-- name: frontier
SELECT part, frontier FROM {s}.frontiers WHERE group_id = $1 ORDER BY part

-- name: stream_frontiers
-- Every group's frontier of stream $1, by group name and partition.
SELECT g.name, f.part, f.frontier FROM {s}.groups AS g
JOIN {s}.frontiers AS f ON f.group_id = g.id
WHERE g.stream_id = $1 ORDER BY g.name COLLATE "C", f.part

-- Every group's lag of the streams named in $1 (a JSON array of names; NULL: every
-- stream), one row per partition (functions/lag_report.sql). The names travel as JSON
-- text, not text[]: see describe_streams on asyncpg's array type lookups.
-- name: lag_report
SELECT * FROM {s}.lag_report(CASE WHEN $1::text IS NULL THEN NULL
                                  ELSE ARRAY(SELECT json_array_elements_text($1::text::json))
                             END)

-- name: dead_letters
SELECT d.part, d.seq, e.event_id, d.attempt, d.reason, d.rejected_at_ms, d.last_error
FROM {s}.deliveries d JOIN {s}.events e
    ON e.stream_id = $2 AND e.part = d.part AND e.seq = d.seq
WHERE d.group_id = $1 AND d.state = {s}.delivery_rejected() AND (d.part, d.seq) > ($3, $4)
ORDER BY d.part, d.seq LIMIT $5

-- Dead letters back to available, attempt 0: all of the group's ($2 NULL) or
-- those at the positions ($2, $3); the frontiers drop below the lowest.
-- name: redrive
WITH back AS (
    UPDATE {s}.deliveries d SET state = {s}.delivery_available(), attempt = 0, lease_id = NULL,
        settled_by = NULL, reason = '', last_error = NULL,
        available_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    WHERE d.group_id = $1 AND d.state = {s}.delivery_rejected()
        AND ($2::integer[] IS NULL OR (d.part, d.seq) IN (SELECT u.p, u.s FROM
            unnest($2::integer[], $3::bigint[]) AS u(p, s)))
    RETURNING d.part, d.seq
), lowered AS (
    UPDATE {s}.frontiers f SET frontier = LEAST(f.frontier, m.low - 1)
    FROM (SELECT back.part, min(back.seq) AS low FROM back GROUP BY back.part) m
    WHERE f.group_id = $1 AND f.part = m.part
)
SELECT count(*) FROM back

-- Replay and reset take the cursor rows first (the lock order of every claim),
-- then the frontier rows before moving them.
-- name: lock_cursors
SELECT 1 FROM {s}.cursors WHERE group_id = $1 AND part = ANY($2::integer[])
ORDER BY part FOR UPDATE

-- name: lock_frontiers
SELECT 1 FROM {s}.frontiers WHERE group_id = $1 AND part = ANY($2::integer[])
ORDER BY part FOR UPDATE

-- Trimmed events are gone and count as settled: replay starts at the low water.
-- name: replay_starts
SELECT part, GREATEST($3::bigint, low_water) AS position FROM {s}.partitions
WHERE stream_id = $1 AND part = ANY($2::integer[]) ORDER BY part

-- Deleting a delivery fences its lease; it is materialised again, attempt 1.
-- Ranges from the start on go; a range across it keeps the events before it.
-- name: replay_deliveries
WITH gone AS (
    DELETE FROM {s}.ranges r USING unnest($2::integer[], $3::bigint[]) AS u(p, s)
    WHERE r.group_id = $1 AND r.part = u.p AND r.first_seq >= u.s
), cut AS (
    UPDATE {s}.ranges r SET last_seq = u.s - 1,
        done = substring(r.done FROM 1 FOR (u.s - r.first_seq)::integer),
        pending = length(replace(substring(r.done FROM 1 FOR (u.s - r.first_seq)::integer)::text,
                                 '1', ''))
    FROM unnest($2::integer[], $3::bigint[]) AS u(p, s)
    WHERE r.group_id = $1 AND r.part = u.p AND r.first_seq < u.s AND r.last_seq >= u.s
)
DELETE FROM {s}.deliveries d USING unnest($2::integer[], $3::bigint[]) AS u(p, s)
WHERE d.group_id = $1 AND d.part = u.p AND d.seq >= u.s

-- name: lower_cursors
UPDATE {s}.cursors t SET cursor = LEAST(t.cursor, u.s - 1)
FROM unnest($2::integer[], $3::bigint[]) AS u(p, s) WHERE t.group_id = $1 AND t.part = u.p

-- name: lower_frontiers
UPDATE {s}.frontiers t SET frontier = LEAST(t.frontier, u.s - 1)
FROM unnest($2::integer[], $3::bigint[]) AS u(p, s) WHERE t.group_id = $1 AND t.part = u.p

-- name: reset_positions
SELECT part,
       GREATEST(low_water - 1, LEAST(COALESCE($3::bigint, high_water), high_water)) AS position
FROM {s}.partitions WHERE stream_id = $1 AND part = ANY($2::integer[]) ORDER BY part

-- name: reset_deliveries
WITH gone AS (
    DELETE FROM {s}.ranges r USING unnest($2::integer[]) AS u(p)
    WHERE r.group_id = $1 AND r.part = u.p
)
DELETE FROM {s}.deliveries d USING unnest($2::integer[], $3::bigint[]) AS u(p, s)
WHERE d.group_id = $1 AND d.part = u.p

-- name: set_cursors
UPDATE {s}.cursors t SET cursor = u.s
FROM unnest($2::integer[], $3::bigint[]) AS u(p, s) WHERE t.group_id = $1 AND t.part = u.p

-- name: set_frontiers
UPDATE {s}.frontiers t SET frontier = u.s
FROM unnest($2::integer[], $3::bigint[]) AS u(p, s) WHERE t.group_id = $1 AND t.part = u.p

-- Deletion --------------------------------------------------------------------

-- Locking the stream row first orders a deletion against appends and group creation.
-- name: lock_stream
SELECT id FROM {s}.streams WHERE name = $1 FOR UPDATE

-- name: lock_stream_of_group
SELECT s.id AS stream_id, g.id AS group_id FROM {s}.streams s LEFT JOIN {s}.groups g
    ON g.stream_id = s.id AND g.name = $2
WHERE s.name = $1 FOR UPDATE OF s

-- name: stream_groups
SELECT id FROM {s}.groups WHERE stream_id = $1 ORDER BY id

-- name: delete_deliveries
WITH gone AS (DELETE FROM {s}.ranges WHERE group_id = ANY($1::integer[]))
DELETE FROM {s}.deliveries WHERE group_id = ANY($1::integer[])

-- name: delete_frontiers
DELETE FROM {s}.frontiers WHERE group_id = ANY($1::integer[])

-- name: delete_cursors
DELETE FROM {s}.cursors WHERE group_id = ANY($1::integer[])

-- name: delete_groups
DELETE FROM {s}.groups WHERE id = ANY($1::integer[])

-- name: delete_events
DELETE FROM {s}.events WHERE stream_id = $1

-- name: delete_partitions
DELETE FROM {s}.partitions WHERE stream_id = $1

-- name: delete_stream
DELETE FROM {s}.streams WHERE id = $1

-- Trimming --------------------------------------------------------------------

-- name: lock_partitions
SELECT part, high_water FROM {s}.partitions WHERE stream_id = $1
    AND part = ANY($2::integer[]) ORDER BY part FOR UPDATE

-- Removes the events up to each partition's bound; the count removed by partition.
-- name: trim_events
WITH gone AS (
    DELETE FROM {s}.events e USING unnest($2::integer[], $3::bigint[]) AS u(p, b)
    WHERE e.stream_id = $1 AND e.part = u.p AND e.seq <= u.b
    RETURNING e.part
) SELECT gone.part, count(*) AS removed FROM gone GROUP BY gone.part

-- name: raise_low_water
UPDATE {s}.partitions p SET low_water = GREATEST(p.low_water, u.b + 1)
FROM unnest($2::integer[], $3::bigint[]) AS u(p, b)
WHERE p.stream_id = $1 AND p.part = u.p

-- Deliveries of removed events are dropped (fencing their leases) and count as
-- settled: each group's cursors and frontiers move up to the bound, then on.
-- The (group, partition, bound) triples arrive in key order.
-- name: lock_trimmed_cursors
SELECT 1 FROM {s}.cursors c JOIN unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)
    ON c.group_id = u.g AND c.part = u.p
ORDER BY c.group_id, c.part FOR UPDATE OF c

-- The keys of the unsettled deliveries of key-ordered groups it removed are
-- released (release_keys) once it is done. Ranges up to the bound go; a range
-- across it keeps the events after it.
-- name: trim_deliveries
WITH dropped AS (
    DELETE FROM {s}.ranges r USING unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)
    WHERE r.group_id = u.g AND r.part = u.p AND r.last_seq <= u.b
), cut AS (
    UPDATE {s}.ranges r SET first_seq = u.b + 1,
        done = substring(r.done FROM (u.b - r.first_seq + 2)::integer),
        pending = length(replace(substring(r.done FROM (u.b - r.first_seq + 2)::integer)::text,
                                 '1', ''))
    FROM unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)
    WHERE r.group_id = u.g AND r.part = u.p AND r.first_seq <= u.b AND r.last_seq > u.b
), gone AS (
    DELETE FROM {s}.deliveries d
    USING unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)
    WHERE d.group_id = u.g AND d.part = u.p AND d.seq <= u.b
    RETURNING d.group_id, d.part, d.key, d.state
)
SELECT array_agg(gone.group_id) AS groups, array_agg(gone.part) AS parts,
       array_agg(gone.key) AS keys
FROM gone WHERE gone.key IS NOT NULL AND gone.state < {s}.delivery_acked()

-- name: release_keys
SELECT {s}.release_keys($1::integer[], $2::integer[], $3::text[],
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint)

-- name: raise_cursors
UPDATE {s}.cursors c SET cursor = GREATEST(c.cursor, u.b)
FROM unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)
WHERE c.group_id = u.g AND c.part = u.p

-- name: lock_trimmed_frontiers
SELECT 1 FROM {s}.frontiers f JOIN unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)
    ON f.group_id = u.g AND f.part = u.p
ORDER BY f.group_id, f.part FOR UPDATE OF f

-- name: raise_frontiers
UPDATE {s}.frontiers f SET frontier = GREATEST(f.frontier, u.b)
FROM unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)
WHERE f.group_id = u.g AND f.part = u.p

-- name: advance_frontiers
SELECT {s}.advance_frontiers($1::integer[], $2::integer[])

-- Schema versions -------------------------------------------------------------

-- name: schema_version
SELECT COALESCE(max(version), 0) FROM {s}.rheo_schema_version

-- Several processes may start at once: one migrates, the others wait on this
-- lock (released with the transaction) and then find the schema current.
-- name: migration_lock
SELECT pg_advisory_xact_lock(hashtextextended($1, 0))

-- name: table_exists
SELECT to_regclass($1) IS NOT NULL

-- Whether the schema has the named codes of functions/states.sql ($1: its held()).
-- name: has_named_codes
SELECT to_regprocedure($1) IS NOT NULL

-- name: record_version
INSERT INTO {s}.rheo_schema_version (version, description) VALUES ($1, $2)
