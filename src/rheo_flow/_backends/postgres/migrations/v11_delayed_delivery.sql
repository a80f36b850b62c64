-- Migration 11 (with v11_group_pause.sql): delayed delivery (NewEvent(deliver_at=...), docs/contract.md,
-- "Delayed delivery").
--
-- events.deliver_at_ms is the time before which no group leases the event (NULL:
-- at once). events_scheduled indexes the events that have one, by position, so
-- that a fetch finds the scheduled events in the window it is about to lease
-- with one descent per partition (functions/fetch_scheduled.sql); it holds no
-- other event. streams.scheduled is set (for good) before the first scheduled
-- event of the stream is appended: a fetch of a stream that never had one does
-- not look.

ALTER TABLE {s}.events ADD COLUMN deliver_at_ms bigint;

CREATE INDEX events_scheduled ON {s}.events (stream_id, part, seq) INCLUDE (deliver_at_ms)
    WHERE deliver_at_ms IS NOT NULL;

ALTER TABLE {s}.streams ADD COLUMN scheduled boolean NOT NULL DEFAULT false;
