-- Migration 10: a fetch reads only the delivery rows it may lease again, and only
-- in the partitions that have work (functions/fetch_work.sql).
--
-- deliveries_due holds the available rows by the time they become due (then by
-- sequence), deliveries_expiry the leased rows by deadline: a fetch bounds its
-- scan by the time (available_at_ms <= now, deadline_ms <= now), so a backlog of
-- nacks delayed into the future, or of leases held for an hour, is passed over
-- in one descent instead of being read and filtered row by row. The first entry
-- of a partition says whether it has any row due, which is how a fetch finds
-- those partitions (one descent per partition with such rows, none for the
-- others). A key-ordered group's held deliveries wait in deliveries_due at
-- held(), never due by the clock, so its fetch reads its due heads there too.
--
-- They replace deliveries_available and deliveries_leased (by sequence, with
-- the time read and filtered row by row) and deliveries_ready (version 7: a
-- key-ordered group's available deliveries that are not held, by sequence),
-- which no statement reads any more. Building them reads the deliveries table
-- once (under the migration's lock); since version 8 it holds only the rows a
-- nack, reject, dead letter or partial renew split off a range, and the
-- deliveries of key-ordered groups.

CREATE INDEX deliveries_due ON {s}.deliveries (group_id, part, available_at_ms, seq)
    WHERE state = 0;

CREATE INDEX deliveries_expiry ON {s}.deliveries (group_id, part, deadline_ms, seq)
    WHERE state = 1;

DROP INDEX {s}.deliveries_available;

DROP INDEX {s}.deliveries_leased;

DROP INDEX {s}.deliveries_ready;
