-- fetch: one round trip claims up to p_limit deliveries of a group, round-robin
-- over p_parts (see the package docstring for the tables and the lock order).
-- Installed at its latest version after every migration (CREATE OR REPLACE).
--
-- It commits durably: a fetch that switched its own transaction to
-- asynchronous commit (schema version 2) let a server crash right after a
-- re-lease undo the re-lease while the superseded holder's ack, arriving after
-- the restart, matched the restored row and took effect.
--
-- Plans do not depend on table statistics: PL/pgSQL caches one generic plan per
-- statement and session, and a plan made while `deliveries` was small joined
-- the batch by hashing every delivery of the group. Every row is found through
-- its key (LATERAL subqueries the planner cannot flatten, sequential and bitmap
-- scans off inside the function), and locked rows are updated by address
-- (`ctid = ANY(...)`: a locked row cannot move before the transaction ends).
--
-- Nothing to lease again (the common case): one statement picks the new
-- deliveries in round-robin order (their depth, sequence - cursor, then the
-- rotation position), reads their events by range, inserts them and moves the
-- cursors. Both paths that lease only new deliveries read each partition's range
-- of events (r.lo..r.hi) in one scan, insert one delivery per event, and return
-- the leases in their order.
--
-- A key-ordered group (groups.ordering = 1) is fetched by the seven-argument
-- overload of functions/fetch_keyed.sql instead.

CREATE OR REPLACE FUNCTION {s}.fetch(p_group integer, p_parts integer[], p_limit integer,
                                     p_lease_ms bigint, p_consumer text)
