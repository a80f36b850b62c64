-- settle: the fenced ack / nack / reject of a batch. The events held by range
-- leases are settled first (functions/settle_ranged.sql). For the rest, it locks
-- the batch's deliveries still leased under these very leases (settle_leased, below), then
-- updates them by address, releases the keys of a key-ordered group's finished
-- ones (release_keys, functions/fetch_keyed.sql), and moves the frontiers the
-- finished ones may free (advance_frontiers). Each leftover batch element is
-- explained by settle_misses (below), which renew shares.
--
-- p_op: the operation, op_ack(), op_nack() or op_reject() (functions/states.sql).
-- p_error is the error to record (NULL keeps the recorded one); it defaults to
-- NULL, so a process still running a release from before schema version 4
-- (eight arguments) keeps settling across the upgrade.
--
-- Reply (one row; settle_misses's, all NULL when every element took effect):
--   bad_idx    the failed elements, numbered from 1 in the batch's order
--   bad_code   why each failed: 1 settled before by this very operation (a
--              repeat, not a failure), 2 leased again since, 3 the receipt's
--              attempt is not the delivery's, 4 settled before by another
--              operation (bad_by), 5 no delivery (replayed, reset or trimmed),
--              6 no such event, 7 changed concurrently (still leased under the
--              lease, not settled)
--   bad_by     the operation that settled it before (deliveries.settled_by), if any

-- settle_leased: the batch elements (numbered from 1) whose delivery is still
-- leased under this very lease and attempt, locked FOR UPDATE in key order (the
-- batch arrives sorted), with the row's address; a racing settle of the same
-- lease waits on the row lock and then no longer matches (the row is re-checked
-- once the lock is granted). Reply: a row per such element: o_tid, the row's
-- address; o_idx, the element's number; o_group, o_part, o_attempt, its group,
-- partition and attempt.

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
        -- "state + 0": a plain "state = ..." would let the planner walk
        -- deliveries_leased (its predicate) per lease; the key finds each row.
        SELECT d.ctid AS tid FROM {s}.deliveries d
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq
          AND d.state + 0 = {s}.delivery_leased() AND d.lease_id = u.lease
          AND d.attempt = u.att
        FOR UPDATE) l;
END
$fn$;

