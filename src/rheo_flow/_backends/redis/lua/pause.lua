-- pause: store (or clear) the end of a group's pause in one hash: the stream's pauses
--   hash (field: the group's name) or a group partition's hash (field 'pz', which
--   fetch_partition reads: a paused group partition leases nothing).
-- KEYS: the hash.
-- ARGV: the field, the end of the pause in ms since the epoch ('0': not paused), then
--   '1' to write only when the hash exists (a group partition's: it holds the group).
-- Reply: 1, or 0 when nothing was written (the hash is missing).
local key, field, value = KEYS[1], ARGV[1], ARGV[2]
if ARGV[3] == '1' and redis.call('EXISTS', key) == 0 then return 0 end
if value == '0' then
  redis.call('HDEL', key, field)
else
  redis.call('HSET', key, field, value)
end
return 1
