-- fetch_work: which of p_parts have work for a fetch of the group at p_now, found
-- in ONE statement whose cost follows the partitions with work, not the
-- partitions of the stream (schema version 10), so that a fetch visits only
-- those and an idle partition costs it nothing:
--
-- * new events: the group's cursors and the stream's high waters, each read as
--   one range of its primary key (two ordered scans, merged), compared;
-- * delivery rows to lease again: the first entry of each partition in
--   deliveries_due (available, by the time they become due) and in
--   deliveries_expiry (leased, by deadline) says whether its earliest row is
--   due; a skip scan (one descent per partition that has such rows at all,
--   walking the index from one partition to the next) reads only those entries;
-- * expired ranges: the same skip scan over ranges_expiry (open ranges by deadline).
--
-- Nested loops are off (but for the skip scans' LATERAL steps, which have no
-- other plan): whatever the statistics say, the cursors and the high waters are
-- read once each, never probed partition by partition. So is JIT: the cost that
-- disables a plan node (those LATERAL steps keep it) is far above jit_above_cost,
-- and a session with JIT on (one through PgBouncer, or a host's pool) would
-- compile the statement at every call.
--
-- It locks nothing: fetch claims what it found with SKIP LOCKED and checks it
-- again then (a cursor moved, a row leased meanwhile).
--
-- Reply (one row), each an array of partitions in p_parts' order (the fetch's
-- rotation), NULL when there is none:
--   o_new_parts      the partitions whose cursor is below their high water
--   o_due_parts      those with an available delivery row due at p_now, or a
--                    leased one whose deadline is past
--   o_expired_parts  those with an open range whose deadline is past

