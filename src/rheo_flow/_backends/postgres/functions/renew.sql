-- renew: a fenced new deadline for a batch of leases. Events held by range
-- leases are renewed first (functions/settle_ranged.sql). It locks the leased rows
-- as settle does (settle_leased, functions/settle.sql) and moves their deadline
-- by address; the elements it could not renew are explained by settle_misses.
--
-- Reply (one row): deadline_ms, the new deadline (ms since the epoch, database
-- clock) of every lease renewed; bad_idx, bad_code, bad_by as settle's
-- (functions/settle.sql), NULL when every lease was renewed.

CREATE OR REPLACE FUNCTION {s}.renew(p_groups integer[], p_parts integer[], p_seqs bigint[],
                                     p_leases uuid[], p_atts integer[], p_lease_ms bigint,
                                     OUT deadline_ms bigint,
                                     OUT bad_idx bigint[], OUT bad_code smallint[],
                                     OUT bad_by smallint[])
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off
AS $fn$
DECLARE
    v_renewed_tids tid[];
    v_done_idx bigint[];
    v_ranged_idx bigint[];
BEGIN
    deadline_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint + p_lease_ms;
    -- Events held by range leases first (functions/settle_ranged.sql; the lock
    -- order), then the delivery rows, if any element is left (not those a range
    -- just split off for this very renewal).
    SELECT r.o_idx INTO v_ranged_idx
    FROM {s}.settle_ranged({s}.op_renew(), p_groups, p_parts, p_seqs, p_leases, p_atts, NULL,
                           '', 0, NULL, deadline_ms - p_lease_ms, deadline_ms) r;
    IF COALESCE(cardinality(v_ranged_idx), 0) = cardinality(p_seqs) THEN
        RETURN;
    END IF;
    SELECT array_agg(l.o_tid), array_agg(l.o_idx) INTO v_renewed_tids, v_done_idx
    FROM {s}.settle_leased(p_groups, p_parts, p_seqs, p_leases, p_atts) l
    WHERE l.o_idx <> ALL (COALESCE(v_ranged_idx, '{}'::bigint[]));
    IF v_renewed_tids IS NOT NULL THEN
        UPDATE {s}.deliveries d SET deadline_ms = renew.deadline_ms
        WHERE d.ctid = ANY (v_renewed_tids);
    END IF;
    v_done_idx := v_ranged_idx || v_done_idx;
    IF COALESCE(cardinality(v_done_idx), 0) < cardinality(p_seqs) THEN
        SELECT * INTO bad_idx, bad_code, bad_by
        FROM {s}.settle_misses({s}.op_renew(), p_groups, p_parts, p_seqs, p_leases, p_atts,
                               v_done_idx);
    END IF;
END
$fn$;
