-- The named values of the schema's codes, as functions every other function and
-- statement calls instead of writing the number: `d.state = {s}.delivery_leased()`
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

-- deliveries.state (migrations/v1_tables.sql): available to lease (0), leased
-- (1), acked (2), rejected, a dead letter (3). Below acked is unsettled.

CREATE OR REPLACE FUNCTION {s}.delivery_available() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 0 $fn$;

CREATE OR REPLACE FUNCTION {s}.delivery_leased() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 1 $fn$;

CREATE OR REPLACE FUNCTION {s}.delivery_acked() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 2 $fn$;

CREATE OR REPLACE FUNCTION {s}.delivery_rejected() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 3 $fn$;

-- held: the available_at_ms of a held delivery of a key-ordered group (the
-- largest bigint: never due by the clock), stored behind an earlier unsettled
-- delivery of its key until release_keys makes it due (functions/fetch_keyed.sql;
-- deliveries_ready and deliveries_held, migrations/v7_ready_deliveries.sql).

CREATE OR REPLACE FUNCTION {s}.held() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 9223372036854775807 $fn$;

-- The settle operations (settle's and settle_ranged's p_op), which are also the
-- values of deliveries.settled_by, the operation that last settled the row:
-- renew (0, an operation only), ack (1), nack (2), reject (3).

CREATE OR REPLACE FUNCTION {s}.op_renew() RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 0::smallint $fn$;

CREATE OR REPLACE FUNCTION {s}.op_ack() RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 1::smallint $fn$;

CREATE OR REPLACE FUNCTION {s}.op_nack() RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 2::smallint $fn$;

CREATE OR REPLACE FUNCTION {s}.op_reject() RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 3::smallint $fn$;

-- groups.ordering (migrations/v5_key_ordering.sql): none (0), by key (1).

CREATE OR REPLACE FUNCTION {s}.ordering_none() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 0 $fn$;

CREATE OR REPLACE FUNCTION {s}.ordering_by_key() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$ SELECT 1 $fn$;
