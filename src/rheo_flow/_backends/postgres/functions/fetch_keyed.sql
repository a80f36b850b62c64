-- fetch of a key-ordered group (groups.ordering = 1; docs/ordering.md), called by
-- fetch (functions/fetch.sql) with the group's stream and max_attempts. It is an
-- overload of fetch (seven arguments) rather than a function of its own name, so
-- the schema keeps the four function names of every release.
--
-- Rule: a delivery of key K in partition p is eligible only when no delivery of
-- K in p with a smaller sequence is unsettled (available or leased: state < 2).
-- Every delivery of such a group stores a key: 'k' || K for an event of key K,
-- '-' || seq for a keyless event (its own key, so it never waits; no 'k' key can
-- equal it). deliveries_keyed indexes the unsettled ones by (key, seq), so the
-- first unsettled delivery of each key, its *head*, is the only one of the key
-- that may be eligible. Nothing is maintained at settle time: the deliveries
-- behind a head are ordinary available rows (attempt 0, "blocked") and the next
-- becomes the head by itself once the earlier ones are settled (acked, rejected,
-- dead-lettered) or removed (trim, replay, reset). No statement reads settled
-- rows, nor the blocked rows behind a head.
--
-- 1. Per partition, the heads: a skip scan of deliveries_keyed (one descent per
--    key with an unsettled delivery, i.e. about one per lease in flight), then
--    the due ones (available and due, or leased and expired) looked up by key
--    lowest sequence first and locked FOR UPDATE SKIP LOCKED until p_limit are
--    found (competing fetches claim disjoint rows; a row another fetch changed
--    meanwhile fails the re-check under the lock). Expired leases at max attempts
--    are dead-lettered, which releases their keys.
-- 2. New events past each locked cursor are read (seq, key) in chunks: a keyless
--    event is free; a keyed one is free when its key has no unsettled delivery
--    (one probe) and was not met earlier in this scan, else it is blocked. The
--    scan stops once the partition has p_limit candidates, at the high water, or
--    after c_budget events (the cursor moves past what was read, so the next
--    fetch goes on from there: a long run of one key never stalls the others).
-- 3. Round-robin winners as in fetch; each partition's new rows are inserted up
--    to just before its first free event not leased (the leased rows, and the
--    blocked ones stored available), and its cursor moves there.
--
-- Concurrency: only the holder of a partition's cursor row inserts its
-- deliveries, and they are inserted in sequence order, so an unsettled delivery
-- is never missed by a probe or a skip scan; one settled since the statement
-- began may still count as unsettled (the key then waits for the next fetch).
-- Only a head can be eligible, so two deliveries of one key are never leased at
-- once (but for redrive, docs/ordering.md).

CREATE OR REPLACE FUNCTION {s}.fetch(p_group integer, p_parts integer[], p_limit integer,
                                     p_lease_ms bigint, p_consumer text,
                                     p_stream integer, p_max integer)
