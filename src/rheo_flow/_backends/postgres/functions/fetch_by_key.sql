-- fetch_by_key: fetch (functions/fetch.sql) for a key-ordered group
-- (groups.ordering = ordering_by_key(); functions/fetch_keyed.sql), whose deliveries are rows
-- of their own. See the package docstring for the tables and the lock order.
--
-- It commits durably (as every lease change): a fetch that switched its own
-- transaction to asynchronous commit (schema version 2) let a server crash right
-- after a re-lease undo the re-lease while the superseded holder's ack, arriving
-- after the restart, matched the restored row and took effect.
--
-- Plans do not depend on table statistics: PL/pgSQL caches one generic plan per
-- statement and session, and a plan made while `deliveries` was small joined
-- the batch by hashing every delivery of the group. Every row is found through
-- its key (LATERAL subqueries the planner cannot flatten, sequential and bitmap
-- scans off inside the function), and locked rows are updated by address
-- (`ctid = ANY(...)`: a locked row cannot move before the transaction ends).
--
-- Steps: find the partitions with work (fetch_work, functions/fetch_work.sql:
-- new events past the cursor, delivery rows due; no other partition is visited
-- again); in those, lock the heads of their keys to lease again, then the
-- cursors with work; dead-letter expired leases at max_attempts (which releases their keys,
-- release_keys); find the new deliveries with fetch_scan; pick the round-robin
-- winners (by depth, a candidate's place in its partition's turn, then the
-- rotation position); then ONE statement leases the winners again by address,
-- reads each partition's new rows as one range of events (cursor + 1 .. hi),
-- inserts them (each storing its key; the blocked events among them inserted
-- available, attempt 0, and held where fetch_scan says so), moves the cursors
-- and returns the leases in their order.
--
-- Reply: fetch's (functions/fetch.sql). Its parameters v_stream and v_max (the
-- group's stream and max_attempts, which fetch has read) keep the names of the
-- release that added the function (CREATE OR REPLACE cannot rename one); the
-- body reads them as p_stream and p_max_attempts (ALIAS).

CREATE OR REPLACE FUNCTION {s}.fetch_by_key(p_group integer, v_stream integer, v_max integer,
                                            p_parts integer[], p_limit integer,
                                            p_lease_ms bigint, p_consumer text)
