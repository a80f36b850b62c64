-- Migration 8: range leases for unordered groups (functions/fetch.sql).
-- A fetch of an unordered group stores one row here per partition it leases new
-- events from: the range first_seq .. last_seq, leased as a whole under one
-- token and attempt until one deadline, with a bit per event set once the range
-- no longer governs it (acked, or split off into a delivery row by a nack, a
-- reject, a dead letter or a renew of part of the range). Leases stay unique per
-- event and attempt: an event's lease id is the range's token (12 bytes: 8
-- random per fetch, 4 for the range's place in it) followed by its offset from
-- base_seq (4 bytes, big-endian).
--
-- Delivery rows keep their meaning: a key-ordered group's deliveries, the events
-- a range split off, and the rows earlier versions stored (leases in flight
-- across the upgrade settle, expire and are leased again as before). An event is
-- governed by its delivery row when it has one, else by the range holding it
-- with its bit clear; with its bit set and no row, it is acked.
--
-- Fully settled ranges stay (pending 0, only in the primary key) so that an ack
-- repeated later answers as repeated; trim, replay, reset and deletion remove
-- them. ranges_open holds the ranges with events in flight, by sequence (expiry,
-- frontiers); ranges_token finds them by token (settles, renewals).

CREATE TABLE {s}.ranges (
    group_id integer NOT NULL,
    part integer NOT NULL,
    first_seq bigint NOT NULL,
    last_seq bigint NOT NULL,
    base_seq bigint NOT NULL,
    token bytea NOT NULL,
    attempt integer NOT NULL,
    deadline_ms bigint NOT NULL,
    consumer_id text,
    done varbit NOT NULL,
    pending integer NOT NULL CHECK (pending >= 0),
    PRIMARY KEY (group_id, part, first_seq)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

CREATE INDEX ranges_open ON {s}.ranges (group_id, part, first_seq) WHERE pending > 0;

CREATE INDEX ranges_token ON {s}.ranges (group_id, part, token) WHERE pending > 0;
