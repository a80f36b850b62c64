-- ack_fetch: a consumer's acks of its last batch and its fetch of the next in
-- ONE round trip and one durable commit: settle (functions/settle.sql, as an
-- ack) then fetch (functions/fetch.sql), in one transaction. Every row is a
-- lease of the fetch, carrying the ack's failures (bad_*, as settle reports
-- them; NULL: every ack took effect); a fetch that found nothing answers one
-- row with only those.
--
-- Reply: fetch's columns (functions/fetch.sql; all NULL in that one row), then
-- settle's bad_idx, bad_code, bad_by (functions/settle.sql).

CREATE OR REPLACE FUNCTION {s}.ack_fetch(p_groups integer[], p_parts integer[], p_seqs bigint[],
                                         p_leases uuid[], p_atts integer[], p_group integer,
                                         p_fetch_parts integer[], p_limit integer,
                                         p_lease_ms bigint, p_consumer text)
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
    IF cardinality(p_seqs) > 0 THEN
        SELECT s.bad_idx, s.bad_code, s.bad_by INTO v_bad_idx, v_bad_code, v_bad_by
        FROM {s}.settle({s}.op_ack(), p_groups, p_parts, p_seqs, p_leases, p_atts, '', 0) s;
        PERFORM set_config('rheo_flow.holding_locks', 'on', true);
    END IF;
    RETURN QUERY
    SELECT f.*, v_bad_idx, v_bad_code, v_bad_by
    FROM {s}.fetch(p_group, p_fetch_parts, p_limit, p_lease_ms, p_consumer) f;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::integer, NULL::bigint, NULL::integer, NULL::uuid, NULL::bigint,
                            NULL::text, NULL::text, NULL::text, NULL::text, NULL::text,
                            NULL::bigint, v_bad_idx, v_bad_code, v_bad_by;
    END IF;
END
$fn$;

-- holding_locks: whether this transaction settled before fetching (ack_fetch,
-- ack_ranges_fetch), holding range, delivery and frontier locks: its fetch then
-- waits for a cursor only briefly (claim_cursors), since the fetch holding that
-- cursor may wait for one of those frontiers (expire_spent), and the lock order
-- of _migrations.py puts cursors first. set_config(..., true) lasts until the
-- transaction ends.

CREATE OR REPLACE FUNCTION {s}.holding_locks() RETURNS boolean
LANGUAGE sql STABLE
AS $fn$
    SELECT COALESCE(current_setting('rheo_flow.holding_locks', true), '') = 'on'
$fn$;
