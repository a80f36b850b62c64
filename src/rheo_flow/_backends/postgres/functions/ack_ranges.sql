-- ack_ranges: the fenced acks of a batch of one group, sent per range rather
-- than per lease. The client splits every lease id into its range's token (12
-- bytes) and an offset (4 bytes) and groups the leases by (partition, token,
-- attempt, base = sequence - offset); each group travels as its lowest sequence
-- (lo), a bit per sequence from lo (set: acked by this batch) and its count.
-- Lease ids of delivery rows split the same way, into groups of one that no
-- range matches.
--
-- The common case, every group matching its range in flight (its token,
-- attempt and base, its bits within the range and still clear), costs one
-- statement that locks the ranges (FOR UPDATE, by partition and sequence: the
-- lock order of _migrations.py) and one that sets their bits by address; then
-- the frontiers move. Otherwise nothing is changed here: every element is
-- expanded back into its lease (token and offset) and the batch goes through
-- settle (functions/settle.sql), which relocks the same ranges (already held)
-- before any delivery row or frontier, and explains every miss. Elements are
-- numbered from 1 group by group, by sequence within a group, as the client
-- sent them.
--
-- Reply (one row): settle's bad_idx, bad_code, bad_by (functions/settle.sql),
-- all NULL when every ack took effect; bad_idx numbers elements as above.

CREATE OR REPLACE FUNCTION {s}.range_mask(p_first bigint, p_last bigint, p_lo bigint,
                                          p_bits varbit) RETURNS varbit
LANGUAGE sql IMMUTABLE
AS $fn$
    -- p_bits (from sequence p_lo) laid over the range p_first .. p_last; NULL
    -- when they do not fit inside it.
    SELECT CASE WHEN p_lo >= p_first AND p_lo + length(p_bits) - 1 <= p_last
                THEN repeat('0', (p_lo - p_first)::integer)::varbit || p_bits
                     || repeat('0', (p_last - p_lo + 1 - length(p_bits))::integer)::varbit
           END
$fn$;

