-- Migration 11: a stream's retention policy (NULL: none; no existing stream has one).

ALTER TABLE {s}.streams ADD COLUMN IF NOT EXISTS retention_max_age_ms bigint;
ALTER TABLE {s}.streams ADD COLUMN IF NOT EXISTS retention_max_events bigint;
