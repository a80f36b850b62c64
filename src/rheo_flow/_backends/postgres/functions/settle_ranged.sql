-- settle_ranged: the part of a settle or renew batch (functions/settle.sql,
-- functions/renew.sql) that names events held by range leases
-- (migrations/v8_ranges.sql). Elements listed in p_done are skipped; each
-- other element whose range is in flight under its very token, offset and
-- attempt, with its bit still clear, takes effect:
--
-- * ack: its bit is set;
-- * nack and reject: its bit is set and it becomes a delivery row, as
--   settle leaves one (available after the delay; or a dead letter: a reject, or
--   a nack of the last attempt);
-- * renew: the range's deadline moves when the batch renews every event it
--   has in flight; else the events renewed become delivery rows, leased until
--   p_deadline, and their bits are set (the others keep the range's deadline).
--
-- Ranges are locked FOR UPDATE in sequence order within a partition, before the
-- delivery rows and the frontiers (the lock order in _migrations.py); a range
-- leased again meanwhile no longer matches once the lock is granted. The work
-- is per range, not per element, wherever it can be: one statement locks the
-- ranges and matches the elements, counting each range's hits (with the bits
-- to set when they are not all its events in flight); one updates the ranges.
-- Only a nack, a reject or a partial renew writes rows per element.
-- Reply (one row): o_idx, the elements that took effect (numbered from 1);
-- o_groups and o_parts, the (group, partition) of the ranges whose settles
-- finished events (the frontiers they may move). p_op: op_renew(), op_ack(),
-- op_nack() or op_reject() (functions/states.sql).

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
    -- Per range matched: its key (group, partition, first_seq), the elements that
    -- hit it and its events in flight, the bits they set (NULL: all of those in
    -- flight), whether a nack of it is of its last attempt.
    v_range_groups integer[];
    v_range_parts integer[];
    v_range_firsts bigint[];
    v_range_hits integer[];
    v_range_pending integer[];
    v_range_masks varbit[];
    v_range_spent boolean[];
