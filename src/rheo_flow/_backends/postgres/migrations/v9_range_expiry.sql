-- Migration 9: the open ranges by deadline, so that a fetch finds the expired
-- ones (to lease again) with one probe per partition, however many ranges are in
-- flight (ranges_open is by sequence: a scan of every open range).

CREATE INDEX ranges_expiry ON {s}.ranges (group_id, part, deadline_ms) WHERE pending > 0;
