-- The named values of the schema's codes: functions every other function and
-- statement calls instead of writing the number, `d.state = {s}.delivery_leased()`
-- rather than `d.state = 1`.
--
-- Each is LANGUAGE sql, IMMUTABLE and takes no argument, so the planner
-- evaluates the call while it simplifies the query, before it checks which
-- partial indexes the query may use: `state = {s}.delivery_available()` reaches
-- that check as `state = 0` and proves deliveries_available's predicate, in a
-- generic plan too. A PL/pgSQL variable or CONSTANT would reach it as a
-- parameter, which proves no predicate, and the partial indexes would go unused.
-- The table definitions and index predicates (migrations/) keep the numbers:
-- they shipped with them. The values never change: rows store them.
--
-- deliveries.state (migrations/v1_tables.sql): delivery_available,
--   delivery_leased, delivery_acked, delivery_rejected (a dead letter); below
--   acked is unsettled.
-- held: the available_at_ms of a held delivery of a key-ordered group (the
--   largest bigint: never due by the clock), stored behind an earlier unsettled
--   delivery of its key until release_keys makes it due (functions/fetch_keyed.sql;
--   deliveries_held, migrations/v7_ready_deliveries.sql).
-- The settle operations (settle's and settle_ranged's p_op), which are also the
--   values of deliveries.settled_by, the operation that last settled the row:
--   op_renew (an operation only), op_ack, op_nack, op_reject.
-- groups.ordering (migrations/v5_key_ordering.sql): ordering_none, ordering_by_key.

DO $do$
DECLARE
    v_code record;
BEGIN
    FOR v_code IN
        SELECT * FROM (VALUES
            ('delivery_available', 'integer', '0'),
            ('delivery_leased', 'integer', '1'),
            ('delivery_acked', 'integer', '2'),
            ('delivery_rejected', 'integer', '3'),
            ('held', 'bigint', '9223372036854775807'),
            ('op_renew', 'smallint', '0'),
            ('op_ack', 'smallint', '1'),
            ('op_nack', 'smallint', '2'),
            ('op_reject', 'smallint', '3'),
            ('ordering_none', 'integer', '0'),
            ('ordering_by_key', 'integer', '1')) AS c(name, type, value)
    LOOP
        EXECUTE format('CREATE OR REPLACE FUNCTION {s}.%I() RETURNS %s '
                       'LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                       v_code.name, v_code.type,
                       'SELECT ' || v_code.value || '::' || v_code.type);
    END LOOP;
END
$do$;
