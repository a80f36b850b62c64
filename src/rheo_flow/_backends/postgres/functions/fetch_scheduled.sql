-- split_scheduled: an unordered group's fetch (functions/fetch.sql) in a stream
-- that holds scheduled events (streams.scheduled; docs/contract.md, "Delayed
-- delivery"). A range lease covers every event from its first to its last
-- sequence, so a scheduled event not due yet cannot be inside one: in each
-- claimed partition (p_parts, with their cursors p_curs and high waters
-- p_highs) whose next events include such an event, this turns the window the
-- fetch could lease into delivery rows, attempt 0 (never delivered): the
-- scheduled events available at their deliver_at_ms, the others available now.
-- The window holds up to p_limit events that are due: from the cursor to the
-- p_limit-th of them, past the scheduled ones (up to p_limit + 4,096 are read: a
-- window with more ends at the last one read, and may hold fewer). The cursor
-- moves to its end, so each scheduled event is read once per group. The fetch then leases the rows due as it leases a
-- nacked delivery, the scheduled ones once their time comes (deliveries_due),
-- and the frontier waits behind them as behind any available delivery.
-- A partition with no scheduled event ahead within its window is left alone: one
-- descent of events_scheduled (migration 11) finds that.
-- Reply: o_parts, the partitions split (NULL: none); o_curs, every cursor after
-- the split (aligned with p_parts).

CREATE OR REPLACE FUNCTION {s}.split_scheduled(p_group integer, p_stream integer,
                                               p_limit integer, p_now bigint,
                                               p_parts integer[], p_curs bigint[],
                                               p_highs bigint[], OUT o_parts integer[],
                                               OUT o_curs bigint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
BEGIN
    WITH sched AS (
        SELECT k.i, k.part, k.cur, k.high, s.seq, s.at,
               row_number() OVER (PARTITION BY k.i ORDER BY s.seq) AS rn
        FROM unnest(p_parts, p_curs, p_highs) WITH ORDINALITY AS k(part, cur, high, i)
        CROSS JOIN LATERAL (
            SELECT e.seq, e.deliver_at_ms AS at FROM {s}.events e
            WHERE e.stream_id = p_stream AND e.part = k.part AND e.seq > k.cur
              AND e.seq <= k.high AND e.deliver_at_ms IS NOT NULL AND e.deliver_at_ms > p_now
            ORDER BY e.seq LIMIT p_limit + 4096) s
    ), win AS (
        -- seq - cur - rn: the events due between the cursor and a scheduled one. A
        -- read cut by its limit ends the window at the last scheduled event read.
        SELECT s.i, s.part, s.cur,
               LEAST(s.high, s.cur + p_limit
                             + count(*) FILTER (WHERE s.seq - s.cur - s.rn < p_limit),
                     CASE WHEN count(*) = p_limit + 4096 THEN max(s.seq) END) AS hi
        FROM sched s GROUP BY s.i, s.part, s.cur, s.high
    ), made AS (
        INSERT INTO {s}.deliveries (group_id, part, seq, state, attempt, available_at_ms)
        SELECT p_group, w.part, g.seq, {s}.delivery_available(), 0, COALESCE(s.at, p_now)
        FROM win w CROSS JOIN LATERAL generate_series(w.cur + 1, w.hi) AS g(seq)
        LEFT JOIN sched s ON s.i = w.i AND s.seq = g.seq
    ), moved AS (
        UPDATE {s}.cursors cu SET cursor = w.hi FROM win w
        WHERE cu.group_id = p_group AND cu.part = ANY (p_parts) AND cu.part = w.part
    )
    SELECT (SELECT array_agg(w.part ORDER BY w.i) FROM win w),
           (SELECT array_agg(COALESCE(w.hi, k.cur) ORDER BY k.i)
            FROM unnest(p_curs) WITH ORDINALITY AS k(cur, i) LEFT JOIN win w ON w.i = k.i)
    INTO o_parts, o_curs;
END
$fn$;
