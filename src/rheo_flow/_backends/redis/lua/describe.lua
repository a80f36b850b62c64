-- describe: the waters of many partitions and the groups of many streams, in one call
--   (what `rheo-flow streams` lists; a Redis Cluster asks key by key instead).
-- KEYS: every partition's meta key, then every stream's groups key, then every stream's
--   pauses key (read alike).
-- ARGV: meta_count (how many of KEYS, from the first, are meta keys).
-- Reply: [waters, groups]: waters, per meta key [high water, low water] (nil when
--   unset); groups, per groups key its fields and values (name, group record, ...).
local meta_count = tonumber(ARGV[1])
local waters, groups = {}, {}
for k = 1, meta_count do
  waters[k] = redis.call('HMGET', KEYS[k], 'hw', 'lw')
end
for k = meta_count + 1, #KEYS do
  groups[k - meta_count] = redis.call('HGETALL', KEYS[k])
end
return {waters, groups}
