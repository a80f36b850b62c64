-- fetch: lease up to `quota` deliveries of one group partition.
-- KEYS: the group partition's keys (group_keys in common.lua), then on standalone Redis
--   the group's summaries (summary_keys, from KEYS[11]: the fetch writes its partition's).
-- ARGV: group, consumer, quota, lease_ms, lease id prefix, block token, then '1' on a
--   Cluster to have the head end with the partition's exact summary (earliest, fresh).
-- Reply: 'LOST' (the partition's presence marker is gone), 'NOGROUP', 'AGAIN' (this call
--   already ran: its answer was lost), or an array: the head, JSON
--   [high_water, still_due, deadline, redelivered, items, more, first, last, cursor
--   (, earliest, fresh)]
--   (FetchReply in _codec.py), then the data (JSON text) of each item:
--   items        [[seq, attempt, time, meta], ...]: the first `redelivered` have lease
--                ids prefix .. 1, 2, ..., the new deliveries after them
--                block_lease_id(block token, seq)
--   still_due    how many more deliveries are due now (redeliveries and new)
--   more         1 when a key-ordered group's scan stopped at its budget short of the
--                quota (call again: the events it passed over belonged to held keys)
--   first, last  an unordered group's new deliveries, leased by the block without being
--                read here (0, 0: none); the client reads them with XRANGE (a stream's
--                entries never change, so that read may run before or after this call)
--   cursor       where the group's cursor is now (-1 for a key-ordered group)
--   earliest     (with ARGV[7]) the earliest due delivery or block deadline, 0: none
--   fresh        (with ARGV[7]) 1 when events are past the group's cursor, else 0
local keys = group_keys(1, 3)
keys.summary = summary_keys(11)
keys.report = ARGV[7] == '1'
return fetch_partition(keys, ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5],
                       ARGV[6], false, nil)
