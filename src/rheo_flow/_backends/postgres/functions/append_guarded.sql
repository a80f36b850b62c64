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