BEGIN
    WITH u AS (
        SELECT u.g, u.part, u.seq, u.att, u.idx, uuid_send(u.lease) AS b
        FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
             AS u(g, part, seq, lease, att, idx)
        WHERE u.idx <> ALL (COALESCE(p_done, '{}'::bigint[]))
    ), k AS (
        SELECT u.g, u.part, substring(u.b FROM 1 FOR 12) AS token, min(u.seq) AS low
        FROM u GROUP BY u.g, u.part, substring(u.b FROM 1 FOR 12)
        ORDER BY u.g, u.part, min(u.seq) OFFSET 0
    ), r AS (
        SELECT x.* FROM k CROSS JOIN LATERAL (
            SELECT r.group_id, r.part, r.first_seq, r.last_seq, r.base_seq, r.token, r.attempt,
                   r.done, r.pending
            FROM {s}.ranges r
            WHERE r.group_id = k.g AND r.part = k.part AND r.token = k.token AND r.pending > 0
            ORDER BY r.first_seq FOR UPDATE) x
    ), hit AS (
        SELECT u.idx, u.seq - r.first_seq AS off, r.group_id, r.part, r.first_seq,
               r.last_seq - r.first_seq + 1 AS len, r.pending, r.attempt
        FROM u
        JOIN r ON r.group_id = u.g AND r.part = u.part AND r.token = substring(u.b FROM 1 FOR 12)
              AND u.seq BETWEEN r.first_seq AND r.last_seq AND r.attempt = u.att
              AND u.seq - r.base_seq = (get_byte(u.b, 12) << 24 | get_byte(u.b, 13) << 16
                                        | get_byte(u.b, 14) << 8 | get_byte(u.b, 15))
              AND get_bit(r.done, (u.seq - r.first_seq)::integer) = 0
    ), per AS (
        SELECT h.group_id, h.part, h.first_seq, count(*)::integer AS n, max(h.pending) AS pend,
               CASE WHEN count(*) < max(h.pending)
                    THEN {s}.range_bits(max(h.len)::integer, array_agg(h.off)) END AS mask,
               p_op = {s}.op_nack()
               AND max(h.attempt) >= (SELECT gr.max_attempts FROM {s}.groups gr
                                      WHERE gr.id = h.group_id) AS spent
        FROM hit h GROUP BY h.group_id, h.part, h.first_seq
    )
    SELECT (SELECT array_agg(h.idx) FROM hit h), array_agg(p.group_id), array_agg(p.part),
           array_agg(p.first_seq), array_agg(p.n), array_agg(p.pend), array_agg(p.mask),
           array_agg(p.spent)
    INTO o_idx, v_range_groups, v_range_parts, v_range_firsts, v_range_hits, v_range_pending,
         v_range_masks, v_range_spent
    FROM per p;
    IF o_idx IS NULL THEN
        RETURN;
    END IF;

    IF p_op <> {s}.op_ack() AND (p_op <> {s}.op_renew() OR true = ANY (ARRAY(
            SELECT x.n < x.pend FROM unnest(v_range_hits, v_range_pending) AS x(n, pend)))) THEN
        -- Events split off their range: the elements that took effect, again by
        -- their (locked, not yet changed) range.
        INSERT INTO {s}.deliveries (group_id, part, seq, state, attempt, lease_id, consumer_id,
                                    deadline_ms, available_at_ms, rejected_at_ms, settled_by,
                                    reason, last_error)
        SELECT u.g, u.part, u.seq,
               CASE WHEN p_op = {s}.op_renew() THEN {s}.delivery_leased()
                    WHEN p_op = {s}.op_reject() OR x.spent THEN {s}.delivery_rejected()
                    ELSE {s}.delivery_available() END,
               u.att, u.lease, o.consumer_id,
               CASE WHEN p_op = {s}.op_renew() THEN p_deadline ELSE o.deadline_ms END,
               CASE WHEN p_op = {s}.op_nack() THEN p_now + p_delay_ms ELSE 0 END,
               CASE WHEN p_op = {s}.op_reject() OR x.spent THEN p_now ELSE 0 END,
               NULLIF(p_op, {s}.op_renew()),
               CASE WHEN p_op = {s}.op_renew() THEN '' WHEN x.spent THEN 'max_attempts'
                    ELSE p_reason END,
               CASE WHEN p_op = {s}.op_renew() THEN NULL ELSE p_error END
        FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
             AS u(g, part, seq, lease, att, idx)
        JOIN unnest(v_range_groups, v_range_parts, v_range_firsts, v_range_hits, v_range_pending,
                    v_range_spent) AS x(g, part, first, n, pend, spent)
          ON x.g = u.g AND x.part = u.part AND u.seq >= x.first
        CROSS JOIN LATERAL (
            SELECT o.last_seq, o.consumer_id, o.deadline_ms FROM {s}.ranges o
            WHERE o.group_id = x.g AND o.part = x.part AND o.first_seq = x.first) o
        WHERE u.idx = ANY (o_idx) AND u.seq <= o.last_seq
          AND (p_op <> {s}.op_renew() OR x.n < x.pend);
    END IF;

    UPDATE {s}.ranges r SET
        done = CASE WHEN p_op = {s}.op_renew() AND x.n = x.pend THEN r.done
                    WHEN x.n = x.pend THEN repeat('1', length(r.done))::varbit
                    ELSE r.done | x.mask END,
        pending = CASE WHEN p_op = {s}.op_renew() AND x.n = x.pend THEN r.pending
                       ELSE r.pending - x.n END,
        deadline_ms = CASE WHEN p_op = {s}.op_renew() AND x.n = x.pend THEN p_deadline
                           ELSE r.deadline_ms END
    FROM unnest(v_range_groups, v_range_parts, v_range_firsts, v_range_hits, v_range_pending,
                v_range_masks) AS x(g, part, first, n, pend, mask)
    WHERE r.group_id = x.g AND r.part = x.part AND r.first_seq = x.first;

    SELECT array_agg(x.g), array_agg(x.part) INTO o_groups, o_parts
    FROM unnest(v_range_groups, v_range_parts, v_range_spent) AS x(g, part, spent)
    WHERE p_op = {s}.op_ack() OR p_op = {s}.op_reject() OR x.spent;
END
$fn$;

-- range_bits: the bit string of p_len bits with those at the offsets p_offs set.

CREATE OR REPLACE FUNCTION {s}.range_bits(p_len integer, p_offs bigint[]) RETURNS varbit
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT string_agg(CASE WHEN x.o IS NULL THEN '0' ELSE '1' END, '' ORDER BY b.o)::varbit
    FROM generate_series(0, p_len - 1) AS b(o)
    LEFT JOIN (SELECT DISTINCT o FROM unnest(p_offs) AS x(o)) x ON x.o = b.o
$fn$;
