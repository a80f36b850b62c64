-- Migration 6: key-ordered groups find the deliveries they may lease again
-- without reading the keys that only have leases in flight. The partial index
-- holds only the available keyed deliveries (a nack's redelivery, a redriven
-- dead letter, the events waiting behind an earlier one of their key), so a
-- fetch visits one entry per key with an available delivery (none at all while
-- every key has at most one delivery in flight). Building it reads the
-- deliveries table once (under the migration's lock). fetch no longer has a
-- seven-argument overload for key-ordered groups: functions/fetch_keyed.sql
-- defines the steps fetch calls instead.

CREATE INDEX deliveries_waiting ON {s}.deliveries (group_id, part, key, seq)
    WHERE state = 0 AND key IS NOT NULL;

DROP FUNCTION IF EXISTS {s}.fetch(integer, integer[], integer, bigint, text, integer, integer);
