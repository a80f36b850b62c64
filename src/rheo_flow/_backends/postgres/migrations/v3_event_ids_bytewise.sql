-- Migration 3: event ids are compared bytewise (the "C" collation): every append
-- walks the unique (stream, event id) index once per event, and under a libc
-- collation other than "C" each comparison on the way is a strcoll() call.
-- Equality, and so idempotency, is the same under any deterministic collation;
-- only the index (rebuilt here) and the order of ids change, and nothing orders
-- by id.

ALTER TABLE {s}.events ALTER COLUMN event_id TYPE text COLLATE "C";
