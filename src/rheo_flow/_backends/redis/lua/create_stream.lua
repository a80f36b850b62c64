-- KEYS: streams hash. ARGV: name, partitions. Returns "partitions|created_ms".
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then return cur end
cur = ARGV[2] .. '|' .. S(now_ms())
redis.call('HSET', KEYS[1], ARGV[1], cur)
return cur
