-- KEYS: x, m, G. ARGV: group, start, max_attempts, ordering (key|none: at creation only).
-- Idempotent.
local stream_key, meta_key, group_key = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', group_key) == 1 then
  redis.call('HSET', group_key, 'ma', ARGV[3])
  return 0
end
local meta = redis.call('HMGET', meta_key, 'hw', 'lw')
local high_water, low_water = tonumber(meta[1] or '0'), tonumber(meta[2] or '1')
local pos = resolve_start(ARGV[2], high_water, low_water)
local ok = redis.pcall('XGROUP', 'CREATE', stream_key, ARGV[1], entry_id(pos), 'MKSTREAM')
if type(ok) == 'table' and ok.err then
  redis.call('XGROUP', 'SETID', stream_key, ARGV[1], entry_id(pos))
end
redis.call('HSET', group_key, 'f', int_text(pos), 'c', int_text(pos), 'ma', ARGV[3])
if ARGV[4] == 'key' then redis.call('HSET', group_key, 'o', 'k') end
return 1
