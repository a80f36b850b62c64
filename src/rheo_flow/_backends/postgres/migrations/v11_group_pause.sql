-- Migration 11: a group may be paused (docs/concepts.md, "Pausing a group").
--
-- paused_until_ms is the end of the pause in ms since the epoch on the database
-- clock: 0 when the group is not paused, 2^62 when it is paused until resumed.
-- fetch reads it with the rest of the group's row (functions/fetch.sql) and
-- returns nothing while it lies ahead: no other statement or index changes.

ALTER TABLE {s}.groups ADD COLUMN paused_until_ms bigint NOT NULL DEFAULT 0;
