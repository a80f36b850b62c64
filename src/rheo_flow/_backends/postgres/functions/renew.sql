-- renew: a fenced new deadline for a batch of leases. It locks the leased rows
-- as settle does (key order, re-checked under the lock) and moves their
-- deadline by address.

CREATE OR REPLACE FUNCTION {s}.renew(p_groups integer[], p_parts integer[], p_seqs bigint[],
                                     p_leases uuid[], p_atts integer[], p_lease_ms bigint,
                                     OUT deadline_ms bigint,
                                     OUT bad_idx bigint[], OUT bad_code smallint[],
                                     OUT bad_by smallint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    p_op smallint := 0;
    v_tids tid[];
    v_done bigint[];
BEGIN
    deadline_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint + p_lease_ms;
    SELECT array_agg(l.tid), array_agg(u.idx) INTO v_tids, v_done

    FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
         AS u(g, part, seq, lease, att, idx)
    CROSS JOIN LATERAL (
        -- "state + 0": a plain "state = 1" would let the planner walk
        -- deliveries_leased (its predicate) per lease; the key finds each row.
        SELECT d.ctid AS tid FROM {s}.deliveries d
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq
          AND d.state + 0 = 1 AND d.lease_id = u.lease AND d.attempt = u.att
        FOR UPDATE) l;
    IF v_tids IS NOT NULL THEN
        UPDATE {s}.deliveries d SET deadline_ms = renew.deadline_ms WHERE d.ctid = ANY (v_tids);
    END IF;
    IF COALESCE(cardinality(v_done), 0) < cardinality(p_seqs) THEN

    SELECT array_agg(u.idx ORDER BY u.idx),
           array_agg(CASE
               WHEN d.seq IS NULL THEN
                   CASE WHEN u.seq >= 1 AND u.seq <= pt.high_water THEN 5 ELSE 6 END
               WHEN d.lease_id IS DISTINCT FROM u.lease THEN 2
               WHEN d.attempt <> u.att THEN 3
               WHEN d.state = 1 THEN 7
               WHEN p_op <> 0 AND d.settled_by = p_op THEN 1
               ELSE 4 END::smallint ORDER BY u.idx),
           array_agg(d.settled_by ORDER BY u.idx)
    INTO bad_idx, bad_code, bad_by
    FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
         AS u(g, part, seq, lease, att, idx)
    LEFT JOIN LATERAL (
        SELECT d.seq, d.lease_id, d.attempt, d.state, d.settled_by FROM {s}.deliveries d
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq OFFSET 0) d ON true
    LEFT JOIN LATERAL (
        SELECT pt.high_water FROM {s}.groups gr
        JOIN {s}.partitions pt ON pt.stream_id = gr.stream_id AND pt.part = u.part
        WHERE gr.id = u.g OFFSET 0) pt ON true
    WHERE u.idx <> ALL (COALESCE(v_done, '{}'::bigint[]));
    END IF;
END
$fn$;
