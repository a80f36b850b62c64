-- KEYS: the group partition's x, m, G, D, Z, R, B, Y. ARGV: group, from_sequence.
local x, m, G, D, Z, R, B, Y = unpack(KEYS, 1, 8)
local group = ARGV[1]
local g = redis.call('HMGET', G, 'f', 'c')
if not g[1] then return 'NOGROUP' end
local f, c = tonumber(g[1]), tonumber(g[2])
local lw = tonumber(redis.call('HGET', m, 'lw') or '1')
-- Trimmed events are gone and count as settled: replay starts at the low water.
local start = math.max(tonumber(ARGV[2]), lw)
if start <= c then
  -- What stays of a block is behind the new frontier exactly when it was behind the old.
  clip(B, Y, 0, start - 1)
  drop_active(x, group, Z, start, math.huge)
  if start <= lw then
    redis.call('DEL', D)
  else
    hdel_range(D, start, c)
  end
  redis.call('ZREMRANGEBYSCORE', R, start, '+inf')
  c = start - 1
  redis.call('XGROUP', 'SETID', x, group, eid(c))
end
if f > start - 1 then f = start - 1 end
redis.call('HSET', G, 'f', S(f), 'c', S(c))
return 'OK'
