-- Key-ordered groups (groups.ordering = ordering_by_key(); docs/ordering.md): the rule fetch
-- (functions/fetch.sql) follows for them; fetch_scan, its step that finds which
-- new events past the cursor may be leased; and release_keys, which settles and
-- trims call to make the next delivery of a released key due.
--
-- Rule: a delivery of key K in partition p is eligible only when no delivery of
-- K in p with a smaller sequence is unsettled (available or leased: state below
-- delivery_acked(), functions/states.sql).
-- Every delivery of such a group stores a key: 'k' || K for an event of key K,
-- '-' || seq for a keyless event (its own key, so it never waits; no 'k' key can
-- equal it). deliveries_keyed indexes the unsettled ones by (key, seq), so the
-- first unsettled delivery of each key, its *head*, is one descent away.
--
-- Held deliveries (schema version 7): an event stored behind an earlier
-- unsettled delivery of its key is stored available but *held*
-- (available_at_ms = held(), the largest bigint: never due by the clock), and the
-- statement that settles its key's last earlier delivery for good (ack,
-- reject, dead letter) or removes it (trim) makes it due (release_keys). So a
-- fetch finds what it may lease again in deliveries_due alone, by the time it
-- became due (schema version 10; deliveries_ready, by sequence, before), and
-- never visits the keys whose head is in flight. Every candidate is still
-- checked to head its key before it is leased: a delivery stored not held (by
-- an earlier version, or when fetch could not lock its key's last delivery,
-- below), a redriven dead letter and the events after it are in the index
-- whether or not they head their key.
--
-- A release must not miss a delivery being stored: fetch stores an event held
-- only after locking FOR SHARE the last unsettled delivery of its key (the one
-- whose settle releases it). A settle or trim of that delivery locks it too, so
-- it waits for the fetch to commit, and its release then sees the new row. If
-- the lock is taken (SKIP LOCKED: fetch never waits here), or that delivery was
-- settled meanwhile, the event is stored not held. Events after one this fetch
-- stores are held: nothing can settle it before the fetch commits.
--
-- Concurrency: only the holder of a partition's cursor row inserts its
-- deliveries, and they are inserted in sequence order, so an unsettled delivery
-- is never missed by a probe; one settled since the statement began may still
-- count as unsettled (the key then waits for the next fetch). Only a head can be
-- eligible, so two deliveries of one key are never leased at once (but for
-- redrive, docs/ordering.md).

-- fetch_scan: the new events past each locked cursor (k_part, k_cur, k_high:
-- partitions, cursors, high water; read as p_cursor_parts, p_cursors and
-- p_high_waters) that may be leased, with their depth (their place in the
-- partition's round-robin turn, after its candidates to lease again, whose
-- partitions are c_part, read as p_due_parts). The parameters keep the names of
-- the release that added the function (CREATE OR REPLACE cannot rename one).
-- A keyless event is free; a keyed one is free when its key has no unsettled
-- delivery (one probe of deliveries_keyed) and was not met earlier in this
-- scan, else it is blocked.
-- (Each round's probes see the settles committed since the last round, so a key
-- met blocked in an earlier round stays blocked: its event there is not stored
-- yet.)
-- Events are read (seq, key) in rounds, every partition short of the round's
-- depth in one statement: round-robin takes about p_limit / partitions from each,
-- so the first round asks that many of each and reads on only where blocked
-- keys or dry partitions leave the batch short, or leave a partition that can
-- read on below the depth the batch reaches (its free events would take turns
-- there). A partition stops at its high water or after v_budget events (the
-- cursor moves past what was read, so the next fetch goes on from there: a long
-- run of one key never stalls the others).
-- Reply: every event read, as arrays aligned with one another: f_part, f_seq;
-- f_depth (NULL: blocked); f_hold (true: a blocked one to be stored held); and
-- k_last, the last sequence read past each cursor (aligned with k_part).