CREATE OR REPLACE FUNCTION {s}.fetch_work(p_group integer, p_stream integer, p_parts integer[],
                                          p_now bigint, OUT o_new_parts integer[],
                                          OUT o_due_parts integer[],
                                          OUT o_expired_parts integer[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET jit = off
AS $fn$
BEGIN
    -- Each skip scan starts below partition 0 and takes, per step, the first
    -- entry of the next partition that has one: its earliest time there.
    WITH RECURSIVE avail(part, at) AS (
        SELECT -1, NULL::bigint
        UNION ALL
        SELECT x.part, x.at FROM avail a CROSS JOIN LATERAL (
            SELECT d.part, d.available_at_ms AS at FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.state = {s}.delivery_available()
              AND d.part > a.part
            ORDER BY d.part, d.available_at_ms LIMIT 1) x
    ), leased(part, at) AS (
        SELECT -1, NULL::bigint
        UNION ALL
        SELECT x.part, x.at FROM leased a CROSS JOIN LATERAL (
            SELECT d.part, d.deadline_ms AS at FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.state = {s}.delivery_leased() AND d.part > a.part
            ORDER BY d.part, d.deadline_ms LIMIT 1) x
    ), ranged(part, at) AS (
        SELECT -1, NULL::bigint
        UNION ALL
        SELECT x.part, x.at FROM ranged a CROSS JOIN LATERAL (
            SELECT r.part, r.deadline_ms AS at FROM {s}.ranges r
            WHERE r.group_id = p_group AND r.pending > 0 AND r.part > a.part
            ORDER BY r.part, r.deadline_ms LIMIT 1) x
    ), work AS MATERIALIZED (
        -- MATERIALIZED: joined to p_parts only once found (inlined, the planner
        -- may walk p_parts and probe a cursor per partition).
        SELECT c.part, true AS fresh, false AS due, false AS expired
        FROM {s}.cursors c
        JOIN {s}.partitions pt ON pt.stream_id = p_stream AND pt.part = c.part
        WHERE c.group_id = p_group AND c.cursor < pt.high_water
        UNION ALL
        SELECT a.part, false, true, false FROM avail a WHERE a.at <= p_now
        UNION ALL
        SELECT a.part, false, true, false FROM leased a WHERE a.at <= p_now
        UNION ALL
        SELECT a.part, false, false, true FROM ranged a WHERE a.at <= p_now
    ), per AS (
        SELECT p.part, p.pos, bool_or(w.fresh) AS fresh, bool_or(w.due) AS due,
               bool_or(w.expired) AS expired
        FROM work w JOIN unnest(p_parts) WITH ORDINALITY AS p(part, pos) ON p.part = w.part
        GROUP BY p.part, p.pos
    )
    SELECT array_agg(per.part ORDER BY per.pos) FILTER (WHERE per.fresh),
           array_agg(per.part ORDER BY per.pos) FILTER (WHERE per.due),
           array_agg(per.part ORDER BY per.pos) FILTER (WHERE per.expired)
    INTO o_new_parts, o_due_parts, o_expired_parts
    FROM per;
END
$fn$;

-- claim_fresh: the common case of a fetch found and claimed at once, in place
-- of fetch_work and claim_cursors (functions/fetch.sql; the caller has checked
-- that the group is unordered and not paused and that its stream holds no
-- scheduled event): when the group has no delivery row available or leased (one
-- descent of deliveries_due and of deliveries_expiry) and no partition a range
-- past its deadline (fetch_work's skip scan of ranges_expiry, stopping at the
-- first entry due), the cursors of p_parts below their high water are locked
-- FOR UPDATE SKIP LOCKED, read as fetch_work reads them (the group's cursors and
-- the stream's high waters, two ordered scans merged: an idle partition costs no
-- probe). It never waits. Reply: claim_cursors's k_part, k_cur and k_top, NULL
-- when the case is not the common one or no cursor was free (the caller then
-- finds the work step by step, and may wait for a cursor); o_idle, true when
-- the case is the common one and no cursor of p_parts is below its high water
-- (nothing to lease: the caller returns at once).

CREATE OR REPLACE FUNCTION {s}.claim_fresh(p_group integer, p_stream integer, p_parts integer[],
                                           p_now bigint, OUT k_part integer[],
                                           OUT k_cur bigint[], OUT k_top bigint[],
                                           OUT o_idle boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET jit = off
AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM {s}.deliveries d
               WHERE d.group_id = p_group AND d.state = {s}.delivery_available())
       OR EXISTS (SELECT 1 FROM {s}.deliveries d
                  WHERE d.group_id = p_group AND d.state = {s}.delivery_leased())
       OR EXISTS (WITH RECURSIVE ranged(part, at) AS (
                      SELECT -1, NULL::bigint
                      UNION ALL
                      SELECT x.part, x.at FROM ranged a CROSS JOIN LATERAL (
                          SELECT r.part, r.deadline_ms AS at FROM {s}.ranges r
                          WHERE r.group_id = p_group AND r.pending > 0 AND r.part > a.part
                          ORDER BY r.part, r.deadline_ms LIMIT 1) x)
                  SELECT 1 FROM ranged a WHERE a.at <= p_now) THEN
        RETURN;
    END IF;
    -- The candidates first, then their cursors locked (a cursor moved meanwhile is
    -- locked at its latest version and checked again), so that the one read of the
    -- high waters also tells that there is nothing to lease (no candidate: the
    -- cursors are not read again).
    WITH cand AS MATERIALIZED (
        SELECT c.part, pt.high_water AS high
        FROM {s}.cursors c
        JOIN {s}.partitions pt ON pt.stream_id = p_stream AND pt.part = c.part
        JOIN unnest(p_parts) AS p(part) ON p.part = c.part
        WHERE c.group_id = p_group AND c.cursor < pt.high_water
    ), locked AS (
        SELECT c.part, c.cursor, x.high FROM {s}.cursors c JOIN cand x ON x.part = c.part
        WHERE c.group_id = p_group
        FOR UPDATE OF c SKIP LOCKED
    )
    SELECT array_agg(l.part), array_agg(l.cursor), array_agg(l.high),
           NOT EXISTS (SELECT 1 FROM cand)
    INTO k_part, k_cur, k_top, o_idle
    FROM locked l
    WHERE l.cursor < l.high;
END
$fn$;
