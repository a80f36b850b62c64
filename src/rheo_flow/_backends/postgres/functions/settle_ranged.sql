-- settle_ranged: the part of a settle or renew batch (functions/settle.sql,
-- functions/renew.sql) that names events held by range leases
-- (migrations/v8_ranges.sql). p_done lists the elements the delivery rows took;
-- each other element whose range is in flight under its very token, offset and
-- attempt, with its bit still clear, takes effect:
--
-- * ack (p_op 1): its bit is set;
-- * nack (2) and reject (3): its bit is set and it becomes a delivery row, as
--   settle leaves one (available after the delay; or a dead letter: a reject, or
--   a nack of the last attempt);
-- * renew (0): the range's deadline moves when the batch renews every event it
--   has in flight; else the events renewed become delivery rows, leased until
--   p_deadline, and their bits are set (the others keep the range's deadline).
--
-- Ranges are locked FOR UPDATE in sequence order within a partition, after the
-- delivery rows and before the frontiers (the lock order in _migrations.py); a
-- range leased again meanwhile no longer matches once the lock is granted.
-- Returns the elements that took effect, and the (group, partition) of those
-- that finished (the frontiers they may move).

CREATE OR REPLACE FUNCTION {s}.settle_ranged(p_op smallint, p_groups integer[],
                                             p_parts integer[], p_seqs bigint[],
                                             p_leases uuid[], p_atts integer[], p_done bigint[],
                                             p_reason text, p_delay_ms bigint, p_error text,
                                             p_now bigint, p_deadline bigint,
                                             OUT o_idx bigint[], OUT o_groups integer[],
                                             OUT o_parts integer[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    h_g integer[];
    h_part integer[];
    h_first bigint[];
    h_seq bigint[];
    h_lease uuid[];
    h_att integer[];
    h_pend integer[];
    h_spent boolean[];
    h_consumer text[];
    h_deadline bigint[];
BEGIN
    WITH u AS (
        SELECT u.g, u.part, u.seq, u.lease, u.att, u.idx, replace(u.lease::text, '-', '') AS hex
        FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
             AS u(g, part, seq, lease, att, idx)
        WHERE u.idx <> ALL (COALESCE(p_done, '{}'::bigint[]))
    ), k AS (
        SELECT u.g, u.part, left(u.hex, 24) AS token, min(u.seq) AS low
        FROM u GROUP BY u.g, u.part, left(u.hex, 24)
        ORDER BY u.g, u.part, min(u.seq) OFFSET 0
    ), r AS (
        -- spent: a nack of this attempt dead-letters (only nack needs max_attempts).
        SELECT x.*, p_op = 2 AND x.attempt >= (SELECT gr.max_attempts FROM {s}.groups gr
                                               WHERE gr.id = x.group_id) AS spent
        FROM k CROSS JOIN LATERAL (
            SELECT r.group_id, r.part, r.first_seq, r.last_seq, r.base_seq, r.token, r.attempt,
                   r.done, r.pending, r.consumer_id, r.deadline_ms
            FROM {s}.ranges r
            WHERE r.group_id = k.g AND r.part = k.part AND r.token = k.token AND r.pending > 0
            ORDER BY r.first_seq FOR UPDATE) x
    )
    SELECT array_agg(u.idx), array_agg(u.g), array_agg(u.part), array_agg(r.first_seq),
           array_agg(u.seq), array_agg(u.lease), array_agg(u.att), array_agg(r.pending),
           array_agg(r.spent), array_agg(r.consumer_id), array_agg(r.deadline_ms)
    INTO o_idx, h_g, h_part, h_first, h_seq, h_lease, h_att, h_pend, h_spent, h_consumer,
         h_deadline
    FROM u
    JOIN r ON r.group_id = u.g AND r.part = u.part AND r.token = left(u.hex, 24)
          AND u.seq BETWEEN r.first_seq AND r.last_seq AND r.attempt = u.att
          AND u.seq - r.base_seq = ('x' || right(u.hex, 8))::bit(32)::integer
          AND get_bit(r.done, (u.seq - r.first_seq)::integer) = 0;
    IF o_idx IS NULL THEN
        RETURN;
    END IF;

    WITH h AS (
        SELECT * FROM unnest(h_g, h_part, h_first, h_seq, h_lease, h_att, h_pend, h_spent,
                             h_consumer, h_deadline)
            AS h(g, part, first, seq, lease, att, pend, spent, consumer, deadline)
    ), per AS (
        SELECT h.g, h.part, h.first, count(*)::integer AS n, max(h.pend) AS pend,
               array_agg(h.seq - h.first) AS offs
        FROM h GROUP BY h.g, h.part, h.first
    ), marked AS (
        UPDATE {s}.ranges r SET
            done = CASE WHEN p_op = 0 AND p.n = p.pend THEN r.done
                        WHEN p.n = p.pend THEN repeat('1', length(r.done))::varbit
                        ELSE r.done | (SELECT string_agg(CASE WHEN x.o IS NULL THEN '0' ELSE '1'
                                                         END, '' ORDER BY b.o)
                                       FROM generate_series(0, length(r.done) - 1) AS b(o)
                                       LEFT JOIN unnest(p.offs) AS x(o) ON x.o = b.o)::varbit
                   END,
            pending = CASE WHEN p_op = 0 AND p.n = p.pend THEN r.pending
                           ELSE r.pending - p.n END,
            deadline_ms = CASE WHEN p_op = 0 AND p.n = p.pend THEN p_deadline
                               ELSE r.deadline_ms END
        FROM per p
        WHERE r.group_id = p.g AND r.part = p.part AND r.first_seq = p.first
    )
    INSERT INTO {s}.deliveries (group_id, part, seq, state, attempt, lease_id, consumer_id,
                                deadline_ms, available_at_ms, rejected_at_ms, settled_by, reason,
                                last_error)
    SELECT h.g, h.part, h.seq,
           CASE WHEN p_op = 0 THEN 1 WHEN p_op = 3 OR h.spent THEN 3 ELSE 0 END,
           h.att, h.lease, h.consumer,
           CASE WHEN p_op = 0 THEN p_deadline ELSE h.deadline END,
           CASE WHEN p_op = 2 THEN p_now + p_delay_ms ELSE 0 END,
           CASE WHEN p_op = 3 OR h.spent THEN p_now ELSE 0 END,
           NULLIF(p_op, 0),
           CASE WHEN p_op = 0 THEN '' WHEN h.spent THEN 'max_attempts' ELSE p_reason END,
           CASE WHEN p_op = 0 THEN NULL ELSE p_error END
    FROM h
    WHERE p_op IN (2, 3) OR (p_op = 0 AND h.pend > (SELECT p.n FROM per p
                                                    WHERE p.g = h.g AND p.part = h.part
                                                      AND p.first = h.first));

    SELECT array_agg(h.g), array_agg(h.part) INTO o_groups, o_parts
    FROM unnest(h_g, h_part, h_spent) AS h(g, part, spent)
    WHERE p_op = 1 OR p_op = 3 OR h.spent;
END
$fn$;
