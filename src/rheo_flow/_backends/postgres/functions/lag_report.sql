-- lag_report: every group's lag, partition by partition, in ONE statement (what
-- Backend.lag_report, a metrics scrape and `rheo-flow lag` read; rule lag.report in
-- docs/contract.md).
--
-- A stable interface for tools outside rheo-flow too (a KEDA postgresql scaler, a
-- dashboard): its name, argument and columns stay as they are across schema
-- versions (docs/backends.md, "Lag from SQL (PostgreSQL)"). p_streams: the streams to report
-- (NULL: every stream; a name no stream has is simply absent). One row per
-- (stream, group, partition), by stream, group (bytewise) and partition:
--
--   stream, grp          the stream and the consumer group
--   partition            the partition
--   high_water           its highest appended sequence (0: none yet)
--   frontier             the group's contiguous frontier (everything up to it settled)
--   lag                  greatest(high_water - frontier, 0)
--   scheduled            of lag, the events whose deliver_at is still ahead
--   oldest_unsettled_ms  appended_at_ms of the first stored event past the frontier
--                        (NULL when lag is 0)
--   dead_letters         the GROUP's dead letters (repeated on each of its rows)
--   paused               the group is paused at read_at_ms
--   paused_until_ms      when the pause ends by itself (NULL: not paused, or until
--                        resumed)
--   read_at_ms           the database clock (ms since the epoch) the report was read at
--
-- The clock is read once (the MATERIALIZED CTE clock), and each group's dead letters
-- counted once (the MATERIALIZED CTE g, not once per partition); every value comes
-- from the statement's one snapshot. Per row it costs index descents, not scans: the first
-- event past the frontier (the events primary key), the scheduled events past it
-- (events_scheduled, only in a stream that ever had one) and, once per group, its
-- dead letters (deliveries_rejected, an index-only count).

CREATE OR REPLACE FUNCTION {s}.lag_report(p_streams text[] DEFAULT NULL)
RETURNS TABLE (stream text, grp text, partition integer, high_water bigint,
               frontier bigint, lag bigint, scheduled bigint, oldest_unsettled_ms bigint,
               dead_letters bigint, paused boolean, paused_until_ms bigint,
               read_at_ms bigint)
LANGUAGE sql STABLE
AS $fn$
    WITH clock AS MATERIALIZED (
        SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
    ), g AS MATERIALIZED (
        SELECT s.id AS sid, s.name AS sname, s.scheduled AS sched, g.id AS gid,
               g.name AS gname, g.paused_until_ms AS until_ms,
               (SELECT count(*) FROM {s}.deliveries d
                WHERE d.group_id = g.id AND d.state = {s}.delivery_rejected()) AS letters
        FROM {s}.streams s JOIN {s}.groups g ON g.stream_id = s.id
        WHERE p_streams IS NULL OR s.name = ANY (p_streams)
    )
    SELECT g.sname, g.gname, p.part, p.high_water, f.frontier,
           greatest(p.high_water - f.frontier, 0),
           CASE WHEN g.sched AND p.high_water > f.frontier THEN
               (SELECT count(*) FROM {s}.events e
                WHERE e.stream_id = g.sid AND e.part = p.part AND e.seq > f.frontier
                  AND e.deliver_at_ms IS NOT NULL AND e.deliver_at_ms > c.now_ms)
           ELSE 0 END,
           CASE WHEN p.high_water > f.frontier THEN
               (SELECT e.appended_at_ms FROM {s}.events e
                WHERE e.stream_id = g.sid AND e.part = p.part AND e.seq > f.frontier
                ORDER BY e.seq LIMIT 1)
           END,
           g.letters,
           g.until_ms > c.now_ms,
           CASE WHEN g.until_ms > c.now_ms AND g.until_ms < 4611686018427387904
                THEN g.until_ms END,
           c.now_ms
    FROM g JOIN {s}.partitions p ON p.stream_id = g.sid
    JOIN {s}.frontiers f ON f.group_id = g.gid AND f.part = p.part
    CROSS JOIN clock c
    ORDER BY g.sname COLLATE "C", g.gname COLLATE "C", p.part
$fn$;

COMMENT ON FUNCTION {s}.lag_report(text[]) IS
    'rheo-flow: every consumer group''s lag per partition (stable interface, see rheo-flow docs/backends.md "Lag from SQL (PostgreSQL)")';