CREATE OR REPLACE FUNCTION {s}.fetch_scan(p_group integer, p_stream integer, p_limit integer,
                                          k_part integer[], k_cur bigint[], k_high bigint[],
                                          c_part integer[],
                                          OUT f_part integer[], OUT f_seq bigint[],
                                          OUT f_depth bigint[], OUT f_hold boolean[],
                                          OUT k_last bigint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    p_cursor_parts ALIAS FOR k_part;
    p_cursors ALIAS FOR k_cur;
    p_high_waters ALIAS FOR k_high;
    p_due_parts ALIAS FOR c_part;
    v_budget CONSTANT integer := 4096;
    -- Per cursor: its turns taken (candidates to lease again, then free events
    -- read), the events read, whether it can read on.
    v_have bigint[];
    v_read integer[];
    v_open boolean[];
    v_other_have bigint[];  -- the turns of partitions with candidates but no cursor
    v_met_part integer[] := '{}';
    v_met_key text[] := '{}';
    v_depth bigint;
    v_level bigint;
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    f_part := '{}';
    f_seq := '{}';
    f_depth := '{}';
    f_hold := '{}';
    k_last := p_cursors;
    SELECT array_agg(COALESCE(n.have, 0) ORDER BY k.i), array_agg(0 ORDER BY k.i),
           array_agg(true ORDER BY k.i)
    INTO v_have, v_read, v_open
    FROM unnest(p_cursor_parts) WITH ORDINALITY AS k(part, i)
    LEFT JOIN (SELECT x.part, count(*) AS have FROM unnest(p_due_parts) AS x(part)
               GROUP BY x.part) n ON n.part = k.part;
    -- Partitions with candidates but no cursor of ours: their turns count too.
    SELECT COALESCE(array_agg(n.have), '{}') INTO v_other_have
    FROM (SELECT count(*) AS have FROM unnest(p_due_parts) AS x(part)
          WHERE x.part <> ALL (p_cursor_parts) GROUP BY x.part) n;
    v_depth := ceil(p_limit::numeric / (cardinality(p_cursor_parts) + cardinality(v_other_have)));
    LOOP
        WITH k AS (
            SELECT k.i, k.part, k.last, k.high, k.have, k.read,
                   LEAST(GREATEST(v_depth - k.have, k.read), v_budget - k.read) AS need
            FROM unnest(p_cursor_parts, k_last, p_high_waters, v_have, v_read, v_open)
                 WITH ORDINALITY AS k(part, last, high, have, read, open, i)
            WHERE k.open AND k.have < v_depth
        ), ev AS (
            SELECT k.i, e.seq, e.key, COALESCE(e.deliver_at_ms > v_now, false) AS sched,
                   e.key IS NOT NULL
                   AND row_number() OVER (PARTITION BY k.i, e.key ORDER BY e.seq) = 1
                   AND (k.part, e.key) NOT IN (SELECT * FROM unnest(v_met_part, v_met_key))
                       AS met,
                   CASE WHEN e.key IS NULL THEN NULL
                        WHEN row_number() OVER (PARTITION BY k.i, e.key ORDER BY e.seq) > 1
                            THEN 0
                        WHEN (k.part, e.key) IN (SELECT * FROM unnest(v_met_part, v_met_key))
                            THEN 0
                        ELSE COALESCE((
                            SELECT b.seq FROM {s}.deliveries b
                            WHERE b.group_id = p_group AND b.part = k.part
                              AND b.key = ('k' || e.key) COLLATE "C" AND b.key IS NOT NULL
                              AND b.state < {s}.delivery_acked()
                            ORDER BY b.key DESC, b.seq DESC LIMIT 1), -1) END AS behind
            FROM k CROSS JOIN LATERAL (
                SELECT e.seq, e.key, e.deliver_at_ms FROM {s}.events e
                WHERE e.stream_id = p_stream AND e.part = k.part AND e.seq > k.last
                  AND e.seq <= k.high
                ORDER BY e.seq LIMIT k.need) e
        ), dep AS (
            -- behind: NULL for a keyless event, -1 for a free key, 0 behind an
            -- event of this fetch, else the last unsettled delivery of the key.
            -- A scheduled event not due (sched) is never free, and never held: it
            -- is stored available at its time, and holds its key meanwhile.
            SELECT ev.i, ev.seq, ev.key, ev.met, ev.behind,
                   CASE WHEN (ev.behind IS NULL OR ev.behind < 0) AND NOT ev.sched
                        THEN k.have + count(*) FILTER (WHERE (ev.behind IS NULL OR ev.behind < 0)
                                                       AND NOT ev.sched)
                             OVER (PARTITION BY ev.i ORDER BY ev.seq) END AS depth,
                   CASE WHEN ev.sched OR ev.behind IS NULL OR ev.behind < 0 THEN false
                        WHEN ev.behind = 0 THEN true
                        ELSE (SELECT b.seq FROM {s}.deliveries b
                              WHERE b.group_id = p_group AND b.part = k.part
                                AND b.key = ('k' || ev.key) COLLATE "C" AND b.key IS NOT NULL
                                AND b.state < {s}.delivery_acked()
                              ORDER BY b.key DESC, b.seq DESC LIMIT 1
                              FOR SHARE OF b SKIP LOCKED) IS NOT DISTINCT FROM ev.behind END
                       AS hold
            FROM ev JOIN k ON k.i = ev.i
        ), per AS (
            SELECT k.i, k.need, count(dep.seq) AS got, max(dep.seq) AS last,
                   count(dep.depth) AS free
            FROM k LEFT JOIN dep ON dep.i = k.i GROUP BY k.i, k.need
        ), upd AS (
            SELECT k.i, k.high, COALESCE(p.last, k.last) AS last,
                   k.have + COALESCE(p.free, 0) AS have,
                   k.read + COALESCE(p.got, 0) AS read,
                   CASE WHEN p.i IS NULL THEN k.open
                        ELSE p.got = p.need AND COALESCE(p.last, k.last) < k.high
                             AND k.read + p.got < v_budget END AS open
            FROM unnest(k_last, p_high_waters, v_have, v_read, v_open)
                 WITH ORDINALITY AS k(last, high, have, read, open, i)
            LEFT JOIN per p ON p.i = k.i
        )
        SELECT f_part || (SELECT COALESCE(array_agg(p_cursor_parts[d.i] ORDER BY d.i, d.seq),
                                          '{}') FROM dep d),
               f_seq || (SELECT COALESCE(array_agg(d.seq ORDER BY d.i, d.seq), '{}') FROM dep d),
               f_depth || (SELECT COALESCE(array_agg(d.depth ORDER BY d.i, d.seq), '{}')
                           FROM dep d),
               f_hold || (SELECT COALESCE(array_agg(d.hold ORDER BY d.i, d.seq), '{}')
                          FROM dep d),
               v_met_part || (SELECT COALESCE(array_agg(p_cursor_parts[d.i] ORDER BY d.i, d.seq),
                                              '{}')
                              FROM dep d WHERE d.met),
               v_met_key || (SELECT COALESCE(array_agg(d.key ORDER BY d.i, d.seq), '{}')
                             FROM dep d WHERE d.met),
               (SELECT array_agg(u.last ORDER BY u.i) FROM upd u),
               (SELECT array_agg(u.have ORDER BY u.i) FROM upd u),
               (SELECT array_agg(u.read ORDER BY u.i) FROM upd u),
               (SELECT array_agg(u.open ORDER BY u.i) FROM upd u)
        INTO f_part, f_seq, f_depth, f_hold, v_met_part, v_met_key, k_last, v_have, v_read,
             v_open;

        -- The depth the batch reaches with what was found: the smallest d with
        -- sum(LEAST(have, d)) >= p_limit (NULL: short of p_limit at any depth).
        -- Done when no partition that can read on is below it: its free events
        -- up to that depth would take turns another partition's events now take.
        SELECT ceil((p_limit - h.below)::numeric / (h.n - h.j + 1)) INTO v_level
        FROM (SELECT x.have, row_number() OVER w AS j, count(*) OVER () AS n,
                     COALESCE(sum(x.have) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING
                                                  AND 1 PRECEDING), 0) AS below
              FROM unnest(v_have || v_other_have) AS x(have) WINDOW w AS (ORDER BY x.have)) h
        WHERE h.below + (h.n - h.j + 1) * h.have >= p_limit
        ORDER BY h.j LIMIT 1;
        EXIT WHEN NOT EXISTS (SELECT FROM unnest(v_have, v_open) AS h(have, open)
                              WHERE h.open AND (v_level IS NULL OR h.have < v_level));
        IF v_level IS NOT NULL THEN
            v_depth := v_level;
            CONTINUE;
        END IF;
        -- Short of p_limit turns at any depth, and some partition can read on:
        -- deepen by the shortfall spread over the partitions that can give more.
        SELECT GREATEST(v_depth + ceil((p_limit - sum(LEAST(h.have, v_depth)))::numeric
                                       / GREATEST(1, count(*) FILTER (WHERE h.open
                                                                      OR h.have > v_depth))),
                        min(h.have) FILTER (WHERE h.open) + 1)
        INTO v_depth
        FROM unnest(v_have || v_other_have, v_open) AS h(have, open);
    END LOOP;
