-- Migration 7: a key-ordered group's fetch reads only the keyed deliveries it may
-- lease. An event stored behind an earlier unsettled one of its key is *held*:
-- available_at_ms is the largest bigint (functions/fetch_keyed.sql), and the
-- statement that settles or removes the delivery before it makes it due. The
-- partial index holds the available keyed deliveries that are not held (a
-- nack's redelivery, a redriven dead letter, a key's head), by sequence, so a
-- fetch no longer visits every key with an event waiting; it replaces
-- deliveries_waiting. Rows stored by an earlier version are not held: they stay
-- in the index and are checked to head their key, as before. Building it reads
-- the deliveries table once (under the migration's lock).

CREATE INDEX deliveries_ready ON {s}.deliveries (group_id, part, seq)
    WHERE state = 0 AND key IS NOT NULL AND available_at_ms < 9223372036854775807;

-- The held deliveries alone, by key: a settle that finds none of its groups' in
-- it (every settle while keys do not repeat among the deliveries in flight)
-- releases nothing, and a release finds a key's first held delivery here.
CREATE INDEX deliveries_held ON {s}.deliveries (group_id, part, key, seq)
    WHERE state = 0 AND available_at_ms = 9223372036854775807;

DROP INDEX {s}.deliveries_waiting;

-- fetch_scan returns whether each blocked event is held: a new result type,
-- which CREATE OR REPLACE cannot give an existing function.
DROP FUNCTION IF EXISTS {s}.fetch_scan(integer, integer, integer, integer[], bigint[], bigint[],
                                       integer[]);
