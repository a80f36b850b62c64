-- KEYS: the group partition's x, m, G, D, Z, R, B, Y, K, N. ARGV: group, position spec.
local x, m, G, D, Z, R, B, Y, K, N = unpack(KEYS, 1, 10)
local group = ARGV[1]
if redis.call('EXISTS', G) == 0 then return 'NOGROUP' end
local mm = redis.call('HMGET', m, 'hw', 'lw')
local pos = resolve(ARGV[2], tonumber(mm[1] or '0'), tonumber(mm[2] or '1'))
redis.call('DEL', D, Z, R, B, Y, K, N)
-- Recreating the consumer group drops its pending entries and consumers.
redis.pcall('XGROUP', 'DESTROY', x, group)
redis.call('XGROUP', 'CREATE', x, group, eid(pos), 'MKSTREAM')
redis.call('HSET', G, 'f', S(pos), 'c', S(pos))
return 'OK'