END
$fn$;

-- release_keys: after deliveries of key-ordered groups were settled for good or
-- removed (p_groups, p_parts, p_keys: theirs; NULL keys, an unordered group's,
-- are passed over), make each key's head due if it is held: its first held
-- delivery (deliveries_held) when that is its first unsettled one
-- (deliveries_keyed). The heads are locked in primary key order, as every
-- statement locks deliveries; a
-- fetch storing a held event behind a settled delivery locked it FOR SHARE
-- first, so the settle waited and this statement sees that event.

CREATE OR REPLACE FUNCTION {s}.release_keys(p_groups integer[], p_parts integer[],
                                            p_keys text[], p_now bigint)
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
BEGIN
    UPDATE {s}.deliveries d SET available_at_ms = p_now
    WHERE d.ctid = ANY (ARRAY(
        SELECT x.tid
        FROM (SELECT u.g, u.part, h.seq
              FROM (SELECT DISTINCT u.g, u.part, u.key COLLATE "C" AS key
                    FROM unnest(p_groups, p_parts, p_keys) AS u(g, part, key)
                    WHERE u.key IS NOT NULL) u
              CROSS JOIN LATERAL (
                  SELECT w.seq FROM {s}.deliveries w
                  WHERE w.group_id = u.g AND w.part = u.part AND w.key = u.key
                    AND w.state = {s}.delivery_available() AND w.available_at_ms = {s}.held()
                  ORDER BY w.key, w.seq LIMIT 1) w
              CROSS JOIN LATERAL (
                  SELECT b.seq FROM {s}.deliveries b
                  WHERE b.group_id = u.g AND b.part = u.part AND b.key = u.key
                    AND b.key IS NOT NULL AND b.state < {s}.delivery_acked()
                  ORDER BY b.key, b.seq LIMIT 1) h
              WHERE h.seq = w.seq
              ORDER BY u.g, u.part, h.seq OFFSET 0) h
        CROSS JOIN LATERAL (
            SELECT d.ctid AS tid FROM {s}.deliveries d
            -- "state + 0": with a plain "state = ...", deliveries_held's predicate
            -- would hold and the planner could walk its (key, seq) order for the
            -- sequence.
            WHERE d.group_id = h.g AND d.part = h.part AND d.seq = h.seq
              AND d.state + 0 = {s}.delivery_available() AND d.available_at_ms = {s}.held()
            FOR UPDATE OF d) x));
END
$fn$;
