-- settle: the fenced ack / nack / reject of a batch. The events held by range
-- leases are settled first (functions/settle_ranged.sql). For the rest, it locks
-- the batch's deliveries still leased under these very leases (settle_leased, below), then
-- updates them by address, releases the keys of a key-ordered group's finished
-- ones (release_keys, functions/fetch_keyed.sql), and moves the frontiers the
-- finished ones may free (advance_frontiers). Each leftover batch element is
-- explained by settle_misses (below), which renew shares.
--
-- p_error is the error to record (NULL keeps the recorded one); it defaults to
-- NULL, so a process still running a release from before schema version 4
-- (eight arguments) keeps settling across the upgrade.

-- settle_leased: the batch elements (numbered from 1) whose delivery is still
-- leased under this very lease and attempt, locked FOR UPDATE in key order (the
-- batch arrives sorted), with the row's address; a racing settle of the same
-- lease waits on the row lock and then no longer matches (the row is re-checked
-- once the lock is granted).

CREATE OR REPLACE FUNCTION {s}.settle_leased(p_groups integer[], p_parts integer[],
                                             p_seqs bigint[], p_leases uuid[], p_atts integer[])
RETURNS TABLE (o_tid tid, o_idx bigint, o_group integer, o_part integer, o_attempt integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
BEGIN
    RETURN QUERY
    SELECT l.tid, u.idx, u.g, u.part, u.att
    FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
         AS u(g, part, seq, lease, att, idx)
    CROSS JOIN LATERAL (
        -- "state + 0": a plain "state = 1" would let the planner walk
        -- deliveries_leased (its predicate) per lease; the key finds each row.
        SELECT d.ctid AS tid FROM {s}.deliveries d
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq
          AND d.state + 0 = 1 AND d.lease_id = u.lease AND d.attempt = u.att
        FOR UPDATE) l;
END
$fn$;

-- settle_misses: why each batch element not in p_done failed, as settle and
-- renew report it (p_op 0: renew): each looks its delivery up by key.

CREATE OR REPLACE FUNCTION {s}.settle_misses(p_op smallint, p_groups integer[],
                                             p_parts integer[], p_seqs bigint[],
                                             p_leases uuid[], p_atts integer[], p_done bigint[],
                                             OUT bad_idx bigint[], OUT bad_code smallint[],
                                             OUT bad_by smallint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
BEGIN
    SELECT array_agg(u.idx ORDER BY u.idx),
           array_agg(CASE
               WHEN d.seq IS NULL AND r.token IS NOT NULL THEN
                   CASE WHEN u.lease <> {s}.lease_of(r.token, u.seq - r.base_seq) THEN 2
                        WHEN r.attempt <> u.att THEN 3
                        WHEN get_bit(r.done, (u.seq - r.first_seq)::integer) = 0 THEN 7
                        WHEN p_op = 1 THEN 1
                        ELSE 4 END
               WHEN d.seq IS NULL THEN
                   CASE WHEN u.seq >= 1 AND u.seq <= pt.high_water THEN 5 ELSE 6 END
               WHEN d.lease_id IS DISTINCT FROM u.lease THEN 2
               WHEN d.attempt <> u.att THEN 3
               WHEN d.state = 1 THEN 7
               WHEN p_op <> 0 AND d.settled_by = p_op THEN 1
               ELSE 4 END::smallint ORDER BY u.idx),
           array_agg(CASE WHEN d.seq IS NULL AND r.token IS NOT NULL THEN 1::smallint
                          ELSE d.settled_by END ORDER BY u.idx)
    INTO bad_idx, bad_code, bad_by
    FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
         AS u(g, part, seq, lease, att, idx)
    LEFT JOIN LATERAL (
        SELECT d.seq, d.lease_id, d.attempt, d.state, d.settled_by FROM {s}.deliveries d
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq OFFSET 0) d ON true
    LEFT JOIN LATERAL (
        -- No delivery row: the range holding the event, if any (migrations/v8_ranges.sql).
        SELECT r.last_seq, r.base_seq, r.token, r.attempt, r.done, r.first_seq
        FROM {s}.ranges r
        WHERE d.seq IS NULL AND r.group_id = u.g AND r.part = u.part AND r.first_seq <= u.seq
        ORDER BY r.first_seq DESC LIMIT 1) r ON r.last_seq >= u.seq
    LEFT JOIN LATERAL (
        SELECT pt.high_water FROM {s}.groups gr
        JOIN {s}.partitions pt ON pt.stream_id = gr.stream_id AND pt.part = u.part
        WHERE gr.id = u.g OFFSET 0) pt ON true
    WHERE u.idx <> ALL (COALESCE(p_done, '{}'::bigint[]));
END
$fn$;

CREATE OR REPLACE FUNCTION {s}.settle(p_op smallint, p_groups integer[], p_parts integer[],
                                      p_seqs bigint[], p_leases uuid[], p_atts integer[],
                                      p_reason text, p_delay_ms bigint, p_error text DEFAULT NULL,
                                      OUT bad_idx bigint[], OUT bad_code smallint[],
                                      OUT bad_by smallint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_tids tid[];
    v_spent tid[];
    v_done bigint[];
    v_tg integer[];
    v_tp integer[];
    v_kg integer[];
    v_kp integer[];
    v_keys text[];
    v_ridx bigint[];
    v_rg integer[];
    v_rp integer[];
BEGIN
    -- Events held by range leases first (functions/settle_ranged.sql; the lock
    -- order), then the delivery rows, if any element is left.
    SELECT * INTO v_ridx, v_rg, v_rp
    FROM {s}.settle_ranged(p_op, p_groups, p_parts, p_seqs, p_leases, p_atts, NULL, p_reason,
                           p_delay_ms, p_error, v_now, NULL);
    IF COALESCE(cardinality(v_ridx), 0) = cardinality(p_seqs) THEN
        PERFORM {s}.advance_frontiers(v_rg, v_rp) WHERE v_rg IS NOT NULL;
        RETURN;
    END IF;
    WITH hit AS (
        -- spent: a nack of this attempt dead-letters (only nack needs max_attempts).
        SELECT l.o_tid AS tid, l.o_idx AS idx, l.o_group AS g, l.o_part AS part,
               p_op = 3 OR p_op = 1 OR (p_op = 2 AND l.o_attempt >= (
                   SELECT gr.max_attempts FROM {s}.groups gr WHERE gr.id = l.o_group)) AS final
        FROM {s}.settle_leased(p_groups, p_parts, p_seqs, p_leases, p_atts) l
    )
    SELECT array_agg(hit.tid), array_agg(hit.tid) FILTER (WHERE hit.final AND p_op = 2),
           array_agg(hit.idx),
           array_agg(hit.g) FILTER (WHERE hit.final), array_agg(hit.part) FILTER (WHERE hit.final)
    INTO v_tids, v_spent, v_done, v_tg, v_tp
    FROM hit;

    IF v_tids IS NOT NULL THEN
        WITH done AS (
            UPDATE {s}.deliveries d SET
                state = CASE WHEN p_op = 1 THEN 2 WHEN p_op = 3 THEN 3
                             WHEN d.ctid = ANY (v_spent) THEN 3 ELSE 0 END,
                settled_by = p_op,
                last_error = COALESCE(p_error, d.last_error),
                reason = CASE WHEN p_op = 1 THEN '' WHEN p_op = 3 THEN p_reason
                              WHEN d.ctid = ANY (v_spent) THEN 'max_attempts' ELSE p_reason END,
                available_at_ms = CASE WHEN p_op = 2 THEN v_now + p_delay_ms
                                       ELSE d.available_at_ms END,
                rejected_at_ms = CASE WHEN p_op = 3 OR (p_op = 2 AND d.ctid = ANY (v_spent))
                                      THEN v_now ELSE d.rejected_at_ms END
            WHERE d.ctid = ANY (v_tids)
            RETURNING d.group_id, d.part, d.key, d.state
        )
        -- A key-ordered group's deliveries settled for good release their keys
        -- (functions/fetch_keyed.sql), before the frontiers (the lock order).
        SELECT array_agg(done.group_id), array_agg(done.part), array_agg(done.key)
        INTO v_kg, v_kp, v_keys
        FROM done WHERE done.key IS NOT NULL AND done.state >= 2;
        -- Nothing held in these groups (deliveries_held: one descent), nothing
        -- to release: the common case while keys do not repeat in flight.
        IF v_keys IS NOT NULL AND EXISTS (
                SELECT 1 FROM (SELECT DISTINCT g.id FROM unnest(v_kg) AS g(id)) g
                CROSS JOIN LATERAL (
                    SELECT 1 FROM {s}.deliveries w
                    WHERE w.group_id = g.id AND w.state = 0
                      AND w.available_at_ms = 9223372036854775807 LIMIT 1) w) THEN
            PERFORM {s}.release_keys(v_kg, v_kp, v_keys, v_now);
        END IF;
    END IF;
    v_done := v_ridx || v_done;
    v_tg := v_rg || v_tg;
    v_tp := v_rp || v_tp;
    IF v_tg IS NOT NULL THEN
        PERFORM {s}.advance_frontiers(v_tg, v_tp);
    END IF;
    IF COALESCE(cardinality(v_done), 0) < cardinality(p_seqs) THEN
        SELECT * INTO bad_idx, bad_code, bad_by
        FROM {s}.settle_misses(p_op, p_groups, p_parts, p_seqs, p_leases, p_atts, v_done);
    END IF;
END
$fn$;