RETURNS TABLE (o_part integer, o_seq bigint, o_attempt integer, o_lease uuid,
               o_deadline bigint, o_event_id text, o_type text, o_key text,
               o_data text, o_headers text, o_appended bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    p_stream ALIAS FOR v_stream;
    p_max_attempts ALIAS FOR v_max;
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    -- The partitions with work (fetch_work), in p_parts' order: new events past
    -- the cursor, delivery rows due (fetch_work's expired ranges: an unordered
    -- group's only).
    v_fresh_parts integer[];
    v_due_work_parts integer[];
    v_expired_work_parts integer[];
    -- The delivery rows to lease again (due heads of their keys, or expired leases).
    v_due_parts integer[];
    v_due_seqs bigint[];
    v_due_attempts integer[];
    v_due_tids tid[];
    -- The cursors claimed (claim_cursors): partition, cursor, the partition's high
    -- water; and the last sequence fetch_scan read past each.
    v_cursor_parts integer[];
    v_cursors bigint[];
    v_high_waters bigint[];
    v_scanned_to bigint[];
    -- Every new event fetch_scan read: its depth (NULL: blocked), whether to hold it.
    v_scan_parts integer[];
    v_scan_seqs bigint[];
    v_scan_depths bigint[];
    v_scan_holds boolean[];
    -- The winners in delivery order; the addresses of the delivery rows among them.
    v_chosen_parts integer[];
    v_chosen_seqs bigint[];
    v_chosen_tids tid[];
    -- The partitions whose cursors move, and the last sequence stored in each.
    v_new_parts integer[];
    v_new_lasts bigint[];
    v_spent_tids tid[];        -- expired leases at max_attempts, to dead-letter
    v_released_parts integer[];  -- and the keys their dead-lettering releases
    v_released_keys text[];
    v_lease_prefix text;
BEGIN
    -- Deliveries to lease again, per partition with delivery rows due (fetch_work),
    -- locked FOR UPDATE SKIP LOCKED: up to p_limit available and p_limit expired,
    -- the earliest due first (deliveries_due and deliveries_expiry, each scan
    -- bounded by the time, so rows delayed into the future and held ones, whose
    -- time is held(), are never read). The available ones are the group's due
    -- heads (see functions/fetch_keyed.sql): each is checked to head its key with
    -- one descent of deliveries_keyed; its expired leases are checked the same
    -- way (only a redriven earlier delivery can make one not the head). The head
    -- check is a column (a sub-select per row): in WHERE, the planner could hash
    -- the whole partition's keyed deliveries instead.
    SELECT * INTO v_fresh_parts, v_due_work_parts, v_expired_work_parts
    FROM {s}.fetch_work(p_group, p_stream, p_parts, v_now);
    SELECT array_agg(x.part), array_agg(x.seq), array_agg(x.attempt), array_agg(x.tid)
    INTO v_due_parts, v_due_seqs, v_due_attempts, v_due_tids
    FROM unnest(v_due_work_parts) AS p(part)
    CROSS JOIN LATERAL (SELECT f.frontier FROM {s}.frontiers f
                        WHERE f.group_id = p_group AND f.part = p.part OFFSET 0) f
    CROSS JOIN LATERAL (
        SELECT y.* FROM (
            SELECT z.* FROM (
                SELECT h.seq FROM (
                    SELECT r.seq, (SELECT b.seq FROM {s}.deliveries b
                                   WHERE b.group_id = p_group AND b.part = p.part
                                     AND b.key = r.key AND b.key IS NOT NULL
                                     AND b.state < {s}.delivery_acked()
                                   ORDER BY b.key, b.seq LIMIT 1) AS head
                    FROM {s}.deliveries r
                    WHERE r.group_id = p_group AND r.part = p.part AND r.seq > f.frontier
                      AND r.state = {s}.delivery_available() AND r.available_at_ms <= v_now
                    ORDER BY r.available_at_ms, r.seq OFFSET 0) h
                WHERE h.seq = h.head) h
            CROSS JOIN LATERAL (
                -- "state + 0": a plain "state = ..." would let the planner walk
                -- deliveries_due (its predicate) by time; the key finds the row.
                SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
                WHERE d.group_id = p_group AND d.part = p.part AND d.seq = h.seq
                  AND d.state + 0 = {s}.delivery_available() AND d.available_at_ms <= v_now
                FOR UPDATE OF d SKIP LOCKED) z
            LIMIT p_limit) y
        UNION ALL
        SELECT b.* FROM (
            SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
              AND d.state = {s}.delivery_leased() AND d.deadline_ms <= v_now
              AND d.seq = (SELECT b.seq FROM {s}.deliveries b
                           WHERE b.group_id = p_group AND b.part = d.part
                             AND b.key = d.key AND b.key IS NOT NULL
                             AND b.state < {s}.delivery_acked()
                           ORDER BY b.key, b.seq LIMIT 1)
            ORDER BY d.deadline_ms, d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) b
    ) x;

    -- The cursors with work (functions/fetch.sql); with nothing else locked, it may wait.
    IF v_fresh_parts IS NOT NULL THEN
        SELECT * INTO v_cursor_parts, v_cursors, v_high_waters
        FROM {s}.claim_cursors(p_group, p_stream, v_fresh_parts, v_due_parts IS NULL);
    END IF;
    IF v_due_parts IS NULL AND v_cursor_parts IS NULL THEN
        RETURN;
    END IF;

    IF v_due_parts IS NOT NULL THEN
        SELECT array_agg(x.tid) INTO v_spent_tids
        FROM unnest(v_due_tids, v_due_attempts) AS x(tid, attempt)
        WHERE x.attempt >= p_max_attempts;
    END IF;
    IF v_spent_tids IS NOT NULL THEN
        -- Expired leases at max attempts are dead-lettered (which releases their keys).
        WITH dead AS (
            UPDATE {s}.deliveries d
            SET state = {s}.delivery_rejected(), reason = 'max_attempts', settled_by = NULL,
                rejected_at_ms = v_now
            WHERE d.ctid = ANY (v_spent_tids)
            RETURNING d.part, d.key
        )
        SELECT array_agg(dead.part), array_agg(dead.key) INTO v_released_parts, v_released_keys
        FROM dead WHERE dead.key IS NOT NULL;
        IF v_released_keys IS NOT NULL THEN
            PERFORM {s}.release_keys(array_fill(p_group, ARRAY[cardinality(v_released_keys)]),
                                     v_released_parts, v_released_keys, v_now);
        END IF;
        PERFORM {s}.advance_frontiers(array_agg(p_group), array_agg(x.part))
        FROM (SELECT DISTINCT x.part FROM unnest(v_due_parts, v_due_attempts) AS x(part, attempt)
              WHERE x.attempt >= p_max_attempts) x;
        SELECT array_agg(x.part), array_agg(x.seq), array_agg(x.attempt), array_agg(x.tid)
        INTO v_due_parts, v_due_seqs, v_due_attempts, v_due_tids
        FROM unnest(v_due_parts, v_due_seqs, v_due_attempts, v_due_tids)
             AS x(part, seq, attempt, tid)
        WHERE x.attempt < p_max_attempts;
    END IF;
    IF v_cursor_parts IS NOT NULL THEN  -- the new events it may lease, and their depth
        SELECT * INTO v_scan_parts, v_scan_seqs, v_scan_depths, v_scan_holds, v_scanned_to
        FROM {s}.fetch_scan(p_group, p_stream, p_limit, v_cursor_parts, v_cursors,
                            v_high_waters, v_due_parts);
    END IF;

    -- The round-robin winners, in delivery order: existing rows to lease again
    -- (by address) and new deliveries. A candidate's depth is its place in its
    -- partition's turn: the candidates to lease again come first, then the new
    -- ones (a key-ordered group's from its scan; else the partition's next
    -- sequences). Each partition's new rows are inserted up to just before its
    -- first new candidate not chosen (a key-ordered group's blocked events among
    -- them stored available), and its cursor moves there.
    WITH cand AS (
        SELECT x.part, x.seq, x.tid, row_number() OVER (PARTITION BY x.part ORDER BY x.seq)
               AS depth
        FROM unnest(v_due_parts, v_due_seqs, v_due_tids) AS x(part, seq, tid)
    ), fresh AS (
        SELECT f.part, f.seq, NULL::tid AS tid, f.depth
        FROM unnest(v_scan_parts, v_scan_seqs, v_scan_depths) AS f(part, seq, depth)
        WHERE f.depth IS NOT NULL
    ), chosen AS (
        SELECT a.part, a.seq, a.tid, a.depth, array_position(p_parts, a.part) AS pos
        FROM (SELECT * FROM cand UNION ALL SELECT * FROM fresh) a
        ORDER BY a.depth, array_position(p_parts, a.part)
        LIMIT p_limit
    ), tops AS (
        SELECT c.part, max(c.depth) AS top FROM chosen c GROUP BY c.part
    ), moves AS (
        SELECT k.part, k.cur, COALESCE(x.next - 1, k.last) AS hi
        FROM unnest(v_cursor_parts, v_cursors, v_scanned_to) AS k(part, cur, last)
        LEFT JOIN (SELECT f.part, min(f.seq) AS next FROM fresh f
                   LEFT JOIN tops t ON t.part = f.part
                   WHERE f.depth > COALESCE(t.top, 0) GROUP BY f.part) x
          ON x.part = k.part
    )
    SELECT array_agg(c.part ORDER BY c.depth, c.pos), array_agg(c.seq ORDER BY c.depth, c.pos),
           array_agg(c.tid) FILTER (WHERE c.tid IS NOT NULL),
           (SELECT array_agg(m.part) FROM moves m WHERE m.hi > m.cur),
           (SELECT array_agg(m.hi) FROM moves m WHERE m.hi > m.cur)
    INTO v_chosen_parts, v_chosen_seqs, v_chosen_tids, v_new_parts, v_new_lasts
    FROM chosen c;

    IF v_chosen_parts IS NULL AND v_new_parts IS NULL THEN
        RETURN;
    END IF;
    -- New leases are named by one random prefix per call and their position:
    -- unique, and far cheaper than a random UUID per row.
    v_lease_prefix := left(replace(gen_random_uuid()::text, '-', ''), 24);

    RETURN QUERY
    WITH releases AS (
        UPDATE {s}.deliveries d
        SET state = {s}.delivery_leased(), attempt = d.attempt + 1, lease_id = gen_random_uuid(),
            consumer_id = p_consumer, deadline_ms = v_now + p_lease_ms, settled_by = NULL
        WHERE d.ctid = ANY (v_chosen_tids)
        RETURNING d.part, d.seq, d.attempt, d.lease_id
    ), picked AS (
        -- Each partition's new rows are its next sequences, cursor + 1 .. hi: one
        -- range scan of the events reads them; ord is the lease's place in the
        -- batch (NULL: blocked).  A re-leased row is never among them.
        SELECT m.part, e.seq, e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms,
               e.deliver_at_ms, n.ord, COALESCE(h.hold, false) AS hold
        FROM unnest(v_new_parts, v_new_lasts) AS m(part, hi)
        JOIN unnest(v_cursor_parts, v_cursors) AS k(part, cur) ON k.part = m.part
        CROSS JOIN LATERAL (
            SELECT e.seq, e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms,
                   e.deliver_at_ms
            FROM {s}.events e
            WHERE e.stream_id = p_stream AND e.part = m.part AND e.seq BETWEEN k.cur + 1 AND m.hi
            OFFSET 0) e
        LEFT JOIN unnest(v_chosen_parts, v_chosen_seqs) WITH ORDINALITY AS n(part, seq, ord)
          ON n.part = m.part AND n.seq = e.seq
        LEFT JOIN unnest(v_scan_parts, v_scan_seqs, v_scan_holds) AS h(part, seq, hold)
          ON h.part = m.part AND h.seq = e.seq
    ), created AS (
        INSERT INTO {s}.deliveries
            (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms, key,
             available_at_ms)
        SELECT p_group, k.part, k.seq,
               CASE WHEN k.ord IS NULL THEN {s}.delivery_available()
                    ELSE {s}.delivery_leased() END,
               CASE WHEN k.ord IS NULL THEN 0 ELSE 1 END,  -- attempt
               (v_lease_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid,
               CASE WHEN k.ord IS NOT NULL THEN p_consumer END,
               CASE WHEN k.ord IS NULL THEN 0 ELSE v_now + p_lease_ms END,
               CASE WHEN k.key IS NULL THEN '-' || k.seq ELSE 'k' || k.key END,
               -- a scheduled event (never held) is available at its time
               CASE WHEN k.ord IS NOT NULL THEN 0 WHEN k.hold THEN {s}.held()
                    ELSE COALESCE(k.deliver_at_ms, 0) END
        FROM picked k
    ), moved AS (
        -- "part = ANY": the cursors moved are probed by key, never the group's
        -- every cursor scanned to be joined.
        UPDATE {s}.cursors cu SET cursor = m.hi
        FROM unnest(v_new_parts, v_new_lasts) AS m(part, hi)
        WHERE cu.group_id = p_group AND cu.part = ANY (v_new_parts) AND cu.part = m.part
    )
    SELECT l.part, l.seq, l.attempt, l.lease_id, v_now + p_lease_ms,
           l.event_id, l.type, l.key, l.data::text, l.headers::text, l.appended_at_ms
    FROM (SELECT r.part, r.seq, r.attempt, r.lease_id, e.event_id, e.type, e.key, e.data,
                 e.headers, e.appended_at_ms, o.ord
          FROM releases r
          JOIN unnest(v_chosen_parts, v_chosen_seqs) WITH ORDINALITY AS o(part, seq, ord)
            ON o.part = r.part AND o.seq = r.seq
          CROSS JOIN LATERAL (
              SELECT e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
              FROM {s}.events e
              WHERE e.stream_id = p_stream AND e.part = r.part AND e.seq = r.seq
              OFFSET 0) e
          UNION ALL
          SELECT k.part, k.seq, 1, (v_lease_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid,
                 k.event_id, k.type, k.key, k.data, k.headers, k.appended_at_ms, k.ord
          FROM picked k WHERE k.ord IS NOT NULL) l
    ORDER BY l.ord;
END
$fn$;