RETURNS TABLE (o_part integer, o_seq bigint, o_attempt integer, o_lease uuid,
               o_deadline bigint, o_event_id text, o_type text, o_key text,
               o_data text, o_headers text, o_appended bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    c_chunk CONSTANT integer := 256;
    c_budget CONSTANT integer := 4096;
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    c_part integer[];
    c_seq bigint[];
    c_att integer[];
    c_tid tid[];
    k_part integer[];
    k_cur bigint[];
    k_high bigint[];
    s_part integer[] := '{}';
    s_seq bigint[] := '{}';
    s_key text[] := '{}';
    s_depth bigint[] := '{}';
    v_seen text[];
    v_rows record;
    v_i integer;
    v_part integer;
    v_heads bigint[];
    v_have bigint;
    v_last bigint;
    v_read integer;
    v_wait integer;
    v_doomed tid[];
    o_parts integer[];
    o_seqs bigint[];
    r_tid tid[];
    n_part integer[];
    n_seq bigint[];
    e_part integer[];
    e_hi bigint[];
    v_prefix text;
BEGIN
    -- Step 1: each partition's heads (the first unsettled delivery of each stored
    -- key: one descent of deliveries_keyed per key), then those due, by address.
    FOREACH v_part IN ARRAY p_parts LOOP
        WITH RECURSIVE heads (key, seq) AS (
            (SELECT d.key, d.seq FROM {s}.deliveries d
             WHERE d.group_id = p_group AND d.part = v_part
               AND d.key IS NOT NULL AND d.state < 2
             ORDER BY d.key, d.seq LIMIT 1)
            UNION ALL
            SELECT n.key, n.seq FROM heads h CROSS JOIN LATERAL (
                SELECT d.key, d.seq FROM {s}.deliveries d
                WHERE d.group_id = p_group AND d.part = v_part AND d.key > h.key
                  AND d.key IS NOT NULL AND d.state < 2
                ORDER BY d.key, d.seq LIMIT 1) n
        )
        SELECT array_agg(h.seq ORDER BY h.seq) INTO v_heads FROM heads h;
        CONTINUE WHEN v_heads IS NULL;
        -- One lookup (and lock) per head, lowest first, until p_limit are found.
        SELECT c_part || array_agg(v_part), c_seq || array_agg(x.seq ORDER BY x.seq),
               c_att || array_agg(x.attempt ORDER BY x.seq),
               c_tid || array_agg(x.tid ORDER BY x.seq)
        INTO c_part, c_seq, c_att, c_tid
        FROM (SELECT y.* FROM unnest(v_heads) AS h(seq)
              CROSS JOIN LATERAL (
                  SELECT d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
                  WHERE d.group_id = p_group AND d.part = v_part AND d.seq = h.seq
                    AND ((d.state = 0 AND d.available_at_ms <= v_now)
                         OR (d.state = 1 AND d.deadline_ms <= v_now))
                  FOR UPDATE OF d SKIP LOCKED) y
              LIMIT p_limit) x;
    END LOOP;

    SELECT array_agg(k.part), array_agg(k.cursor), array_agg(k.high)
    INTO k_part, k_cur, k_high
    FROM (SELECT c.part, c.cursor, pt.high_water AS high FROM {s}.cursors c
          JOIN {s}.partitions pt ON pt.stream_id = p_stream AND pt.part = c.part
          WHERE c.group_id = p_group AND c.part = ANY (p_parts) AND c.cursor < pt.high_water
          FOR UPDATE OF c SKIP LOCKED) k;

    IF c_part IS NULL AND k_part IS NULL THEN
        -- As in fetch: wait for ONE cursor while holding no lock, then claim again.
        SELECT c.part INTO v_wait
        FROM {s}.cursors c
        JOIN {s}.partitions pt ON pt.stream_id = p_stream AND pt.part = c.part
        WHERE c.group_id = p_group AND c.part = ANY (p_parts) AND c.cursor < pt.high_water
        ORDER BY array_position(p_parts, c.part)
        LIMIT 1;
        IF FOUND THEN
            PERFORM 1 FROM {s}.cursors c WHERE c.group_id = p_group AND c.part = v_wait
            FOR UPDATE;
            SELECT array_agg(k.part), array_agg(k.cursor), array_agg(k.high)
            INTO k_part, k_cur, k_high
            FROM (SELECT c.part, c.cursor, pt.high_water AS high FROM {s}.cursors c
                  JOIN {s}.partitions pt ON pt.stream_id = p_stream AND pt.part = c.part
                  WHERE c.group_id = p_group AND c.part = ANY (p_parts)
                    AND c.cursor < pt.high_water
                  FOR UPDATE OF c SKIP LOCKED) k;
        END IF;
    END IF;
    IF c_part IS NULL AND k_part IS NULL THEN
        RETURN;
    END IF;

    IF c_part IS NOT NULL THEN
        SELECT array_agg(x.tid) INTO v_doomed
        FROM unnest(c_tid, c_att) AS x(tid, attempt) WHERE x.attempt >= p_max;
        IF v_doomed IS NOT NULL THEN
            UPDATE {s}.deliveries d
            SET state = 3, reason = 'max_attempts', settled_by = NULL, rejected_at_ms = v_now
            WHERE d.ctid = ANY (v_doomed);
            PERFORM {s}.advance_frontiers(array_agg(p_group), array_agg(x.part))
            FROM (SELECT DISTINCT x.part FROM unnest(c_part, c_att) AS x(part, attempt)
                  WHERE x.attempt >= p_max) x;
        END IF;
    END IF;

    -- Step 2: each locked partition's new events, until it has p_limit candidates.
    FOR v_i IN 1 .. COALESCE(cardinality(k_part), 0) LOOP
        SELECT count(*) INTO v_have FROM unnest(c_part, c_att) AS x(part, attempt)
        WHERE x.part = k_part[v_i] AND x.attempt < p_max;
        v_last := k_cur[v_i];
        v_read := 0;
        v_seen := '{}';
        <<scan>>
        WHILE v_have < p_limit AND v_last < k_high[v_i] AND v_read < c_budget LOOP
            FOR v_rows IN
                SELECT e.seq, e.key,
                       CASE WHEN e.key IS NULL THEN '-' || e.seq ELSE 'k' || e.key END
                           AS stored,
                       e.key IS NOT NULL AND EXISTS (
                           SELECT 1 FROM {s}.deliveries b
                           WHERE b.group_id = p_group AND b.part = k_part[v_i]
                             AND b.key = ('k' || e.key) COLLATE "C" AND b.key IS NOT NULL
                             AND b.state < 2) AS unsettled
                FROM (SELECT e.seq, e.key FROM {s}.events e
                      WHERE e.stream_id = p_stream AND e.part = k_part[v_i] AND e.seq > v_last
                        AND e.seq <= k_high[v_i]
                      ORDER BY e.seq LIMIT c_chunk) e
                ORDER BY e.seq
            LOOP
                v_last := v_rows.seq;
                v_read := v_read + 1;
                IF v_rows.key IS NULL THEN
                    v_have := v_have + 1;
                    s_depth := s_depth || v_have;
                ELSIF v_rows.key = ANY (v_seen) THEN  -- met already: blocked, or taken
                    s_depth := s_depth || NULL::bigint;
                ELSIF v_rows.unsettled THEN
                    v_seen := v_seen || v_rows.key;
                    s_depth := s_depth || NULL::bigint;
                ELSE
                    v_seen := v_seen || v_rows.key;
                    v_have := v_have + 1;
                    s_depth := s_depth || v_have;
                END IF;
                s_part := s_part || k_part[v_i];
                s_seq := s_seq || v_rows.seq;
                s_key := s_key || v_rows.stored;
                EXIT scan WHEN v_have >= p_limit;
            END LOOP;
            EXIT scan WHEN NOT FOUND;
        END LOOP;
    END LOOP;

    -- Step 3: the round-robin winners, as in fetch (existing rows by address).
    WITH cand AS (
        SELECT x.part, x.seq, x.tid, row_number() OVER (PARTITION BY x.part ORDER BY x.seq)
               AS depth
        FROM unnest(c_part, c_seq, c_att, c_tid) AS x(part, seq, attempt, tid)
        WHERE x.attempt < p_max
    ), fresh AS (
        SELECT s.part, s.seq, NULL::tid AS tid, s.depth
        FROM unnest(s_part, s_seq, s_depth) AS s(part, seq, depth) WHERE s.depth IS NOT NULL
    ), chosen AS (
        SELECT a.part, a.seq, a.tid, a.depth, array_position(p_parts, a.part) AS pos
        FROM (SELECT * FROM cand UNION ALL SELECT * FROM fresh) a
        ORDER BY a.depth, array_position(p_parts, a.part)
        LIMIT p_limit
    )
    SELECT array_agg(c.part ORDER BY c.depth, c.pos), array_agg(c.seq ORDER BY c.depth, c.pos),
           array_agg(c.tid) FILTER (WHERE c.tid IS NOT NULL),
           array_agg(c.part ORDER BY c.depth, c.pos) FILTER (WHERE c.tid IS NULL),
           array_agg(c.seq ORDER BY c.depth, c.pos) FILTER (WHERE c.tid IS NULL)
    INTO o_parts, o_seqs, r_tid, n_part, n_seq
    FROM chosen c;

    -- Each scanned partition's new rows end before its first free event not leased.
    SELECT array_agg(m.part), array_agg(m.hi) INTO e_part, e_hi
    FROM (SELECT s.part, COALESCE(min(s.seq) FILTER (WHERE s.depth IS NOT NULL
                                                     AND n.seq IS NULL) - 1,
                                  max(s.seq)) AS hi
          FROM unnest(s_part, s_seq, s_depth) AS s(part, seq, depth)
          LEFT JOIN unnest(n_part, n_seq) AS n(part, seq)
            ON n.part = s.part AND n.seq = s.seq
          GROUP BY s.part) m
    JOIN unnest(k_part, k_cur) AS k(part, cur) ON k.part = m.part AND m.hi > k.cur;

    IF o_parts IS NULL AND e_part IS NULL THEN
        RETURN;
    END IF;
    v_prefix := left(replace(gen_random_uuid()::text, '-', ''), 24);

    RETURN QUERY
    WITH releases AS (
        UPDATE {s}.deliveries d
        SET state = 1, attempt = d.attempt + 1, lease_id = gen_random_uuid(),
            consumer_id = p_consumer, deadline_ms = v_now + p_lease_ms, settled_by = NULL
        WHERE d.ctid = ANY (COALESCE(r_tid, '{}'::tid[]))
        RETURNING d.part, d.seq, d.attempt, d.lease_id
    ), todo AS (
        SELECT s.part, s.seq, s.key, n.ord
        FROM unnest(s_part, s_seq, s_key) AS s(part, seq, key)
        JOIN unnest(e_part, e_hi) AS m(part, hi) ON m.part = s.part AND s.seq <= m.hi
        LEFT JOIN unnest(n_part, n_seq) WITH ORDINALITY AS n(part, seq, ord)
          ON n.part = s.part AND n.seq = s.seq
    ), created AS (
        INSERT INTO {s}.deliveries
            (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms, key)
        SELECT p_group, r.part, r.seq,
               CASE WHEN r.ord IS NULL THEN 0 ELSE 1 END,
               CASE WHEN r.ord IS NULL THEN 0 ELSE 1 END,
               CASE WHEN r.ord IS NULL THEN NULL
                    ELSE (v_prefix || lpad(to_hex(r.ord), 8, '0'))::uuid END,
               CASE WHEN r.ord IS NULL THEN NULL ELSE p_consumer END,
               CASE WHEN r.ord IS NULL THEN 0 ELSE v_now + p_lease_ms END,
               r.key
        FROM todo r
        RETURNING part, seq, attempt, lease_id, state
    ), moved AS (
        UPDATE {s}.cursors cu SET cursor = m.hi
        FROM unnest(e_part, e_hi) AS m(part, hi)
        WHERE cu.group_id = p_group AND cu.part = m.part
    )
    SELECT l.part, l.seq, l.attempt, l.lease_id, v_now + p_lease_ms,
           e.event_id, e.type, e.key, e.data::text, e.headers::text, e.appended_at_ms
    FROM (SELECT r.part, r.seq, r.attempt, r.lease_id FROM releases r
          UNION ALL
          SELECT c.part, c.seq, c.attempt, c.lease_id FROM created c WHERE c.state = 1) l
    JOIN unnest(o_parts, o_seqs) WITH ORDINALITY AS o(part, seq, ord)
      ON o.part = l.part AND o.seq = l.seq
    CROSS JOIN LATERAL (
        SELECT e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
        FROM {s}.events e
        WHERE e.stream_id = p_stream AND e.part = l.part AND e.seq = l.seq
        OFFSET 0) e
    ORDER BY o.ord;
END
$fn$;
