-- fetch: one round trip claims up to p_limit leases of a group, round-robin
-- over p_parts (see the package docstring for the tables and the lock order).
-- Installed at its latest version after every migration (CREATE OR REPLACE).
-- A key-ordered group's fetch is functions/fetch_by_key.sql; this is the
-- unordered group's, whose new leases are range rows (migrations/v8_ranges.sql),
-- not a delivery row each.
--
-- Reply: a row per lease, in the batch's (round-robin) order; none when there
-- is nothing to lease. fetch_by_key, ack_fetch and ack_ranges_fetch reply the
-- same columns:
--   o_part, o_seq    the event's partition and sequence
--   o_attempt        the delivery attempt the lease is (1: its first lease)
--   o_lease          the lease id
--   o_deadline       the lease's deadline, ms since the epoch (database clock)
--   o_event_id, o_type, o_key, o_data, o_headers, o_appended
--                    the event (data and headers as JSON text; appended: ms)
--
-- Every lease change commits durably: no function switches its transaction to
-- asynchronous commit (a server crash right after a re-lease must not undo it
-- while the superseded holder's ack, arriving after the restart, takes effect).
-- Plans do not depend on table statistics: PL/pgSQL caches one generic plan per
-- statement and session, every row is found through its key (LATERAL
-- subqueries the planner cannot flatten, sequential and bitmap scans off), and
-- locked delivery rows are updated by address (`ctid = ANY(...)`).
--
-- The common case first (claim_fresh, functions/fetch_work.sql): with no delivery
-- row available or leased in the group and no range past its deadline, the
-- cursors with new events are claimed at once (SKIP LOCKED), and leased as
-- below; nothing to lease returns at once. Else, or when every such cursor is
-- held by another fetch, the steps:
-- find the partitions with work (fetch_work, functions/fetch_work.sql:
-- new events, delivery rows due, expired ranges; a partition without any is
-- not visited again); in those, lock the delivery rows to lease again
-- (available and due, or leased past their deadline: deliveries_due and
-- deliveries_expiry, bounded by the time) and the ranges past their deadline
-- with events in flight, both FOR UPDATE SKIP LOCKED; then the cursors with
-- work (claim_cursors, which waits for one cursor only while the fetch holds
-- no lock). Expired leases at max_attempts are dead-lettered (expire_spent).
-- With nothing to lease again (the common case) each partition's share of the
-- round-robin turn is counted, not chosen row by row, and one statement stores
-- its range and returns its events. Else the round-robin winners are chosen by depth (a candidate's
-- place in its partition's turn: the events to lease again first, an expired
-- range's events in flight among them, then the partition's next sequences),
-- then the rotation position; then ONE statement leases them: delivery rows
-- again by address; expired ranges again under a new token and attempt (a range
-- the limit cut keeps its tail, with its old token, attempt and deadline, as a
-- range of its own; its acked events keep their old lease as acked delivery
-- rows); each partition's new events, cursor + 1 .. hi, as one new range; it
-- moves the cursors and returns the leases in their order.
--
-- In a stream holding scheduled events (streams.scheduled, migration 11) the
-- cursors are claimed first, and a window of new events with a scheduled event not
-- due in it becomes delivery rows (split_scheduled, functions/fetch_scheduled.sql),
-- leased as rows due: a range never holds an event that must wait.
--
-- Tokens are 8 random bytes per call and the range's place in the call (4
-- bytes); an event's lease id is its range's token and its offset from the
-- range's base_seq (lease_of, below).

CREATE OR REPLACE FUNCTION {s}.fetch(p_group integer, p_parts integer[], p_limit integer,
                                     p_lease_ms bigint, p_consumer text)