RETURNS TABLE (o_part integer, o_seq bigint, o_attempt integer, o_lease uuid,
               o_deadline bigint, o_event_id text, o_type text, o_key text,
               o_data text, o_headers text, o_appended bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    v_stream integer;
    v_max integer;
    v_ordering smallint;
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    c_part integer[];
    c_seq bigint[];
    c_att integer[];
    c_tid tid[];
    k_part integer[];
    k_cur bigint[];
    k_top bigint[];
    o_parts integer[];
    o_seqs bigint[];
    r_tid tid[];
    n_part integer[];
    n_seq bigint[];
    v_wait integer;
    v_doomed tid[];
    v_prefix text;
BEGIN
    SELECT g.stream_id, g.max_attempts, g.ordering INTO v_stream, v_max, v_ordering
    FROM {s}.groups g WHERE g.id = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'rheo_flow: no group with id %', p_group USING ERRCODE = 'RF001';
    END IF;
    IF v_ordering = 1 THEN  -- key-ordered (schema version 5): functions/fetch_keyed.sql
        RETURN QUERY SELECT * FROM {s}.fetch(p_group, p_parts, p_limit, p_lease_ms,
                                             p_consumer, v_stream, v_max);
        RETURN;
    END IF;

    SELECT array_agg(x.part), array_agg(x.seq), array_agg(x.attempt), array_agg(x.tid)
    INTO c_part, c_seq, c_att, c_tid
    FROM unnest(p_parts) AS p(part)
    JOIN {s}.frontiers f ON f.group_id = p_group AND f.part = p.part
    CROSS JOIN LATERAL (
        SELECT a.* FROM (
            SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
              AND d.state = 0 AND d.available_at_ms <= v_now
            ORDER BY d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) a
        UNION ALL
        SELECT b.* FROM (
            SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
              AND d.state = 1 AND d.deadline_ms <= v_now
            ORDER BY d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) b
    ) x;

    SELECT array_agg(k.part), array_agg(k.cursor), array_agg(LEAST(k.high, k.cursor + p_limit))
    INTO k_part, k_cur, k_top
    FROM (SELECT c.part, c.cursor, pt.high_water AS high FROM {s}.cursors c
          JOIN {s}.partitions pt ON pt.stream_id = v_stream AND pt.part = c.part
          WHERE c.group_id = p_group AND c.part = ANY (p_parts) AND c.cursor < pt.high_water
          FOR UPDATE OF c SKIP LOCKED) k;

    IF c_part IS NULL AND k_part IS NULL THEN
        -- Competing fetches hold every cursor with work: wait for ONE of them
        -- (chosen first, then locked alone) while holding no other lock, so
        -- waiting fetches never deadlock one another; then claim again from
        -- every cursor that is free by now (a fresh snapshot sees their moves).
        SELECT c.part INTO v_wait
        FROM {s}.cursors c
        JOIN {s}.partitions pt ON pt.stream_id = v_stream AND pt.part = c.part
        WHERE c.group_id = p_group AND c.part = ANY (p_parts) AND c.cursor < pt.high_water
        ORDER BY array_position(p_parts, c.part)
        LIMIT 1;
        IF FOUND THEN
            PERFORM 1 FROM {s}.cursors c WHERE c.group_id = p_group AND c.part = v_wait
            FOR UPDATE;
            SELECT array_agg(k.part), array_agg(k.cursor),
                   array_agg(LEAST(k.high, k.cursor + p_limit))
            INTO k_part, k_cur, k_top
            FROM (SELECT c.part, c.cursor, pt.high_water AS high FROM {s}.cursors c
                  JOIN {s}.partitions pt ON pt.stream_id = v_stream AND pt.part = c.part
                  WHERE c.group_id = p_group AND c.part = ANY (p_parts)
                    AND c.cursor < pt.high_water
                  FOR UPDATE OF c SKIP LOCKED) k;
        END IF;
    END IF;

    IF c_part IS NULL THEN
        IF k_part IS NULL THEN
            RETURN;
        END IF;
        v_prefix := left(replace(gen_random_uuid()::text, '-', ''), 24);
        RETURN QUERY
        WITH ch AS (
            SELECT k.part, s.seq, array_position(p_parts, k.part) AS pos
            FROM unnest(k_part, k_cur, k_top) AS k(part, cur, top)
            CROSS JOIN LATERAL generate_series(k.cur + 1, k.top) AS s(seq)
            ORDER BY s.seq - k.cur, array_position(p_parts, k.part)
            LIMIT p_limit
        ), r AS (
            SELECT ch.part, min(ch.seq) AS lo, max(ch.seq) AS hi, min(ch.pos) AS pos
            FROM ch GROUP BY ch.part
        ), picked AS (
            SELECT r.part, e.seq, e.event_id, e.type, e.key, e.data, e.headers,
                   e.appended_at_ms,
                   row_number() OVER (ORDER BY e.seq - r.lo, r.pos) AS ord
            FROM r
            CROSS JOIN LATERAL (
                SELECT e.seq, e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
                FROM {s}.events e
                WHERE e.stream_id = v_stream AND e.part = r.part AND e.seq BETWEEN r.lo AND r.hi
                OFFSET 0) e
        ), created AS (
            INSERT INTO {s}.deliveries
                (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms)
            SELECT p_group, k.part, k.seq, 1, 1,
                   (v_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid, p_consumer,
                   v_now + p_lease_ms
            FROM picked k
        ), moved AS (
            UPDATE {s}.cursors cu SET cursor = r.hi
            FROM r WHERE cu.group_id = p_group AND cu.part = r.part
        )
        SELECT k.part, k.seq, 1, (v_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid,
               v_now + p_lease_ms, k.event_id, k.type, k.key, k.data::text, k.headers::text,
               k.appended_at_ms
        FROM picked k
        ORDER BY k.ord;
        RETURN;
    END IF;
    IF c_part IS NOT NULL THEN
        SELECT array_agg(x.tid) INTO v_doomed
        FROM unnest(c_tid, c_att) AS x(tid, attempt) WHERE x.attempt >= v_max;
        IF v_doomed IS NOT NULL THEN
            UPDATE {s}.deliveries d
            SET state = 3, reason = 'max_attempts', settled_by = NULL, rejected_at_ms = v_now
            WHERE d.ctid = ANY (v_doomed);
            PERFORM {s}.advance_frontiers(array_agg(p_group), array_agg(x.part))
            FROM (SELECT DISTINCT x.part FROM unnest(c_part, c_att) AS x(part, attempt)
                  WHERE x.attempt >= v_max) x;
        END IF;
    END IF;

    -- The round-robin winners, in delivery order: existing rows to lease again
    -- (by address) and fresh sequences to insert.
    WITH cand AS (
        SELECT x.part, x.seq, x.tid, row_number() OVER (PARTITION BY x.part ORDER BY x.seq)
               AS depth
        FROM unnest(c_part, c_seq, c_att, c_tid) AS x(part, seq, attempt, tid)
        WHERE x.attempt < v_max
    ), counted AS (
        SELECT cand.part, count(*) AS n FROM cand GROUP BY cand.part
    ), fresh AS (
        SELECT k.part, s.seq, NULL::tid AS tid, COALESCE(n.n, 0) + (s.seq - k.cur) AS depth
        FROM unnest(k_part, k_cur, k_top) AS k(part, cur, top)
        LEFT JOIN counted n ON n.part = k.part
        CROSS JOIN LATERAL generate_series(k.cur + 1, k.top) AS s(seq)
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

    IF o_parts IS NULL THEN
        RETURN;
    END IF;
    -- New leases are named by one random prefix per call and their position:
    -- unique, and far cheaper than a random UUID per row.
    v_prefix := left(replace(gen_random_uuid()::text, '-', ''), 24);

    IF r_tid IS NULL THEN
        -- Only new deliveries (the common case): no re-leases to merge, and the
        -- lease ids (prefix, then the position in n_part/n_seq, which are in the
        -- chosen order) sort in the chosen order.
        RETURN QUERY
        WITH picked AS (
            -- Each partition's new deliveries are its next sequences, cur+1..top:
            -- one range scan of the events reads them, and (sequence - first,
            -- rotation position) is their place in the chosen order.
            SELECT r.part, e.seq, e.event_id, e.type, e.key, e.data, e.headers,
                   e.appended_at_ms,
                   row_number() OVER (ORDER BY e.seq - r.lo, r.pos) AS ord
            FROM (SELECT n.part, min(n.seq) AS lo, max(n.seq) AS hi,
                         array_position(p_parts, n.part) AS pos
                  FROM unnest(n_part, n_seq) AS n(part, seq) GROUP BY n.part) r
            CROSS JOIN LATERAL (
                SELECT e.seq, e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
                FROM {s}.events e
                WHERE e.stream_id = v_stream AND e.part = r.part AND e.seq BETWEEN r.lo AND r.hi
                OFFSET 0) e
        ), created AS (
            INSERT INTO {s}.deliveries
                (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms)
            SELECT p_group, k.part, k.seq, 1, 1,
                   (v_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid, p_consumer,
                   v_now + p_lease_ms
            FROM picked k
        ), moved AS (
        UPDATE {s}.cursors cu SET cursor = m.top
        FROM (SELECT n.part, max(n.seq) AS top FROM unnest(n_part, n_seq) AS n(part, seq)
              GROUP BY n.part) m
        WHERE cu.group_id = p_group AND cu.part = m.part
    )
        SELECT k.part, k.seq, 1, (v_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid,
               v_now + p_lease_ms, k.event_id, k.type, k.key, k.data::text, k.headers::text,
               k.appended_at_ms
        FROM picked k
        ORDER BY k.ord;
        RETURN;
    END IF;

    RETURN QUERY
    WITH releases AS (
        UPDATE {s}.deliveries d
        SET state = 1, attempt = d.attempt + 1, lease_id = gen_random_uuid(),
            consumer_id = p_consumer, deadline_ms = v_now + p_lease_ms, settled_by = NULL
        WHERE d.ctid = ANY (r_tid)
        RETURNING d.part, d.seq, d.attempt, d.lease_id
    ), created AS (
        INSERT INTO {s}.deliveries
            (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms)
        SELECT p_group, n.part, n.seq, 1, 1, (v_prefix || lpad(to_hex(n.ord), 8, '0'))::uuid,
               p_consumer, v_now + p_lease_ms
        FROM unnest(n_part, n_seq) WITH ORDINALITY AS n(part, seq, ord)
        RETURNING part, seq, attempt, lease_id
    ), moved AS (
        UPDATE {s}.cursors cu SET cursor = m.top
        FROM (SELECT n.part, max(n.seq) AS top FROM unnest(n_part, n_seq) AS n(part, seq)
              GROUP BY n.part) m
        WHERE cu.group_id = p_group AND cu.part = m.part
    )
    SELECT l.part, l.seq, l.attempt, l.lease_id, v_now + p_lease_ms,
           e.event_id, e.type, e.key, e.data::text, e.headers::text, e.appended_at_ms
    FROM (SELECT * FROM releases UNION ALL SELECT * FROM created) l
    JOIN unnest(o_parts, o_seqs) WITH ORDINALITY AS o(part, seq, ord)
      ON o.part = l.part AND o.seq = l.seq
    CROSS JOIN LATERAL (
        SELECT e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
        FROM {s}.events e
        WHERE e.stream_id = v_stream AND e.part = l.part AND e.seq = l.seq
        OFFSET 0) e
    ORDER BY o.ord;
END
$fn$;
