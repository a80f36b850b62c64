-- init_group: create a group in one partition (idempotent; a later call only sets
-- max_attempts).
-- KEYS: stream_key (x), meta_key (m), group_key (G) of the group partition.
-- ARGV: group, start spec ('earliest', 'latest' or a sequence), max_attempts, ordering
--   ('key' or 'none': at creation only).
-- Reply: 1 when this call created it, else 0.
local stream_key, meta_key, group_key = KEYS[1], KEYS[2], KEYS[3]
local group, start, max_attempts, ordering = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('EXISTS', group_key) == 1 then
  redis.call('HSET', group_key, 'ma', max_attempts)
  return 0
end
local high_water_text, low_water_text = unpack(redis.call('HMGET', meta_key, 'hw', 'lw'))
local pos = resolve_start(start, tonumber(high_water_text or '0'), tonumber(low_water_text or '1'))
local ok = redis.pcall('XGROUP', 'CREATE', stream_key, group, entry_id(pos), 'MKSTREAM')
if type(ok) == 'table' and ok.err then
  redis.call('XGROUP', 'SETID', stream_key, group, entry_id(pos))
end
redis.call('HSET', group_key, 'f', int_text(pos), 'c', int_text(pos), 'ma', max_attempts)
if ordering == 'key' then redis.call('HSET', group_key, 'o', 'k') end
return 1