-- settle_misses: why each batch element not in p_done failed, as settle and
-- renew report it (p_op: op_renew() for renew): each looks its delivery up by
-- key. Reply: settle's bad_idx, bad_code, bad_by (below).

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
                   CASE WHEN u.lease <> {s}.lease_of(r.token, u.seq - r.base_seq)
                            THEN 2 /* leased again */
                        WHEN r.attempt <> u.att THEN 3 /* receipt mismatch */
                        WHEN get_bit(r.done, (u.seq - r.first_seq)::integer) = 0
                            THEN 7 /* changed concurrently */
                        WHEN p_op = {s}.op_ack() THEN 1 /* repeated */
                        ELSE 4 /* settled by another operation */ END
               WHEN d.seq IS NULL THEN
                   CASE WHEN u.seq >= 1 AND u.seq <= pt.high_water
                        THEN 5 /* no delivery */ ELSE 6 /* no such event */ END
               WHEN d.lease_id IS DISTINCT FROM u.lease THEN 2 /* leased again */
               WHEN d.attempt <> u.att THEN 3 /* receipt mismatch */
               WHEN d.state = {s}.delivery_leased() THEN 7 /* changed concurrently */
               WHEN p_op <> {s}.op_renew() AND d.settled_by = p_op THEN 1 /* repeated */
               ELSE 4 /* settled by another operation */ END::smallint ORDER BY u.idx),
           -- A range's settled bits are acks only.
           array_agg(CASE WHEN d.seq IS NULL AND r.token IS NOT NULL THEN {s}.op_ack()
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
    v_settled_tids tid[];      -- the delivery rows settled, by address
    v_spent_tids tid[];        -- those a nack of their last attempt dead-letters
    v_done_idx bigint[];       -- the elements that took effect
    -- The (group, partition) of every event finished for good: frontiers to move.
    v_finished_groups integer[];
    v_finished_parts integer[];
    -- The keys a key-ordered group's finished deliveries release.
    v_released_groups integer[];
    v_released_parts integer[];
    v_released_keys text[];
    -- settle_ranged's reply: the elements it settled, the ranges' (group, partition).
    v_ranged_idx bigint[];
    v_ranged_groups integer[];
    v_ranged_parts integer[];
BEGIN
    -- Events held by range leases first (functions/settle_ranged.sql; the lock
    -- order), then the delivery rows, if any element is left.
    SELECT * INTO v_ranged_idx, v_ranged_groups, v_ranged_parts
    FROM {s}.settle_ranged(p_op, p_groups, p_parts, p_seqs, p_leases, p_atts, NULL, p_reason,
                           p_delay_ms, p_error, v_now, NULL);
    IF COALESCE(cardinality(v_ranged_idx), 0) = cardinality(p_seqs) THEN
        PERFORM {s}.advance_frontiers(v_ranged_groups, v_ranged_parts)
        WHERE v_ranged_groups IS NOT NULL;
        RETURN;
    END IF;
    WITH hit AS (
        -- spent: a nack of this attempt dead-letters (only nack needs max_attempts).
        SELECT l.o_tid AS tid, l.o_idx AS idx, l.o_group AS g, l.o_part AS part,
               p_op = {s}.op_reject() OR p_op = {s}.op_ack()
               OR (p_op = {s}.op_nack() AND l.o_attempt >= (
                   SELECT gr.max_attempts FROM {s}.groups gr WHERE gr.id = l.o_group)) AS final
        FROM {s}.settle_leased(p_groups, p_parts, p_seqs, p_leases, p_atts) l
    )
    SELECT array_agg(hit.tid), array_agg(hit.tid) FILTER (WHERE hit.final AND p_op = {s}.op_nack()),
           array_agg(hit.idx),
           array_agg(hit.g) FILTER (WHERE hit.final), array_agg(hit.part) FILTER (WHERE hit.final)
    INTO v_settled_tids, v_spent_tids, v_done_idx, v_finished_groups, v_finished_parts
    FROM hit;

    IF v_settled_tids IS NOT NULL THEN
        WITH done AS (
            UPDATE {s}.deliveries d SET
                state = CASE WHEN p_op = {s}.op_ack() THEN {s}.delivery_acked()
                             WHEN p_op = {s}.op_reject() THEN {s}.delivery_rejected()
                             WHEN d.ctid = ANY (v_spent_tids) THEN {s}.delivery_rejected()
                             ELSE {s}.delivery_available() END,
                settled_by = p_op,
                last_error = COALESCE(p_error, d.last_error),
                reason = CASE WHEN p_op = {s}.op_ack() THEN ''
                              WHEN p_op = {s}.op_reject() THEN p_reason
                              WHEN d.ctid = ANY (v_spent_tids) THEN 'max_attempts'
                              ELSE p_reason END,
                available_at_ms = CASE WHEN p_op = {s}.op_nack() THEN v_now + p_delay_ms
                                       ELSE d.available_at_ms END,
                rejected_at_ms = CASE WHEN p_op = {s}.op_reject()
                                           OR (p_op = {s}.op_nack()
                                               AND d.ctid = ANY (v_spent_tids))
                                      THEN v_now ELSE d.rejected_at_ms END
            WHERE d.ctid = ANY (v_settled_tids)
            RETURNING d.group_id, d.part, d.key, d.state
        )
        -- A key-ordered group's deliveries settled for good release their keys
        -- (functions/fetch_keyed.sql), before the frontiers (the lock order).
        SELECT array_agg(done.group_id), array_agg(done.part), array_agg(done.key)
        INTO v_released_groups, v_released_parts, v_released_keys
        FROM done WHERE done.key IS NOT NULL AND done.state >= {s}.delivery_acked();
        -- Nothing held in these groups (deliveries_held: one descent), nothing
        -- to release: the common case while keys do not repeat in flight.
        IF v_released_keys IS NOT NULL AND EXISTS (
                SELECT 1 FROM (SELECT DISTINCT g.id FROM unnest(v_released_groups) AS g(id)) g
                CROSS JOIN LATERAL (
                    SELECT 1 FROM {s}.deliveries w
                    WHERE w.group_id = g.id AND w.state = {s}.delivery_available()
                      AND w.available_at_ms = {s}.held() LIMIT 1) w) THEN
            PERFORM {s}.release_keys(v_released_groups, v_released_parts, v_released_keys, v_now);
        END IF;
    END IF;
    v_done_idx := v_ranged_idx || v_done_idx;
    v_finished_groups := v_ranged_groups || v_finished_groups;
    v_finished_parts := v_ranged_parts || v_finished_parts;
    IF v_finished_groups IS NOT NULL THEN
        PERFORM {s}.advance_frontiers(v_finished_groups, v_finished_parts);
    END IF;
    IF COALESCE(cardinality(v_done_idx), 0) < cardinality(p_seqs) THEN
        SELECT * INTO bad_idx, bad_code, bad_by
        FROM {s}.settle_misses(p_op, p_groups, p_parts, p_seqs, p_leases, p_atts, v_done_idx);
    END IF;
END
$fn$;
