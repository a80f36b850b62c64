-- Migration 5: key-ordered groups (docs/ordering.md). Every existing group is
-- unordered (ordering 0; 1 is "key"). The deliveries of a key-ordered group
-- carry a key (see functions/fetch_keyed.sql; NULL in every other group, so
-- existing rows need no rewrite: the column has no default), compared bytewise
-- like event ids. The partial index holds only unsettled (available or leased)
-- keyed deliveries: whether an earlier delivery of a key is unsettled, and which
-- is the first, are index descents whatever the settled history. Building it
-- reads the deliveries table once (under the migration's lock).

ALTER TABLE {s}.groups ADD COLUMN ordering smallint NOT NULL DEFAULT 0
    CHECK (ordering BETWEEN 0 AND 1);

ALTER TABLE {s}.deliveries ADD COLUMN key text COLLATE "C";

CREATE INDEX deliveries_keyed ON {s}.deliveries (group_id, part, key, seq)
    WHERE state < 2 AND key IS NOT NULL;