CREATE OR REPLACE FUNCTION {s}.ack_ranges(p_group integer, p_parts integer[], p_tokens text[],
                                          p_atts integer[], p_bases bigint[], p_los bigint[],
                                          p_bits varbit[], p_ns integer[],
                                          OUT bad_idx bigint[], OUT bad_code smallint[],
                                          OUT bad_by smallint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    -- Per group sent: the range it matches (by address), the bits it sets there
    -- (NULL: it does not fit), how many leases it acks.
    v_range_tids tid[];
    v_range_masks varbit[];
    v_range_hits integer[];
    v_acked_parts integer[];
    v_all_match boolean;       -- every group matches its own range in flight
    -- The fallback: every lease expanded back, sorted by delivery, with its
    -- element's number.
    v_lease_parts integer[];
    v_lease_seqs bigint[];
    v_lease_ids uuid[];
    v_lease_attempts integer[];
    v_lease_elements bigint[];
BEGIN
    WITH a AS (
        SELECT * FROM unnest(p_parts, p_tokens, p_atts, p_bases, p_los, p_bits, p_ns)
                      WITH ORDINALITY AS a(part, token, att, base, lo, bits, n, i)
    ), l AS (
        SELECT a.i, a.n, a.part, x.tid,
               CASE WHEN x.attempt = a.att AND x.base_seq = a.base
                    THEN {s}.range_mask(x.first_seq, x.last_seq, a.lo, a.bits) END AS mask,
               x.done
        FROM a LEFT JOIN LATERAL (
            SELECT r.ctid AS tid, r.first_seq, r.last_seq, r.base_seq, r.attempt, r.done
            FROM {s}.ranges r
            WHERE r.group_id = p_group AND r.part = a.part AND r.token = decode(a.token, 'hex')
              AND r.pending > 0
            ORDER BY r.first_seq FOR UPDATE) x ON true
        ORDER BY a.i
    )
    SELECT array_agg(l.tid), array_agg(l.mask), array_agg(l.n),
           array_agg(DISTINCT l.part),
           bool_and(l.mask IS NOT NULL AND position(B'1' IN l.done & l.mask) = 0)
           AND count(DISTINCT l.tid) = cardinality(p_parts)
    INTO v_range_tids, v_range_masks, v_range_hits, v_acked_parts, v_all_match
    FROM l;

    IF v_all_match THEN
        UPDATE {s}.ranges r SET done = r.done | x.mask, pending = r.pending - x.n
        FROM unnest(v_range_tids, v_range_masks, v_range_hits) AS x(tid, mask, n)
        WHERE r.ctid = x.tid;
        PERFORM {s}.advance_frontiers(array_fill(p_group, ARRAY[cardinality(v_acked_parts)]),
                                      v_acked_parts);
        RETURN;
    END IF;

    -- Some group matches no range in flight: settle lease by lease, sorted by
    -- delivery as settle takes them, each remembering its element's number.
    SELECT array_agg(e.part ORDER BY e.part, e.seq), array_agg(e.seq ORDER BY e.part, e.seq),
           array_agg(e.lease ORDER BY e.part, e.seq), array_agg(e.att ORDER BY e.part, e.seq),
           array_agg(e.idx ORDER BY e.part, e.seq)
    INTO v_lease_parts, v_lease_seqs, v_lease_ids, v_lease_attempts, v_lease_elements
    FROM (
        SELECT a.part, a.lo + o.o - 1 AS seq, a.att,
               (a.token || lpad(to_hex(a.lo + o.o - 1 - a.base), 8, '0'))::uuid AS lease,
               a.before + row_number() OVER (PARTITION BY a.i ORDER BY o.o) AS idx
        FROM (SELECT a.*, sum(a.n) OVER (ORDER BY a.i) - a.n AS before
              FROM unnest(p_parts, p_tokens, p_atts, p_bases, p_los, p_bits, p_ns)
                   WITH ORDINALITY AS a(part, token, att, base, lo, bits, n, i)) a
        CROSS JOIN LATERAL generate_series(1, length(a.bits)) AS o(o)
        WHERE substring(a.bits FROM o.o FOR 1) = B'1'
    ) e;
    SELECT s.bad_idx, s.bad_code, s.bad_by INTO bad_idx, bad_code, bad_by
    FROM {s}.settle({s}.op_ack(), array_fill(p_group, ARRAY[cardinality(v_lease_seqs)]),
                    v_lease_parts, v_lease_seqs, v_lease_ids, v_lease_attempts, '', 0) s;
    -- Each lease's number back as its element's, in bad_code's order.
    bad_idx := ARRAY(SELECT v_lease_elements[b.b] FROM unnest(bad_idx) WITH ORDINALITY AS b(b, k)
                     ORDER BY b.k);
END
$fn$;

-- ack_ranges_fetch: ack_ranges then fetch in one transaction, as ack_fetch
-- (functions/ack_fetch.sql) does with acks sent lease by lease. The first row
-- carries the acks' bad_* only (NULL: every ack took effect); the leases follow.
--
-- Reply: ack_fetch's columns (functions/ack_fetch.sql): the first row has
-- o_part .. o_appended NULL and ack_ranges's bad_*; every later row is a lease
-- of the fetch, with bad_* NULL.

CREATE OR REPLACE FUNCTION {s}.ack_ranges_fetch(p_parts integer[], p_tokens text[],
                                                p_atts integer[], p_bases bigint[],
                                                p_los bigint[], p_bits varbit[], p_ns integer[],
                                                p_group integer, p_fetch_parts integer[],
                                                p_limit integer, p_lease_ms bigint,
                                                p_consumer text)
RETURNS TABLE (o_part integer, o_seq bigint, o_attempt integer, o_lease uuid,
               o_deadline bigint, o_event_id text, o_type text, o_key text,
               o_data text, o_headers text, o_appended bigint,
               bad_idx bigint[], bad_code smallint[], bad_by smallint[])
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_bad_idx bigint[];
    v_bad_code smallint[];
    v_bad_by smallint[];
BEGIN
    IF cardinality(p_parts) > 0 THEN
        SELECT s.bad_idx, s.bad_code, s.bad_by INTO v_bad_idx, v_bad_code, v_bad_by
        FROM {s}.ack_ranges(p_group, p_parts, p_tokens, p_atts, p_bases, p_los, p_bits, p_ns) s;
        PERFORM set_config('rheo_flow.holding_locks', 'on', true);
    END IF;
    o_part := NULL;
    bad_idx := v_bad_idx;
    bad_code := v_bad_code;
    bad_by := v_bad_by;
    RETURN NEXT;
    RETURN QUERY
    SELECT f.*, NULL::bigint[], NULL::smallint[], NULL::smallint[]
    FROM {s}.fetch(p_group, p_fetch_parts, p_limit, p_lease_ms, p_consumer) f;
END
$fn$;
