-- lag: what every group of one partition has left to consume (Backend.lag_report on a
--   Redis Cluster: one call per partition, on its slot; read only).
-- KEYS: the partition's stream_key (x), meta_key (m) and times_key (t: scheduled seqs by
--   deliver_at), then per group its group_key (G) and dead_key (:r).
-- ARGV: now (ms since the epoch, the report's reading of the server clock).
-- Reply: partition_lag's values (lag_partition.lua): the high water, then 4 per group.
local group_keys_list = {}
for key_at = 4, #KEYS, 2 do group_keys_list[#group_keys_list + 1] = {KEYS[key_at], KEYS[key_at + 1]} end
local out = {}
partition_lag(KEYS[1], KEYS[2], KEYS[3], group_keys_list, ARGV[1], out)
return out
