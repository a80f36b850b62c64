-- append_guarded: every append (statements.sql, append), on the backend's pool and in
-- the application's transaction (the outbox, _outbox.py), in ONE round trip: the
-- statement runs in a block with an exception handler, which PostgreSQL runs as a
-- subtransaction of its own, so that an event id stored already (appended before,
-- or by a racing append that committed first) fails that block alone: the
-- application's transaction goes on. (The outbox sent SAVEPOINT, the statement and
-- RELEASE before: three round trips.)
--
-- Reply: one row. o_duplicate false: the events were appended at o_appended_at_ms
-- with sequences o_seqs, in the order given. o_duplicate true: nothing was appended
-- (some id is stored already); the client looks the ids up and appends the others.

CREATE OR REPLACE FUNCTION {s}.append_guarded(p_stream integer, p_parts text, p_ids text,
                                              p_types text, p_keys text, p_data text,
                                              p_headers text[], p_channel text,
                                              p_stream_name text, p_deliver_at text,
                                              OUT o_appended_at_ms bigint,
                                              OUT o_seqs bigint[], OUT o_duplicate boolean)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_constraint text;
BEGIN
    o_duplicate := false;
    WITH r AS (
        SELECT * FROM ROWS FROM (unnest(p_parts::integer[]),
                                 json_array_elements_text(p_ids::json),
                                 json_array_elements_text(p_types::json),
                                 json_array_elements_text(p_keys::json),
                                 json_array_elements(p_data::json), unnest(p_headers),
                                 unnest(p_deliver_at::bigint[]))
            WITH ORDINALITY AS r(part, event_id, type, key, data, headers, deliver_at_ms, idx)
    ), t AS (
        SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms
    ), locked AS (
        SELECT p.part, p.high_water FROM {s}.partitions p
        WHERE p.stream_id = p_stream AND p.part IN (SELECT DISTINCT r.part FROM r)
        ORDER BY p.part
        FOR UPDATE
    ), numbered AS (
        SELECT r.idx, r.part, r.event_id, r.type, r.key, r.data, r.headers, r.deliver_at_ms,
               l.high_water + row_number() OVER (PARTITION BY r.part ORDER BY r.idx) AS seq
        FROM r JOIN locked l ON l.part = r.part
    ), inserted AS (
        INSERT INTO {s}.events (stream_id, part, seq, appended_at_ms, event_id, type, key,
                                data, headers, deliver_at_ms)
        SELECT p_stream, n.part, n.seq, t.ms, n.event_id, n.type, n.key, n.data,
               n.headers::json, n.deliver_at_ms
        FROM numbered n CROSS JOIN t
    ), moved AS (
        UPDATE {s}.partitions p SET high_water = m.top
        FROM (SELECT n.part, max(n.seq) AS top FROM numbered n GROUP BY n.part) m
        WHERE p.stream_id = p_stream AND p.part = m.part
    )
    SELECT (SELECT t.ms FROM t), (SELECT array_agg(n.seq ORDER BY n.idx) FROM numbered n),
           (SELECT pg_notify(p_channel, p_stream_name))
    INTO o_appended_at_ms, o_seqs;
EXCEPTION WHEN unique_violation THEN
    GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
    IF v_constraint IS DISTINCT FROM 'events_event_id' THEN
        RAISE;
    END IF;
    o_appended_at_ms := NULL;
    o_seqs := NULL;
    o_duplicate := true;
END
$fn$;

-- append_one: the append of ONE event (the common append, and the outbox's), without a
-- subtransaction: the partition row is locked and its high water moved by one UPDATE,
-- the event inserted with ON CONFLICT DO NOTHING on its id (a racing append of the
-- same id is waited for; once committed, it wins). A stored id moves the high water
-- back in the same transaction, under the same lock, and answers o_duplicate: nothing
-- was appended, no sequence consumed, no notification sent, and the application's
-- transaction goes on. A subtransaction per append would also count against the 64
-- that PostgreSQL caches per transaction: an application transaction appending more
-- events than that one by one would slow every session's snapshots.
--
-- Reply: one row. o_duplicate false: the event was appended at o_appended_at_ms with
-- sequence o_seq (both NULL: the stream was deleted meanwhile). o_duplicate true:
-- nothing was appended (its id is stored already).

CREATE OR REPLACE FUNCTION {s}.append_one(p_stream integer, p_part integer, p_id text,
                                          p_type text, p_key text, p_data text,
                                          p_headers text, p_channel text, p_payload text,
                                          p_deliver_at bigint,
                                          OUT o_appended_at_ms bigint, OUT o_seq bigint,
                                          OUT o_duplicate boolean)
LANGUAGE plpgsql
AS $fn$
BEGIN
    o_appended_at_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    UPDATE {s}.partitions SET high_water = high_water + 1
    WHERE stream_id = p_stream AND part = p_part
    RETURNING high_water INTO o_seq;
    o_duplicate := false;
    IF o_seq IS NULL THEN  -- the stream was deleted meanwhile
        o_appended_at_ms := NULL;
        RETURN;
    END IF;
    INSERT INTO {s}.events (stream_id, part, seq, appended_at_ms, event_id, type, key, data,
                            headers, deliver_at_ms)
    VALUES (p_stream, p_part, o_seq, o_appended_at_ms, p_id, p_type, p_key, p_data::json,
            p_headers::json, p_deliver_at)
    ON CONFLICT (stream_id, event_id) DO NOTHING;
    IF NOT FOUND THEN
        UPDATE {s}.partitions SET high_water = high_water - 1
        WHERE stream_id = p_stream AND part = p_part;
        o_appended_at_ms := NULL;
        o_seq := NULL;
        o_duplicate := true;
        RETURN;
    END IF;
    PERFORM pg_notify(p_channel, p_payload);
END
$fn$;
