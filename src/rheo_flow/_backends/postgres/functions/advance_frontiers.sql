-- advance_frontiers: moves the stored frontiers of (group, partition) pairs over
-- the settled deliveries and range events right after them, with the plan
-- options of fetch. Replies nothing.

CREATE OR REPLACE FUNCTION {s}.advance_frontiers(p_groups integer[], p_parts integer[])
RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
BEGIN

    PERFORM 1 FROM {s}.frontiers f
        JOIN (SELECT DISTINCT g, p FROM unnest(p_groups, p_parts) AS u(g, p)) u
          ON f.group_id = u.g AND f.part = u.p
        ORDER BY f.group_id, f.part
        FOR UPDATE OF f;
    UPDATE {s}.frontiers f SET frontier = n.top
    FROM (
        -- 9223372036854775807, the largest bigint: no bound from that side.
        SELECT f2.group_id, f2.part, LEAST(
            COALESCE((SELECT d.seq FROM {s}.deliveries d
                      WHERE d.group_id = f2.group_id AND d.part = f2.part
                        AND d.seq > f2.frontier AND d.state < {s}.delivery_acked()
                      ORDER BY d.seq LIMIT 1), 9223372036854775807),
            -- the first event in flight of the lowest range with any (ranges_open)
            COALESCE((SELECT r.first_seq + position(B'0' IN r.done) - 1 FROM {s}.ranges r
                      WHERE r.group_id = f2.group_id AND r.part = f2.part AND r.pending > 0
                      ORDER BY r.first_seq LIMIT 1), 9223372036854775807),
            (SELECT c.cursor + 1 FROM {s}.cursors c
             WHERE c.group_id = f2.group_id AND c.part = f2.part)) - 1 AS top
        FROM {s}.frontiers f2
        JOIN (SELECT DISTINCT g, p FROM unnest(p_groups, p_parts) AS u(g, p)) u
          ON f2.group_id = u.g AND f2.part = u.p
    ) n
    WHERE f.group_id = n.group_id AND f.part = n.part AND n.top > f.frontier;
END
$fn$;
