-- KEYS: streams hash. ARGV: name, partitions. Returns "partitions|created_ms".
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored then return stored end
stored = ARGV[2] .. '|' .. int_text(now_ms())
redis.call('HSET', KEYS[1], ARGV[1], stored)
return stored
