-- KEYS: x, m, G. ARGV: group, start, max_attempts, ordering (key|none: at creation only).
-- Idempotent.
local x, m, G = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', G) == 1 then
  redis.call('HSET', G, 'ma', ARGV[3])
  return 0
end
local mm = redis.call('HMGET', m, 'hw', 'lw')
local hw, lw = tonumber(mm[1] or '0'), tonumber(mm[2] or '1')
local pos = resolve(ARGV[2], hw, lw)
local ok = redis.pcall('XGROUP', 'CREATE', x, ARGV[1], eid(pos), 'MKSTREAM')
if type(ok) == 'table' and ok.err then
  redis.call('XGROUP', 'SETID', x, ARGV[1], eid(pos))
end
redis.call('HSET', G, 'f', S(pos), 'c', S(pos), 'ma', ARGV[3])
if ARGV[4] == 'key' then redis.call('HSET', G, 'o', 'k') end
return 1