RETURNS TABLE (o_part integer, o_seq bigint, o_attempt integer, o_lease uuid,
               o_deadline bigint, o_event_id text, o_type text, o_key text,
               o_data text, o_headers text, o_appended bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_stream integer;
    v_max_attempts integer;
    v_keyed boolean;
    v_paused_until bigint;
    -- The partitions with work (fetch_work), in p_parts' order: new events past
    -- the cursor, delivery rows due, expired ranges.
    v_fresh_parts integer[];
    v_due_work_parts integer[];
    v_expired_work_parts integer[];
    -- The delivery rows to lease again (available, or leased past their deadline).
    v_due_parts integer[];
    v_due_seqs bigint[];
    v_due_attempts integer[];
    v_due_tids tid[];
    -- The ranges past their deadline with events in flight (their rows' columns).
    v_expired_parts integer[];
    v_expired_firsts bigint[];
    v_expired_lasts bigint[];
    v_expired_attempts integer[];
    v_expired_done varbit[];
    v_expired_pending integer[];
    -- The cursors claimed (claim_cursors): partition, cursor, the partition's high water.
    v_cursor_parts integer[];
    v_cursors bigint[];
    v_high_waters bigint[];
    -- The winners in delivery order: partition, sequence, and the expired range
    -- holding it (its place in v_expired_*; NULL: a delivery row or a new event);
    -- the addresses of the delivery rows among them.
    v_chosen_parts integer[];
    v_chosen_seqs bigint[];
    v_chosen_ranges bigint[];
    v_chosen_tids tid[];
    -- The partitions whose new events are leased, and the last sequence leased in each.
    v_new_parts integer[];
    v_new_lasts bigint[];
    v_token_prefix text;      -- 8 random bytes (hex), the start of every token of this call
    v_expired_count integer;
    v_backlogs bigint[];      -- per cursor: its events not leased yet (high water - cursor)
    v_backlog bigint;
    v_leases_left bigint;     -- of p_limit, not yet shared out
    v_share bigint;           -- the events every partition with that many takes
    v_over bigint;            -- the partitions with more than v_share
    v_least_over bigint;      -- the smallest backlog above v_share
    v_step bigint;
    v_scheduled boolean;      -- the stream holds scheduled events (functions/fetch_scheduled.sql)
    v_split_parts integer[];  -- the partitions whose window split_scheduled made rows of
    v_idle boolean;           -- nothing to lease (claim_fresh)
BEGIN
    SELECT g.stream_id, g.max_attempts, g.ordering = {s}.ordering_by_key(), g.paused_until_ms,
           (SELECT st.scheduled FROM {s}.streams st WHERE st.id = g.stream_id)
    INTO v_stream, v_max_attempts, v_keyed, v_paused_until, v_scheduled
    FROM {s}.groups g WHERE g.id = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'rheo_flow: no group with id %', p_group USING ERRCODE = 'RF001';
    END IF;
    IF v_paused_until > v_now THEN  -- a paused group (migration 11) leases nothing
        RETURN;
    END IF;
    IF v_keyed THEN
        RETURN QUERY SELECT * FROM {s}.fetch_by_key(p_group, v_stream, v_max_attempts, p_parts,
                                                    p_limit, p_lease_ms, p_consumer);
        RETURN;
    END IF;

    -- The common case: only new events to lease, and a cursor free (claim_fresh,
    -- functions/fetch_work.sql), claimed at once; else the work is found and
    -- claimed step by step.
    IF NOT v_scheduled THEN
        SELECT * INTO v_cursor_parts, v_cursors, v_high_waters, v_idle
        FROM {s}.claim_fresh(p_group, v_stream, p_parts, v_now);
        IF v_idle THEN
            RETURN;
        END IF;
    END IF;
    IF v_cursor_parts IS NULL THEN
        SELECT * INTO v_fresh_parts, v_due_work_parts, v_expired_work_parts
        FROM {s}.fetch_work(p_group, v_stream, p_parts, v_now);

        -- A stream with scheduled events: the cursors first (nothing is locked yet, so
        -- claim_cursors may wait), and the windows with scheduled events in them become
        -- delivery rows (split_scheduled), leased below as rows due.
        IF v_scheduled AND v_fresh_parts IS NOT NULL THEN
            SELECT * INTO v_cursor_parts, v_cursors, v_high_waters
            FROM {s}.claim_cursors(p_group, v_stream, v_fresh_parts, true);
            v_fresh_parts := NULL;  -- claimed
            IF v_cursor_parts IS NOT NULL THEN
                SELECT * INTO v_split_parts, v_cursors
                FROM {s}.split_scheduled(p_group, v_stream, p_limit, v_now, v_cursor_parts,
                                         v_cursors, v_high_waters);
            END IF;
            IF v_split_parts IS NOT NULL THEN
                SELECT array_agg(p.part ORDER BY p.pos) INTO v_due_work_parts
                FROM unnest(p_parts) WITH ORDINALITY AS p(part, pos)
                WHERE p.part = ANY (v_due_work_parts) OR p.part = ANY (v_split_parts);
            END IF;
        END IF;

        -- Per partition with rows due: the earliest due first (ties by sequence).
        IF v_due_work_parts IS NOT NULL THEN
            SELECT array_agg(x.part), array_agg(x.seq), array_agg(x.attempt), array_agg(x.tid)
            INTO v_due_parts, v_due_seqs, v_due_attempts, v_due_tids
            FROM unnest(v_due_work_parts) AS p(part)
            CROSS JOIN LATERAL (SELECT f.frontier FROM {s}.frontiers f
                                WHERE f.group_id = p_group AND f.part = p.part OFFSET 0) f
            CROSS JOIN LATERAL (
                SELECT a.* FROM (
                    SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
                    WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
                      AND d.state = {s}.delivery_available() AND d.available_at_ms <= v_now
                    ORDER BY d.available_at_ms, d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) a
                UNION ALL
                SELECT b.* FROM (
                    SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
                    WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
                      AND d.state = {s}.delivery_leased() AND d.deadline_ms <= v_now
                    ORDER BY d.deadline_ms, d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) b
            ) x;
        END IF;

        -- Expired ranges, earliest deadline first (ranges_expiry), then by sequence.
        IF v_expired_work_parts IS NOT NULL THEN
            SELECT array_agg(x.part ORDER BY x.part, x.first_seq),
                   array_agg(x.first_seq ORDER BY x.part, x.first_seq),
                   array_agg(x.last_seq ORDER BY x.part, x.first_seq),
                   array_agg(x.attempt ORDER BY x.part, x.first_seq),
                   array_agg(x.done ORDER BY x.part, x.first_seq),
                   array_agg(x.pending ORDER BY x.part, x.first_seq)
            INTO v_expired_parts, v_expired_firsts, v_expired_lasts, v_expired_attempts,
                 v_expired_done, v_expired_pending
            FROM unnest(v_expired_work_parts) AS p(part)
            CROSS JOIN LATERAL (
                SELECT r.part, r.first_seq, r.last_seq, r.attempt, r.done, r.pending
                FROM {s}.ranges r
                WHERE r.group_id = p_group AND r.part = p.part AND r.pending > 0
                  AND r.deadline_ms <= v_now
                ORDER BY r.deadline_ms LIMIT p_limit FOR UPDATE SKIP LOCKED) x;
        END IF;

        -- The cursors with work; with nothing else locked, claim_cursors may wait.
        IF v_fresh_parts IS NOT NULL THEN
            SELECT * INTO v_cursor_parts, v_cursors, v_high_waters
            FROM {s}.claim_cursors(p_group, v_stream, v_fresh_parts,
                                   v_due_parts IS NULL AND v_expired_parts IS NULL);
        END IF;
        IF v_due_parts IS NULL AND v_expired_parts IS NULL AND v_cursor_parts IS NULL THEN
            RETURN;
        END IF;

        IF v_max_attempts <= ANY (v_due_attempts)
           OR v_max_attempts <= ANY (v_expired_attempts) THEN
            PERFORM {s}.expire_spent(p_group, v_max_attempts, v_now, v_due_tids, v_due_attempts,
                                     v_expired_parts, v_expired_firsts, v_expired_attempts);
            SELECT array_agg(x.part), array_agg(x.seq), array_agg(x.attempt), array_agg(x.tid)
            INTO v_due_parts, v_due_seqs, v_due_attempts, v_due_tids
            FROM unnest(v_due_parts, v_due_seqs, v_due_attempts, v_due_tids)
                 AS x(part, seq, attempt, tid)
            WHERE x.attempt < v_max_attempts;
            SELECT array_agg(x.part), array_agg(x.first), array_agg(x.last), array_agg(x.att),
                   array_agg(x.done), array_agg(x.pend)
            INTO v_expired_parts, v_expired_firsts, v_expired_lasts, v_expired_attempts,
                 v_expired_done, v_expired_pending
            FROM unnest(v_expired_parts, v_expired_firsts, v_expired_lasts, v_expired_attempts,
                        v_expired_done, v_expired_pending)
                 AS x(part, first, last, att, done, pend)
            WHERE x.att < v_max_attempts;
        END IF;
    END IF;

    v_token_prefix := left(replace(gen_random_uuid()::text, '-', ''), 16);
    IF v_due_parts IS NULL AND v_expired_parts IS NULL THEN
        -- Only new events: of its backlog (high water - cursor) each partition takes
        -- min(backlog, v_share), and one more for the first v_leases_left of those
        -- with more than v_share, in rotation order; v_share and v_leases_left are
        -- counted here. ONE statement then stores each partition's range, moves its
        -- cursor and returns its events.
        IF v_cursor_parts IS NULL THEN
            RETURN;
        END IF;
        -- Plain PL/pgSQL arithmetic here: no statement per step.
        v_backlogs := v_high_waters;
        FOR i IN 1 .. cardinality(v_high_waters) LOOP
            v_backlogs[i] := v_high_waters[i] - v_cursors[i];
        END LOOP;
        v_leases_left := p_limit;
        v_share := 0;
        LOOP
            v_over := 0;
            v_least_over := NULL;
            FOREACH v_backlog IN ARRAY v_backlogs LOOP
                IF v_backlog > v_share THEN
                    v_over := v_over + 1;
                    v_least_over := LEAST(v_least_over, v_backlog);
                END IF;
            END LOOP;
            EXIT WHEN v_over = 0 OR v_leases_left < v_over;
            v_step := LEAST(v_least_over - v_share, v_leases_left / v_over);
            v_share := v_share + v_step;
            v_leases_left := v_leases_left - v_step * v_over;
        END LOOP;
        RETURN QUERY
        WITH t AS (
            SELECT k.part, k.cur, array_position(p_parts, k.part) AS pos,
                   k.cur + LEAST(k.high - k.cur, v_share)
                   + CASE WHEN k.high - k.cur > v_share AND row_number() OVER (
                                   PARTITION BY k.high - k.cur > v_share
                                   ORDER BY array_position(p_parts, k.part)) <= v_leases_left
                          THEN 1 ELSE 0 END AS hi
            FROM unnest(v_cursor_parts, v_cursors, v_high_waters) AS k(part, cur, high)
        ), m AS (
            SELECT t.part, t.cur, t.hi, t.pos, row_number() OVER (ORDER BY t.pos) AS i
            FROM t WHERE t.hi > t.cur
        ), created AS (
            INSERT INTO {s}.ranges (group_id, part, first_seq, last_seq, base_seq, token, attempt,
                                    deadline_ms, consumer_id, done, pending)
            SELECT p_group, m.part, m.cur + 1, m.hi, m.cur + 1,
                   decode(v_token_prefix || lpad(to_hex(m.i), 8, '0'), 'hex'), 1,
                   v_now + p_lease_ms, p_consumer,
                   repeat('0', (m.hi - m.cur)::integer)::varbit, (m.hi - m.cur)::integer
            FROM m
        ), moved AS (
            -- "part = ANY": the claimed cursors are probed by key, never the
            -- group's every cursor scanned to be joined.
            UPDATE {s}.cursors cu SET cursor = m.hi FROM m
            WHERE cu.group_id = p_group AND cu.part = ANY (v_cursor_parts) AND cu.part = m.part
        )
        SELECT m.part, e.seq, 1,
               (v_token_prefix || lpad(to_hex(m.i), 8, '0')
                || lpad(to_hex(e.seq - m.cur - 1), 8, '0'))::uuid,
               v_now + p_lease_ms, e.event_id, e.type, e.key, e.data::text, e.headers::text,
               e.appended_at_ms
        FROM m CROSS JOIN LATERAL (
            SELECT e.seq, e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
            FROM {s}.events e
            WHERE e.stream_id = v_stream AND e.part = m.part AND e.seq BETWEEN m.cur + 1 AND m.hi
            OFFSET 0) e
        ORDER BY e.seq - m.cur, m.pos;
        RETURN;
    END IF;
    v_expired_count := COALESCE(cardinality(v_expired_parts), 0);

    -- The winners in delivery order. A candidate's depth is its place in its
    -- partition's turn: the events to lease again first (rng: the expired range
    -- holding one, by its place in v_expired_*), then the partition's next sequences.
    WITH cand AS (
        SELECT x.part, x.seq, x.tid, x.rng,
               row_number() OVER (PARTITION BY x.part ORDER BY x.seq) AS depth
        FROM (SELECT c.part, c.seq, c.tid, NULL::bigint AS rng
              FROM unnest(v_due_parts, v_due_seqs, v_due_tids) AS c(part, seq, tid)
              UNION ALL
              SELECT r.part, s.seq, NULL::tid, r.i
              FROM unnest(v_expired_parts, v_expired_firsts, v_expired_lasts, v_expired_done)
                   WITH ORDINALITY AS r(part, first, last, done, i)
              CROSS JOIN LATERAL generate_series(r.first, r.last) AS s(seq)
              WHERE get_bit(r.done, (s.seq - r.first)::integer) = 0) x
    ), fresh AS (
        SELECT k.part, s.seq, NULL::tid AS tid, NULL::bigint AS rng,
               COALESCE(n.n, 0) + (s.seq - k.cur) AS depth
        FROM unnest(v_cursor_parts, v_cursors, v_high_waters) AS k(part, cur, high)
        LEFT JOIN (SELECT x.part, count(*) AS n FROM cand x GROUP BY x.part) n
          ON n.part = k.part
        CROSS JOIN LATERAL generate_series(k.cur + 1, LEAST(k.high, k.cur + p_limit)) AS s(seq)
    ), chosen AS (
        SELECT a.part, a.seq, a.tid, a.rng, a.depth, array_position(p_parts, a.part) AS pos
        FROM (SELECT * FROM cand UNION ALL SELECT * FROM fresh) a
        ORDER BY a.depth, array_position(p_parts, a.part)
        LIMIT p_limit
    ), tops AS (
        SELECT c.part, max(c.seq) AS hi FROM chosen c
        WHERE c.tid IS NULL AND c.rng IS NULL GROUP BY c.part
    )
    SELECT array_agg(c.part ORDER BY c.depth, c.pos), array_agg(c.seq ORDER BY c.depth, c.pos),
           array_agg(c.rng ORDER BY c.depth, c.pos),
           array_agg(c.tid) FILTER (WHERE c.tid IS NOT NULL),
           (SELECT array_agg(t.part) FROM tops t), (SELECT array_agg(t.hi) FROM tops t)
    INTO v_chosen_parts, v_chosen_seqs, v_chosen_ranges, v_chosen_tids, v_new_parts, v_new_lasts
    FROM chosen c;

    IF v_chosen_parts IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH releases AS (
        UPDATE {s}.deliveries d
        SET state = {s}.delivery_leased(), attempt = d.attempt + 1, lease_id = gen_random_uuid(),
            consumer_id = p_consumer, deadline_ms = v_now + p_lease_ms, settled_by = NULL
        WHERE d.ctid = ANY (v_chosen_tids)
        RETURNING d.part, d.seq, d.attempt, d.lease_id
    ), relet AS (
        -- Each expired range chosen: how many of its events, up to which (cut).
        SELECT r.i, r.part, r.first, r.last, r.att, r.done, r.pend, x.n, x.cut,
               v_token_prefix || lpad(to_hex(r.i), 8, '0') AS token
        FROM unnest(v_expired_parts, v_expired_firsts, v_expired_lasts, v_expired_attempts,
                    v_expired_done, v_expired_pending) WITH ORDINALITY
             AS r(part, first, last, att, done, pend, i)
        JOIN (SELECT u.rng, count(*)::integer AS n, max(u.seq) AS cut
              FROM unnest(v_chosen_seqs, v_chosen_ranges) AS u(seq, rng)
              WHERE u.rng IS NOT NULL
              GROUP BY u.rng) x ON x.rng = r.i
    ), tails AS (
        INSERT INTO {s}.ranges (group_id, part, first_seq, last_seq, base_seq, token, attempt,
                                deadline_ms, consumer_id, done, pending)
        SELECT p_group, r.part, r.cut + 1, r.last, o.base_seq, o.token, r.att, o.deadline_ms,
               o.consumer_id, substring(r.done FROM (r.cut - r.first + 2)::integer),
               r.pend - r.n
        FROM relet r
        JOIN {s}.ranges o ON o.group_id = p_group AND o.part = r.part AND o.first_seq = r.first
        WHERE r.n < r.pend
    ), kept AS (
        -- The acked events of a range leased again keep their old lease as a
        -- delivery row (acked), so that their acks still repeat as acks.
        INSERT INTO {s}.deliveries (group_id, part, seq, state, attempt, lease_id,
                                    consumer_id, deadline_ms, settled_by)
        SELECT p_group, r.part, s.seq, {s}.delivery_acked(), r.att,
               {s}.lease_of(o.token, s.seq - o.base_seq), o.consumer_id,
               o.deadline_ms, {s}.op_ack()
        FROM relet r
        JOIN {s}.ranges o ON o.group_id = p_group AND o.part = r.part AND o.first_seq = r.first
        CROSS JOIN LATERAL generate_series(r.first, CASE WHEN r.n < r.pend THEN r.cut
                                                         ELSE r.last END) AS s(seq)
        WHERE position(B'1' IN r.done) > 0
          AND get_bit(r.done, (s.seq - r.first)::integer) = 1
        ON CONFLICT DO NOTHING
    ), relets AS (
        UPDATE {s}.ranges o
        SET last_seq = CASE WHEN r.n < r.pend THEN r.cut ELSE r.last END,
            done = CASE WHEN r.n < r.pend
                        THEN substring(r.done FROM 1 FOR (r.cut - r.first + 1)::integer)
                        ELSE r.done END,
            pending = r.n, token = decode(r.token, 'hex'), base_seq = r.first,
            attempt = r.att + 1,
            deadline_ms = v_now + p_lease_ms, consumer_id = p_consumer
        FROM relet r
        WHERE o.group_id = p_group AND o.part = r.part AND o.first_seq = r.first
    ), created AS (
        INSERT INTO {s}.ranges (group_id, part, first_seq, last_seq, base_seq, token, attempt,
                                deadline_ms, consumer_id, done, pending)
        SELECT p_group, m.part, k.cur + 1, m.hi, k.cur + 1,
               decode(v_token_prefix || lpad(to_hex(v_expired_count + m.i), 8, '0'), 'hex'), 1,
               v_now + p_lease_ms, p_consumer, repeat('0', (m.hi - k.cur)::integer)::varbit,
               (m.hi - k.cur)::integer
        FROM unnest(v_new_parts, v_new_lasts) WITH ORDINALITY AS m(part, hi, i)
        JOIN unnest(v_cursor_parts, v_cursors) AS k(part, cur) ON k.part = m.part
    ), moved AS (
        -- "part = ANY": as in the common case above.
        UPDATE {s}.cursors cu SET cursor = m.hi
        FROM unnest(v_new_parts, v_new_lasts) AS m(part, hi)
        WHERE cu.group_id = p_group AND cu.part = ANY (v_new_parts) AND cu.part = m.part
    ), leased AS (
        -- Every lease: (part, seq, attempt, lease id) and its place in the batch.
        SELECT r.part, r.seq, r.attempt, r.lease_id FROM releases r
        UNION ALL
        SELECT u.part, u.seq, r.att + 1,
               (r.token || lpad(to_hex(u.seq - r.first), 8, '0'))::uuid
        FROM unnest(v_chosen_parts, v_chosen_seqs, v_chosen_ranges) AS u(part, seq, rng)
        JOIN relet r ON r.i = u.rng
    )
    SELECT l.part, l.seq, l.attempt, l.lease, v_now + p_lease_ms,
           l.event_id, l.type, l.key, l.data::text, l.headers::text, l.appended_at_ms
    FROM (SELECT r.part, r.seq, r.attempt, r.lease_id AS lease, e.event_id, e.type, e.key,
                 e.data, e.headers, e.appended_at_ms, o.ord
          FROM leased r
          JOIN unnest(v_chosen_parts, v_chosen_seqs) WITH ORDINALITY AS o(part, seq, ord)
            ON o.part = r.part AND o.seq = r.seq
          CROSS JOIN LATERAL (
              SELECT e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
              FROM {s}.events e
              WHERE e.stream_id = v_stream AND e.part = r.part AND e.seq = r.seq
              OFFSET 0) e
          UNION ALL
          SELECT m.part, e.seq, 1,
                 (v_token_prefix || lpad(to_hex(v_expired_count + m.i), 8, '0')
                  || lpad(to_hex(e.seq - k.cur - 1), 8, '0'))::uuid,
                 e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms, o.ord
          FROM unnest(v_new_parts, v_new_lasts) WITH ORDINALITY AS m(part, hi, i)
          JOIN unnest(v_cursor_parts, v_cursors) AS k(part, cur) ON k.part = m.part
          CROSS JOIN LATERAL (
              SELECT e.seq, e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
              FROM {s}.events e
              WHERE e.stream_id = v_stream AND e.part = m.part
                AND e.seq BETWEEN k.cur + 1 AND m.hi
              OFFSET 0) e
          JOIN unnest(v_chosen_parts, v_chosen_seqs) WITH ORDINALITY AS o(part, seq, ord)
            ON o.part = m.part AND o.seq = e.seq) l
    ORDER BY l.ord;
END
$fn$;

-- expire_spent: dead-letters the expired leases a fetch locked at max_attempts:
-- delivery rows (by address) and ranges (their events in flight become rejected
-- delivery rows, and the range settles them), then moves the frontiers.
-- Takes fetch's v_due_tids, v_due_attempts, v_expired_parts, v_expired_firsts
-- and v_expired_attempts; the parameters keep the names of the release that
-- added the function (CREATE OR REPLACE cannot rename one), so the body reads
-- them through ALIAS names. Replies nothing.

CREATE OR REPLACE FUNCTION {s}.expire_spent(p_group integer, v_max integer, p_now bigint,
                                            c_tid tid[], c_att integer[], r_part integer[],
                                            r_first bigint[], r_att integer[])
RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    p_max_attempts ALIAS FOR v_max;
    p_due_tids ALIAS FOR c_tid;
    p_due_attempts ALIAS FOR c_att;
    p_expired_parts ALIAS FOR r_part;
    p_expired_firsts ALIAS FOR r_first;
    p_expired_attempts ALIAS FOR r_att;
    v_moved_parts integer[];
BEGIN
    WITH dead AS (
        UPDATE {s}.deliveries d
        SET state = {s}.delivery_rejected(), reason = 'max_attempts', settled_by = NULL,
            rejected_at_ms = p_now
        WHERE d.ctid = ANY (ARRAY(SELECT x.tid
                                  FROM unnest(p_due_tids, p_due_attempts) AS x(tid, att)
                                  WHERE x.att >= p_max_attempts))
        RETURNING d.part
    ), spent AS (
        SELECT o.part, o.first_seq, o.last_seq, o.base_seq, o.token, o.attempt, o.deadline_ms,
               o.consumer_id, o.done
        FROM unnest(p_expired_parts, p_expired_firsts, p_expired_attempts) AS x(part, first, att)
        JOIN {s}.ranges o ON o.group_id = p_group AND o.part = x.part AND o.first_seq = x.first
        WHERE x.att >= p_max_attempts
    ), split AS (
        INSERT INTO {s}.deliveries (group_id, part, seq, state, attempt, lease_id, consumer_id,
                                    deadline_ms, reason, rejected_at_ms)
        SELECT p_group, o.part, s.seq, {s}.delivery_rejected(), o.attempt,
               {s}.lease_of(o.token, s.seq - o.base_seq), o.consumer_id,
               o.deadline_ms, 'max_attempts', p_now
        FROM spent o CROSS JOIN LATERAL generate_series(o.first_seq, o.last_seq) AS s(seq)
        WHERE get_bit(o.done, (s.seq - o.first_seq)::integer) = 0
    ), closed AS (
        UPDATE {s}.ranges r SET done = repeat('1', length(r.done))::varbit, pending = 0
        FROM spent o
        WHERE r.group_id = p_group AND r.part = o.part AND r.first_seq = o.first_seq
        RETURNING r.part
    )
    SELECT array_agg(DISTINCT x.part) INTO v_moved_parts
    FROM (SELECT dead.part FROM dead UNION ALL SELECT closed.part FROM closed) x;
    IF v_moved_parts IS NOT NULL THEN
        PERFORM {s}.advance_frontiers(array_fill(p_group, ARRAY[cardinality(v_moved_parts)]),
                                      v_moved_parts);
    END IF;
END
$fn$;

-- lease_of: the lease id of the event at offset p_offset from a range's
-- base_seq: its token (12 bytes) and the offset (4 bytes, big-endian).

CREATE OR REPLACE FUNCTION {s}.lease_of(p_token bytea, p_offset bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE
AS $fn$
    SELECT encode(p_token || int4send(p_offset::integer), 'hex')::uuid
$fn$;

-- claim_cursors: the cursors of p_parts that have events past them, locked FOR
-- UPDATE SKIP LOCKED, with the high water of each (reply: k_part, the partitions;
-- k_cur, their cursors; k_top, their high water; NULL when none is claimed).
-- When none is free and the caller holds no lock (p_may_wait), competing
-- fetches hold every cursor with work: it waits for ONE of them (chosen first,
-- then locked alone), so waiting fetches never deadlock one another, then
-- claims again from every cursor that is free by now (a fresh snapshot sees
-- their moves). The callers pass the partitions fetch_work found with new events
-- (functions/fetch_work.sql), so each cursor and its high water is one probe of
-- its own (LATERAL), never a scan of the whole stream's.

CREATE OR REPLACE FUNCTION {s}.claim_cursors(p_group integer, p_stream integer,
                                             p_parts integer[], p_may_wait boolean,
                                             OUT k_part integer[], OUT k_cur bigint[],
                                             OUT k_top bigint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    v_timeout text;
    v_found boolean;
BEGIN
    FOR v_wait IN 0 .. 1 LOOP
        SELECT array_agg(k.part), array_agg(k.cursor), array_agg(k.high)
        INTO k_part, k_cur, k_top
        FROM (SELECT c.part, c.cursor, pt.high_water AS high FROM {s}.cursors c
              CROSS JOIN LATERAL (SELECT pt.high_water FROM {s}.partitions pt
                                  WHERE pt.stream_id = p_stream AND pt.part = c.part
                                  OFFSET 0) pt
              WHERE c.group_id = p_group AND c.part = ANY (p_parts)
                AND c.cursor < pt.high_water
              FOR UPDATE OF c SKIP LOCKED) k;
        EXIT WHEN k_part IS NOT NULL OR NOT p_may_wait OR v_wait = 1;
        -- After acks in the same call (holding_locks: functions/ack_fetch.sql) this
        -- transaction holds range, delivery and frontier locks, which the fetch
        -- holding the cursor may come to wait for (expire_spent): wait a little
        -- only, then fetch nothing, so that such a cycle breaks at once. A lock
        -- timeout of the session's own also ends the wait with nothing claimed.
        v_timeout := current_setting('lock_timeout');
        IF {s}.holding_locks() THEN
            PERFORM set_config('lock_timeout', '50ms', true);
        END IF;
        BEGIN
            PERFORM 1 FROM {s}.cursors c
            WHERE c.group_id = p_group
              AND c.part = (SELECT c.part FROM {s}.cursors c
                            CROSS JOIN LATERAL (
                                SELECT pt.high_water FROM {s}.partitions pt
                                WHERE pt.stream_id = p_stream AND pt.part = c.part
                                OFFSET 0) pt
                            WHERE c.group_id = p_group AND c.part = ANY (p_parts)
                              AND c.cursor < pt.high_water
                            ORDER BY array_position(p_parts, c.part)
                            LIMIT 1)
            FOR UPDATE;
            v_found := FOUND;
        EXCEPTION WHEN lock_not_available THEN
            v_found := false;
        END;
        PERFORM set_config('lock_timeout', v_timeout, true);
        EXIT WHEN NOT v_found;
    END LOOP;
END
$fn$;
